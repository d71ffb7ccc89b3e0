-- KEYS[3] session record. ARGV[8] tombstone TTL (ms).
local v = redis.call('HGET', KEYS[3], 'v') or ''
redis.call('HSET', KEYS[3], 'v', v, 'd', '1')
redis.call('PEXPIRE', KEYS[3], ARGV[8])
drop_all()
return 1
