-- KEYS[3] meta, KEYS[4] stream. ARGV[7] life, ARGV[8] kind, ARGV[9] owner,
-- ARGV[10] max streams per session, ARGV[11] pending error datas (LF-joined; JSON has no raw LF),
-- ARGV[12] the offset the stream starts after, ARGV[13] the creator's binding (keyed digests),
-- ARGV[14] the creator's credential digest ('' : may evict any finished stream).
-- -> 1 created, 0 limit reached
local life = ARGV[7]
if redis.call('EXISTS', KEYS[3]) == 1 then
  drop(life)
end
local live = {}
for _, l in ipairs(redis.call('LRANGE', INDEX, 0, -1)) do
  local m = redis.call('HMGET', META_PREFIX .. l, 'fin', 'creator')
  if not m[1] then
    redis.call('LREM', INDEX, 0, l)
  else
    table.insert(live, {l, m[1], m[2] or ''})
  end
end
local count, i = #live, 1
while count >= tonumber(ARGV[10]) do
  local victim = nil
  while i <= #live and not victim do
    if live[i][2] == '1' and (ARGV[14] == '' or live[i][3] == ARGV[14]) then
      victim = live[i][1]
    end
    i = i + 1
  end
  if not victim then
    return 0
  end
  drop(victim)
  count = count - 1
end
redis.call('HSET', KEYS[3], 'kind', ARGV[8], 'owner', ARGV[9], 'last', ARGV[12],
  'base', ARGV[12], 'fin', '0', 'pend', ARGV[11], 'auth', ARGV[13], 'creator', ARGV[14])
redis.call('PEXPIRE', KEYS[3], KEEP_MS)
redis.call('RPUSH', INDEX, life)
touch_session()
return 1
