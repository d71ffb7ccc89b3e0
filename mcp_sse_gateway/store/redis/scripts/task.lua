-- A task record (DESIGN D11). KEYS[3] the task's hash: version 'v', record 'r'.
-- ARGV[8] operation ('get' or 'put'); put: ARGV[9] the version the writer read (0: create),
-- ARGV[10] the record, ARGV[11] its TTL in ms (on creation; later writes keep it).
-- get -> {version, record} or false; put -> 1 written, 0 another write came first (or gone).
local task = KEYS[3]
if ARGV[8] == 'get' then
  local t = redis.call('HMGET', task, 'v', 'r')
  if not t[1] then
    return false
  end
  return {tonumber(t[1]), t[2]}
end
local current = redis.call('HGET', task, 'v')
local expected = tonumber(ARGV[9])
if expected == 0 then
  if current then
    return 0
  end
  redis.call('HSET', task, 'v', 1, 'r', ARGV[10])
  redis.call('PEXPIRE', task, tonumber(ARGV[11]))
  return 1
end
if not current or tonumber(current) ~= expected then
  return 0
end
redis.call('HSET', task, 'v', expected + 1, 'r', ARGV[10])
return 1
