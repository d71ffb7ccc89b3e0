-- KEYS[3] lease, KEYS[4] epoch counter. ARGV[8] operation ('acquire', 'renew', 'release'),
-- ARGV[9] holder, ARGV[10] epoch (renew, release), ARGV[11] TTL in ms (acquire, renew).
-- acquire -> the epoch held (new, or the holder's own, renewed), -1 when another holds it;
-- renew -> 1 renewed, 0 lost; release -> 1.
local lease, counter = KEYS[3], KEYS[4]
local op, holder, epoch = ARGV[8], ARGV[9], ARGV[10]
local current = redis.call('HMGET', lease, 'h', 'e')
if op == 'acquire' then
  if current[1] then
    if current[1] ~= holder then
      return -1
    end
    redis.call('PEXPIRE', lease, tonumber(ARGV[11]))
    return tonumber(current[2])
  end
  local new = redis.call('INCR', counter)
  -- The counter outlives every lease of the session (a new epoch is never a former one's).
  redis.call('PEXPIRE', counter, KEEP_MS)
  redis.call('HSET', lease, 'h', holder, 'e', new)
  redis.call('PEXPIRE', lease, tonumber(ARGV[11]))
  return new
end
local held = current[1] == holder and current[2] == epoch
if op == 'renew' then
  if not held then
    return 0
  end
  redis.call('PEXPIRE', lease, tonumber(ARGV[11]))
  extend(counter, KEEP_MS)
  return 1
end
if held then
  redis.call('DEL', lease)
end
return 1
