-- KEYS[3] meta, KEYS[4] stream. ARGV[8] life, ARGV[9] owner seen dead, ARGV[10] max events,
-- ARGV[11] finished-stream TTL (ms), ARGV[12] caller token, ARGV[13] use the stored pending
-- datas (1/0), ARGV[14..] error event datas (when not).
-- -> 1 if this caller ended it (also when asked again after a lost reply)
local m = redis.call('HMGET', KEYS[3], 'owner', 'fin', 'ended_by', 'pend')
if m[2] == '1' and m[3] == ARGV[12] then
  return 1
end
if not m[1] or m[2] == '1' or m[1] ~= ARGV[9] then
  return 0
end
local max_events = tonumber(ARGV[10])
if ARGV[13] == '1' then
  for data in string.gmatch(m[4] or '', '[^\n]+') do
    add_event(KEYS[3], KEYS[4], max_events, data, '0', '')
  end
else
  for i = 14, #ARGV do
    add_event(KEYS[3], KEYS[4], max_events, ARGV[i], '0', '')
  end
end
redis.call('HSET', KEYS[3], 'ended_by', ARGV[12])
finish(KEYS[3], KEYS[4], ARGV[8], tonumber(ARGV[11]))
return 1
