-- KEYS[3] meta. ARGV[8] life, ARGV[9] the reader's token.
-- -> 1 claimed (the stream's waiters are woken), 0 unknown stream
if redis.call('EXISTS', KEYS[3]) == 0 then
  return 0
end
redis.call('HSET', KEYS[3], 'rdr', ARGV[9])
wake(ARGV[8])
return 1
