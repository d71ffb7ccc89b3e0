-- Shared by every script of the Redis event store (loaded in front of each one).
--
-- Every script gets KEYS[1] = the session's list of lives, KEYS[2] = its "fresh" marker, and
-- ARGV[1..7] = meta prefix, stream prefix, open-stream TTL (ms), fresh-marker TTL (ms), wake
-- channel, wake message prefix, refresh TTLs ('1') or not ('0': this replica refreshed them
-- lately, see local_cache.py). Script-specific arguments start at ARGV[8]. Every key a script
-- touches belongs to one session (one hash tag, so one Redis Cluster slot).

local INDEX, FRESH = KEYS[1], KEYS[2]
local META_PREFIX, STREAM_PREFIX = ARGV[1], ARGV[2]
local KEEP_MS, FRESH_MS = tonumber(ARGV[3]), tonumber(ARGV[4])
local CHANNEL, WAKE_PREFIX = ARGV[5], ARGV[6]
local REFRESH = ARGV[7] == '1'

-- Set while a reader waits on the stream through the store (any replica): only then is a
-- wake-up published. A reader in the writer's own process follows its local feed instead.
local function watch_key(life)
  return META_PREFIX .. life .. ':watch'
end

local function wake(life)
  if redis.call('EXISTS', watch_key(life)) == 1 then
    redis.call('PUBLISH', CHANNEL, WAKE_PREFIX .. life)
  end
end

-- Raise a key's TTL to at least ms (never lower it; a missing key stays missing).
local function extend(key, ms)
  local pttl = redis.call('PTTL', key)
  if pttl == -1 or (pttl >= 0 and pttl < ms) then
    redis.call('PEXPIRE', key, ms)
  end
end

-- An event of more than SMALL_BYTES (data and type) is a big one. A request stream's big
-- events are listed by offset (score and member) in the sorted set `<meta>:big`, created with
-- the stream, with the member INDEXED whose score is the offset up to which the list is
-- complete: an append of this version moves it on, one of an older version (which lists
-- nothing) leaves it behind for good. A read then knows which events after its cursor are
-- small without looking at them (the store's replays.py, SMALL_EVENT_BYTES). Without the set
-- (an older creator, a standalone stream, expired or evicted first) nothing is known.
local SMALL_BYTES = 1024
local INDEXED = '~'

local function big_of(meta)
  return meta .. ':big'
end

-- Events were added at offsets previous + 1 .. last; `bigs` holds the big ones. The list goes
-- on only from where it was complete (else the set is left as it is: INDEXED stays behind),
-- its TTL is the stream's, and offsets trimmed from the stream (up to `trimmed_to`) leave it.
local function index_events(meta, stream, previous, last, bigs, trimmed_to)
  local big = big_of(meta)
  if tonumber(redis.call('ZSCORE', big, INDEXED) or '-1') ~= previous then
    return
  end
  for _, offset in ipairs(bigs) do
    redis.call('ZADD', big, offset, offset)
  end
  redis.call('ZADD', big, last, INDEXED)
  if trimmed_to > 0 then
    redis.call('ZREMRANGEBYSCORE', big, '-inf', trimmed_to)
  end
end

local function refresh_open(meta, stream)
  redis.call('PEXPIRE', meta, KEEP_MS)
  redis.call('PEXPIRE', stream, KEEP_MS)
  redis.call('PEXPIRE', big_of(meta), KEEP_MS)
end

-- The stream being used: refreshed unless this replica did so lately (REFRESH).
local function keep_open(meta, stream)
  if REFRESH then
    refresh_open(meta, stream)
  end
end

-- The session was used: keep its list, and (at most once per FRESH_MS, whatever REFRESH says)
-- every open stream of the session, so that one not in use does not expire while others are.
local function touch_session()
  if REFRESH then
    extend(INDEX, KEEP_MS)
  end
  if redis.call('EXISTS', FRESH) == 1 then
    return
  end
  extend(INDEX, KEEP_MS)
  local lives = redis.call('LRANGE', INDEX, 0, -1)
  if #lives == 0 then
    return
  end
  for _, life in ipairs(lives) do
    local meta = META_PREFIX .. life
    local fin = redis.call('HGET', meta, 'fin')
    if not fin then
      redis.call('LREM', INDEX, 0, life)
    elseif fin == '0' then
      refresh_open(meta, STREAM_PREFIX .. life)
    end
  end
  redis.call('SET', FRESH, '1', 'PX', FRESH_MS)
end

local function drop(life)
  local meta = META_PREFIX .. life
  local n = redis.call('DEL', meta, STREAM_PREFIX .. life, big_of(meta))
  redis.call('LREM', INDEX, 0, life)
  if n > 0 then
    wake(life)
  end
  redis.call('DEL', watch_key(life))
end

local function drop_all()
  for _, life in ipairs(redis.call('LRANGE', INDEX, 0, -1)) do
    drop(life)
  end
  redis.call('DEL', INDEX, FRESH)
end

local function add_event(meta, stream, max_events, data, has_event, event)
  local last = redis.call('HINCRBY', meta, 'last', 1)
  local id = string.format('0-%d', last)
  if has_event == '1' then
    redis.call('XADD', stream, 'MAXLEN', max_events, id, 'd', data, 'e', event)
  else
    redis.call('XADD', stream, 'MAXLEN', max_events, id, 'd', data)
  end
  if redis.call('PTTL', stream) == -1 then
    -- first event of an already finished stream: it expires with its metadata
    local ms = redis.call('PTTL', meta)
    if ms < 1 then ms = KEEP_MS end
    redis.call('PEXPIRE', stream, ms)
  end
  local bigs = {}
  if #data + #event > SMALL_BYTES then
    bigs[1] = last
  end
  index_events(meta, stream, last - 1, last, bigs, last - max_events)
  return last
end

-- A finished life moves to the end of the session's list: the list holds the finished lives in
-- the order they finished, which is the order they expire in (one TTL for all), so a walk from
-- the oldest meets those that expired before any finished life still kept (create_stream.lua).
local function finish(meta, stream, life, fin_ms)
  redis.call('HSET', meta, 'fin', '1')
  redis.call('PEXPIRE', meta, fin_ms)
  redis.call('PEXPIRE', stream, fin_ms)
  redis.call('PEXPIRE', big_of(meta), fin_ms)
  redis.call('LREM', INDEX, 0, life)
  redis.call('RPUSH', INDEX, life)
  extend(INDEX, fin_ms)
  wake(life)
end

-- The checks of a read after `after` (read.lua, read_head.lua), with their TTL refreshes:
-- the meta fields {last, fin, rdr} and the last offset, or nil and the error reply.
local function read_checks(meta, stream, after)
  local m = redis.call('HMGET', meta, 'last', 'fin', 'rdr')
  if not m[1] then
    return nil, {-1}
  end
  local last = tonumber(m[1])
  local first = last - redis.call('XLEN', stream) + 1
  if after + 1 < first or after > last then
    return nil, {-2}
  end
  if m[2] ~= '1' then
    keep_open(meta, stream)
  end
  touch_session()
  return m, last
end

-- The offset up to which every event after `after` is small and listed (`after` when none is
-- known to be): a read of those events needs no byte count.
local function small_until(meta, after, last)
  local big = big_of(meta)
  local indexed = tonumber(redis.call('ZSCORE', big, INDEXED) or '')
  if not indexed then
    return after
  end
  local known = math.min(last, indexed)
  -- The first big event after the cursor (INDEXED sorts after a big event of the same score).
  -- (%d: concatenating a number would write it with 14 significant digits, rounded.)
  local from = string.format('(%d', after)
  local first = redis.call('ZRANGEBYSCORE', big, from, '+inf', 'LIMIT', 0, 1)[1]
  if first and first ~= INDEXED then
    known = math.min(known, tonumber(first) - 1)
  end
  return math.max(known, after)
end
