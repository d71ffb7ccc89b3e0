-- KEYS[3] meta, KEYS[4] stream. ARGV[8] life, ARGV[9] how long the caller waits (ms).
-- -> {last, finished (1/0), newest reader} or nil. Marks the stream watched (see wake) before
-- looking, in the same script as the look: an append or a claim either came before (seen now)
-- or will publish.
local m = redis.call('HMGET', KEYS[3], 'last', 'fin', 'rdr')
if not m[1] then
  return false
end
redis.call('SET', watch_key(ARGV[8]), '1', 'PX', ARGV[9])
return {tonumber(m[1]), m[2] == '1' and 1 or 0, m[3] or ''}
