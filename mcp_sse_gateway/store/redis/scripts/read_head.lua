-- KEYS[3] meta, KEYS[4] stream. ARGV[8] after.
-- The checks of read.lua without its events: run in one transaction with the XRANGE of events
-- known to be small (replays.py).
-- -> {finished (1/0), last, newest reader, the offset up to which the events after `after` are
--    small}; {-1} unknown stream; {-2} cursor gone
local after = tonumber(ARGV[8])
local m, last = read_checks(KEYS[3], KEYS[4], after)
if not m then
  return last
end
return {m[2] == '1' and 1 or 0, last, m[3] or '', small_until(KEYS[3], after, last)}
