-- KEYS[3] meta, KEYS[4] stream. ARGV[8] life, ARGV[9] finished-stream TTL (ms). -> 1 if it
-- finished the stream now
local fin = redis.call('HGET', KEYS[3], 'fin')
if not fin or fin == '1' then
  return 0
end
finish(KEYS[3], KEYS[4], ARGV[8], tonumber(ARGV[9]))
touch_session()
return 1
