-- KEYS[3] meta, KEYS[4] stream. ARGV[8] after, ARGV[9] limit, ARGV[10] reply byte budget.
-- -> {finished (1/0), last, datas, event types as runs (index, '=' .. type or '' for none,
--    ...: from that index on, until the next run), newest reader, the offset up to which the
--    events after `after` are small (see small_until)};
--    {-1} unknown stream; {-2} cursor gone
local after, limit = tonumber(ARGV[8]), tonumber(ARGV[9])
local m, last = read_checks(KEYS[3], KEYS[4], after)
if not m then
  return last
end
-- At most `limit` entries, and no more bytes than the budget (but always one entry): a batch of
-- large events must not become one huge reply. Offsets are consecutive from after + 1, so the
-- reply holds the datas in order, and the event types apart, one entry per change of type
-- (upstreams commonly type every event `message`: one run; the per-entry work here is most of
-- a replay's cost in Redis).
local datas, types, n, size, budget = {}, {}, 0, 0, tonumber(ARGV[10])
local current, runs = false, 0 -- the type of the open run (false: none opened yet)
local from = string.format('(0-%d', after)
while n < limit and size < budget do
  local count = math.min(256, limit - n)
  local chunk = redis.call('XRANGE', KEYS[4], from, '+', 'COUNT', count)
  local taken = 0
  for i = 1, #chunk do
    local fields = chunk[i][2]
    local data, event = fields[2], fields[4]
    size = size + #data + (event and #event or 0)
    if n > 0 and size > budget then
      break
    end
    n = n + 1
    datas[n] = data
    if event ~= current then -- nil (untyped) differs from '' (typed, empty) and from false
      current = event
      types[runs + 1] = n
      types[runs + 2] = event and '=' .. event or ''
      runs = runs + 2
    end
    taken = i
  end
  if taken < count then
    break -- the end of the stream, or of the budget
  end
  from = '(' .. chunk[taken][1]
end
return {m[2] == '1' and 1 or 0, last, datas, types, m[3] or '',
  small_until(KEYS[3], after, last)}
