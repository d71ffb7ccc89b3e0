-- KEYS[3] meta, KEYS[4] stream. ARGV[7] life, ARGV[8] owner seen dead, ARGV[9] max events,
-- ARGV[10] finished-stream TTL (ms), ARGV[11] caller token, ARGV[12] use the stored pending
-- datas (1/0), ARGV[13..] error event datas (when not).
-- -> 1 if this caller ended it (also when asked again after a lost reply)
local m = redis.call('HMGET', KEYS[3], 'owner', 'fin', 'ended_by', 'pend')
if m[2] == '1' and m[3] == ARGV[11] then
  return 1
end
if not m[1] or m[2] == '1' or m[1] ~= ARGV[8] then
  return 0
end
local max_events = tonumber(ARGV[9])
if ARGV[12] == '1' then
  for data in string.gmatch(m[4] or '', '[^\n]+') do
    add_event(KEYS[3], KEYS[4], max_events, data, '0', '')
  end
else
  for i = 13, #ARGV do
    add_event(KEYS[3], KEYS[4], max_events, ARGV[i], '0', '')
  end
end
redis.call('HSET', KEYS[3], 'ended_by', ARGV[11])
finish(KEYS[3], KEYS[4], ARGV[7], tonumber(ARGV[10]))
return 1
