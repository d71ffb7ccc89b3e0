-- KEYS[3] meta, KEYS[4] stream. ARGV[8] life, ARGV[9] kind, ARGV[10] owner,
-- ARGV[11] max streams per session, ARGV[12] pending error datas (LF-joined; JSON has no raw LF),
-- ARGV[13] the offset the stream starts after, ARGV[14] the creator's binding (keyed digests),
-- ARGV[15] the creator's credential digest ('' : may evict any finished stream),
-- ARGV[16] the creating request's traceparent ('' without tracing).
-- -> 1 created, 0 limit reached
local life = ARGV[8]
if redis.call('EXISTS', KEYS[3]) == 1 then
  drop(life)
else
  -- Events of a life whose meta was lost (evicted, expired apart): a standalone life created
  -- again under the same id must not count them, nor the append's bound (it trims only past
  -- last - base). Nor its entry in the session's list: it is listed once, at the end.
  redis.call('DEL', KEYS[4], big_of(KEYS[3]))
  redis.call('LREM', INDEX, 0, life)
end
-- The list holds the session's lives: the open ones in the order they were created, each
-- finished one moved to the end as it finished (prelude's finish), and lives that expired
-- since (forgotten when found). At the bound it is walked from the oldest only as far as
-- needed: lives that expired are forgotten, finished ones evicted (only the creator's own,
-- when it is given) until the session is below the bound. Finished lives expire in the order
-- they finished, so the walk meets the expired ones before any finished life it would evict:
-- one meta looked at when the oldest life is finished or expired (the common case of a long
-- session), the whole list only when the older lives are still open.
local bound = tonumber(ARGV[11])
local count = redis.call('LLEN', INDEX)
if count >= bound then
  for _, l in ipairs(redis.call('LRANGE', INDEX, 0, -1)) do
    local m = redis.call('HMGET', META_PREFIX .. l, 'fin', 'creator')
    if not m[1] then
      redis.call('LREM', INDEX, 0, l)
    elseif m[1] == '1' and (ARGV[15] == '' or (m[2] or '') == ARGV[15]) then
      drop(l)
    end
    count = redis.call('LLEN', INDEX)
    if count < bound then
      break
    end
  end
  if count >= bound then
    return 0
  end
end
redis.call('HSET', KEYS[3], 'kind', ARGV[9], 'owner', ARGV[10], 'last', ARGV[13],
  'base', ARGV[13], 'fin', '0', 'pend', ARGV[12], 'auth', ARGV[14], 'creator', ARGV[15])
if ARGV[16] ~= '' then
  redis.call('HSET', KEYS[3], 'trace', ARGV[16])
end
redis.call('PEXPIRE', KEYS[3], KEEP_MS)
if ARGV[9] == 'request' then
  -- Its big events are listed from the start (a standalone life, created again under the same
  -- id, is read by the read script only).
  redis.call('ZADD', big_of(KEYS[3]), ARGV[13], INDEXED)
  redis.call('PEXPIRE', big_of(KEYS[3]), KEEP_MS)
end
redis.call('RPUSH', INDEX, life)
touch_session()
return 1
