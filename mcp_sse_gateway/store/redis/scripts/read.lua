-- KEYS[3] meta, KEYS[4] stream. ARGV[8] after, ARGV[9] limit, ARGV[10] reply byte budget.
-- -> {finished (1/0), last, flat events, newest reader}; {-1} unknown stream; {-2} cursor gone
local m = redis.call('HMGET', KEYS[3], 'last', 'fin', 'rdr')
if not m[1] then
  return {-1}
end
local last = tonumber(m[1])
local first = last - redis.call('XLEN', KEYS[4]) + 1
local after, limit = tonumber(ARGV[8]), tonumber(ARGV[9])
if after + 1 < first or after > last then
  return {-2}
end
if m[2] ~= '1' then
  keep_open(KEYS[3], KEYS[4])
end
touch_session()
-- At most `limit` entries, and no more bytes than the budget (but always one entry): a batch of
-- large events must not become one huge reply. Offsets are consecutive from after + 1, so the
-- reply is flat: data, then '' (no event type) or '=' and the type, per event.
local out, n, size, budget = {}, 0, 0, tonumber(ARGV[10])
local from = string.format('(0-%d', after)
while n < limit and size < budget do
  local chunk = redis.call('XRANGE', KEYS[4], from, '+', 'COUNT', math.min(256, limit - n))
  if #chunk == 0 then
    break
  end
  for _, entry in ipairs(chunk) do
    local fields = entry[2]
    size = size + #fields[2] + (fields[4] and #fields[4] or 0)
    if n > 0 and size > budget then
      break
    end
    n = n + 1
    out[2 * n - 1] = fields[2]
    out[2 * n] = fields[4] and ('=' .. fields[4]) or ''
    from = '(' .. entry[1]
  end
end
return {m[2] == '1' and 1 or 0, last, out, m[3] or ''}
