-- KEYS[3] meta, KEYS[4] stream, KEYS[5] the session's lease. ARGV[8] life, ARGV[9] max events,
-- ARGV[10] the writer's previous offset (-1: unknown), ARGV[11] token of this append (random;
-- the same when the call is repeated), ARGV[12] new pending error datas given (1/0), ARGV[13]
-- those datas (LF-joined), ARGV[14] the writer's lease holder ('' for an unfenced append),
-- ARGV[15] its epoch, ARGV[16] finish the stream after the events (1/0), ARGV[17] the finished
-- stream's TTL (ms), ARGV[18..] the events as pairs: data, '' (no event type) or '=' followed by
-- the event type.
-- -> {last offset, trimmed for the first time (1/0)}; {-1, 0} unknown stream; {-2, 0} events
-- lost; {-3, 0} the lease is no longer the writer's (fencing: nothing stored)
local meta, stream, life = KEYS[3], KEYS[4], ARGV[8]
if ARGV[14] ~= '' then
  local lease = redis.call('HMGET', KEYS[5], 'h', 'e')
  if lease[1] ~= ARGV[14] or lease[2] ~= ARGV[15] then
    return {-3, 0}
  end
end
local m = redis.call('HMGET', meta, 'last', 'fin', 'tok', 'base')
if not m[1] then
  return {-1, 0}
end
if m[3] == ARGV[11] then
  -- a repeat of the newest append, applied before its reply was lost: do not store it twice
  return {tonumber(m[1]), 0}
end
local expected = tonumber(ARGV[10])
if expected >= 0 and tonumber(m[1]) < expected then
  if m[2] ~= '1' then
    drop(life)
  end
  return {-2, 0}
end
local max_events = tonumber(ARGV[9])
-- One XADD per event; the offset, the trim and the TTL check once per append (add_event does
-- all three per event: fine for the one-event appends of other scripts).
local previous = tonumber(m[1])
local last, bigs = previous, {}
for i = 18, #ARGV, 2 do
  last = last + 1
  local data, event = ARGV[i], ARGV[i + 1]
  if event == '' then
    redis.call('XADD', stream, string.format('0-%d', last), 'd', data)
  else
    redis.call('XADD', stream, string.format('0-%d', last), 'd', data, 'e', string.sub(event, 2))
  end
  if #data + #event > SMALL_BYTES then
    bigs[#bigs + 1] = last
  end
end
-- The stream holds offsets base + 1 .. last at most: below the bound there is nothing to trim.
local stored = last - tonumber(m[4] or '0')
local cut = 0
if stored > max_events then
  cut = redis.call('XTRIM', stream, 'MAXLEN', max_events)
end
if redis.call('PTTL', stream) == -1 then
  -- first events of an already finished stream: they expire with its metadata
  local ms = redis.call('PTTL', meta)
  if ms < 1 then ms = KEEP_MS end
  redis.call('PEXPIRE', stream, ms)
end
redis.call('HSET', meta, 'last', last, 'tok', ARGV[11])
index_events(meta, stream, previous, last, bigs, cut > 0 and last - max_events or 0)
if ARGV[12] == '1' then
  redis.call('HSET', meta, 'pend', ARGV[13])
end
local trimmed = 0
if stored > max_events and redis.call('HSETNX', meta, 'trimmed', '1') == 1 then
  trimmed = 1
end
if m[2] == '1' then
  touch_session()
  wake(life)
elseif ARGV[16] == '1' then
  finish(meta, stream, life, tonumber(ARGV[17])) -- TTLs, the session's list, the wake-up
  touch_session()
else
  keep_open(meta, stream)
  touch_session()
  wake(life)
end
return {last, trimmed}
