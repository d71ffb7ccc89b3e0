-- KEYS[3] session record. ARGV[8] refresh (1/0), ARGV[9] idle TTL (ms). -> {v, d, a} or nil
local r = redis.call('HMGET', KEYS[3], 'v', 'd', 'a')
if not r[1] then
  return false
end
if ARGV[8] == '1' and r[2] ~= '1' then
  redis.call('PEXPIRE', KEYS[3], ARGV[9])
  touch_session()
end
return {r[1], r[2] or '0', r[3] or ''}
