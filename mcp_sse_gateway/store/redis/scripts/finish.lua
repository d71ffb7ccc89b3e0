-- KEYS[3] meta, KEYS[4] stream. ARGV[7] life, ARGV[8] finished-stream TTL (ms). -> 1 if it
-- finished the stream now
local fin = redis.call('HGET', KEYS[3], 'fin')
if not fin or fin == '1' then
  return 0
end
finish(KEYS[3], KEYS[4], ARGV[7], tonumber(ARGV[8]))
touch_session()
return 1
