-- KEYS[3] session record. ARGV[8] protocol version, ARGV[9] idle TTL (ms), ARGV[10] the
-- creator's binding (keyed digests).
redis.call('HSET', KEYS[3], 'v', ARGV[8], 'd', '0', 'a', ARGV[10])
redis.call('PEXPIRE', KEYS[3], ARGV[9])
touch_session()
return 1
