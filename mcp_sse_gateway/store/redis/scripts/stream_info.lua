-- KEYS[3] meta, KEYS[4] stream.
-- -> {kind, owner, last, finished (1/0), stored events, binding, traceparent} or nil
local m = redis.call('HMGET', KEYS[3], 'kind', 'owner', 'last', 'fin', 'auth', 'trace')
if not m[3] then
  return false
end
if m[4] ~= '1' then
  keep_open(KEYS[3], KEYS[4])
end
touch_session()
return {m[1], m[2], tonumber(m[3]), m[4] == '1' and 1 or 0, redis.call('XLEN', KEYS[4]),
  m[5] or '', m[6] or ''}
