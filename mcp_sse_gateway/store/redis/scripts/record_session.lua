-- KEYS[3] session record. ARGV[7] protocol version, ARGV[8] idle TTL (ms), ARGV[9] the
-- creator's binding (keyed digests).
redis.call('HSET', KEYS[3], 'v', ARGV[7], 'd', '0', 'a', ARGV[9])
redis.call('PEXPIRE', KEYS[3], ARGV[8])
touch_session()
return 1
