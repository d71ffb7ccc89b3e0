"""The Redis event store: the production backend, shared by every replica (DESIGN D7).

Data model (key names: :mod:`mcp_sse_gateway.store.keys`): one Redis stream per stream life with
explicit sequential entry ids ``0-<offset>``, a metadata hash next to it (kind, owner, last
offset, finished flag), a list of the session's lives, the session record, and one heartbeat key
per replica. Every write is one Lua script (EVALSHA, cached by redis-py), so it is atomic:
``append`` checks the stream exists, bumps the offset, adds the entry (``XADD``), trims to
``max_events_per_stream`` (exact ``MAXLEN``), refreshes TTLs and publishes a wake-up when a
reader waits on the stream through the store (a ``…:meta:<life>:watch`` key with a TTL).

Gaps are never silent: the oldest stored offset is derived from the stream itself
(``last - XLEN + 1``), so events that were trimmed, evicted or lost make a cursor before them
raise :class:`~mcp_sse_gateway.errors.CursorGone`; a stream life whose metadata is gone (Redis
restarted without persistence, TTL) raises :class:`~mcp_sse_gateway.errors.UnknownStream`. When
a writer finds its stream's offsets went backwards (a restore or failover lost acknowledged
events), the unfinished stream life is dropped, so its readers get ``UnknownStream`` instead of
reused offsets.

Connections are bounded: **at most 9 connections per process whatever the number of waiting
clients** (:data:`MAX_CONNECTIONS_PER_PROCESS`): a blocking pool of
:data:`COMMAND_CONNECTIONS` (8) for commands (bursts queue for a connection, up to
:data:`POOL_WAIT_S`) plus one Pub/Sub connection. Waiting readers hold no connection: one
subscriber task per store listens on the channel ``<prefix>:wake`` and fans wake-ups out to an
:class:`asyncio.Event` per (session, stream life) with local waiters. Every replica receives every
wake-up (about 50 bytes each); in exchange there is no per-stream ``SUBSCRIBE`` churn.

Every key has a TTL. Session records: ``session_idle_ttl_s`` (tombstones 300 s). An open stream's
keys and the session's list live ``session_idle_ttl_s`` to 1.1 times that after the session's last
use (any stream operation or ``get_session(refresh=True)``): the stream being used is refreshed on
every call, the other open streams of the session at most once per ``session_idle_ttl_s / 10``
(a ``fresh`` marker key). A finished stream lives ``finished_stream_ttl_s`` from its terminal
marker. Heartbeats: ``heartbeat_expiry_s``.

Redis Cluster (``store.redis_cluster = true``; ``redis_url`` names any one node, database 0, no
``unix://``): the keys of one session share the hash tag ``{<digest>}``, so every script runs on
the node of that slot; scripts also touch keys of the same session that they derive from the
prefixes passed in ``ARGV`` (same slot, which Redis Cluster allows; only other slots are refused).
The heartbeat key is in its own slot, so :meth:`RedisStore.end_orphaned` checks it with a separate
command before its compare-and-set script. Commands go through a cluster client
(:class:`~mcp_sse_gateway.store.cluster.BoundedRedisCluster`) that discovers the other nodes and
follows ``MOVED``/``ASK``; wake-ups are published with classic ``PUBLISH``, which the cluster
broadcasts to every node, so the subscriber holds one plain connection to one node: first the
URL's, the next known node after each failure
(:class:`~mcp_sse_gateway.store.cluster.ClusterSubscriber`).
Connections are bounded **per node: at most 9**
(:data:`MAX_CLUSTER_CONNECTIONS_PER_NODE`): :data:`CLUSTER_COMMAND_CONNECTIONS_PER_NODE` (8)
for commands (at most 8 commands are in flight across the cluster, bursts queue up to
:data:`POOL_WAIT_S`) plus the subscriber's one connection on the node it listens on; a process
opens at most ``8 * nodes + 1``. A cluster that is down, redirects without end or cannot be
discovered raises ``StoreUnavailable`` like an unreachable Redis; the topology is discovered again
after a connection error (redis-py repeats nothing itself, the store's one repeat applies).
Tested on a loopback cluster of three masters (``tests/store/test_redis_cluster.py``).

URLs: ``redis://[user:password@]host:port/db``, ``rediss://…`` (TLS; a private CA is given as
``?ssl_ca_certs=/path/ca.pem``, client certificates as ``ssl_certfile``/``ssl_keyfile``) or
``unix:///path/redis.sock``. The password is never logged (:func:`redact_url`). A
``max_connections`` in the URL is ignored: the bound above holds.

Outages: every public method raises :class:`~mcp_sse_gateway.errors.StoreUnavailable` (chained to
the redis-py error) when Redis cannot be reached, within the connect/command timeouts below, and
works again by itself once Redis is back. A call is repeated once, at once, only when its
connection turned out to be dead (redis-py finds a pooled connection dead only by using it, so
after a Redis restart each one fails once): idempotent calls are simply repeated; an ``append``
or :meth:`RedisStore.end_orphaned` carries a random token, so that its repeat recognises an
applied first attempt and never stores the events twice. The subscriber reconnects with bounded
exponential backoff and then wakes every local waiter to look again, so no wake-up is lost across
an outage.

Requires Redis ≥ 6.2 (``XRANGE`` exclusive ranges, ``SET … GET``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast
from urllib.parse import parse_qsl, urlencode, urlsplit

import structlog
from redis import exceptions as redis_errors
from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from mcp_sse_gateway.config import StoreSettings
from mcp_sse_gateway.errors import (
    CursorGone,
    StoreLimitExceeded,
    StoreUnavailable,
    UnknownStream,
)
from mcp_sse_gateway.store.base import (
    ReadResult,
    SessionRecord,
    StoredEvent,
    StreamInfo,
    StreamKind,
)
from mcp_sse_gateway.store.cluster import ClusterSubscriber, cluster_client
from mcp_sse_gateway.store.keys import (
    SessionKeys,
    heartbeat_key,
    parse_wake_message,
    wake_channel,
)

log = structlog.get_logger("mcp_sse_gateway.store")

T = TypeVar("T")

#: Command connections per process (a blocking pool: a burst queues instead of connecting more).
COMMAND_CONNECTIONS = 8
#: The Pub/Sub connection of the wake-up subscriber.
SUBSCRIBER_CONNECTIONS = 1
#: The most connections one store opens to Redis, whatever the number of waiting clients.
MAX_CONNECTIONS_PER_PROCESS = COMMAND_CONNECTIONS + SUBSCRIBER_CONNECTIONS
#: Redis Cluster: command connections per node (each node's pool), and the bound on commands in
#: flight across the cluster, so that a burst queues instead of exhausting a node's pool.
CLUSTER_COMMAND_CONNECTIONS_PER_NODE = COMMAND_CONNECTIONS
#: Redis Cluster: the most connections one store opens to any one node (its command connections,
#: and the subscriber's when it subscribes on that node), whatever the number of waiting clients.
MAX_CLUSTER_CONNECTIONS_PER_NODE = CLUSTER_COMMAND_CONNECTIONS_PER_NODE + SUBSCRIBER_CONNECTIONS
#: How long a command waits for a free pooled connection before StoreUnavailable, seconds.
POOL_WAIT_S = 5.0
#: TCP (and TLS) connect timeout, seconds: an unreachable Redis fails fast.
CONNECT_TIMEOUT_S = 2.0
#: Bound on one store call (waiting for a pooled connection, connecting, the commands and their
#: replies), seconds. Enforced by the store with :func:`asyncio.timeout`, not by redis-py's
#: ``socket_timeout``: on Python 3.11 the latter's write path (``asyncio.wait_for``) can swallow
#: a cancellation, and every method here must be safe to cancel.
COMMAND_TIMEOUT_S = 5.0
#: The subscriber sends PING after this much silence, seconds ...
SUBSCRIBER_PING_S = 5.0
#: ... and reconnects when nothing at all arrived for this long, seconds (half-open TCP).
SUBSCRIBER_DEAD_S = 15.0
#: The subscriber's read timeout, seconds (the period of its liveness checks).
SUBSCRIBER_POLL_S = 1.0
#: While the subscription is down, waiters look at their stream this often, seconds.
UNSUBSCRIBED_RECHECK_S = 1.0
#: Reconnection backoff of the subscriber: doubles from the first value up to the second, seconds.
SUBSCRIBER_BACKOFF_S = (0.05, 2.0)
#: Name of this store's connections in ``CLIENT LIST``.
CLIENT_NAME = "mcp-sse-gateway"
#: Tombstones only need to outlive a client's reconnection attempts (as in the memory store).
TOMBSTONE_TTL_S = 300.0
#: Bytes of event data one ``read`` returns at most (always at least one event, whatever its size).
READ_MAX_BYTES = 4 * 1024 * 1024
#: A waiter's mark on its stream (only watched streams publish wake-ups) outlives its wait by
#: this much, seconds.
WATCH_MARGIN_S = 1.0
#: Writers remember the last offset they appended per stream, to detect lost events; bounded.
MAX_TRACKED_STREAMS = 100_000

#: redis-py errors meaning "Redis cannot serve this now" (connection, timeout, failover,
#: loading, out of memory; in Redis Cluster also a cluster that is down or redirects without
#: end: ``ClusterError``, covering ``ClusterDownError`` and an exhausted ``MOVED``/``ASK`` chain),
#: mapped to StoreUnavailable. A failed topology discovery arrives as ``ConnectionError``
#: (:class:`~mcp_sse_gateway.store.cluster.BoundedRedisCluster`).
UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.ReadOnlyError,
    redis_errors.OutOfMemoryError,
    redis_errors.TryAgainError,
    redis_errors.ClusterDownError,
    redis_errors.ClusterError,
    OSError,
)

# Lua --------------------------------------------------------------------------------------------
# Every script gets KEYS[1] = the session's list of lives, KEYS[2] = its "fresh" marker, and
# ARGV[1..6] = meta prefix, stream prefix, open-stream TTL (ms), fresh-marker TTL (ms), wake
# channel, wake message prefix. Script-specific arguments start at ARGV[7].

_LUA_PRELUDE = """
local INDEX, FRESH = KEYS[1], KEYS[2]
local META_PREFIX, STREAM_PREFIX = ARGV[1], ARGV[2]
local KEEP_MS, FRESH_MS = tonumber(ARGV[3]), tonumber(ARGV[4])
local CHANNEL, WAKE_PREFIX = ARGV[5], ARGV[6]

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

local function keep_open(meta, stream)
  redis.call('PEXPIRE', meta, KEEP_MS)
  redis.call('PEXPIRE', stream, KEEP_MS)
end

-- The session was used: keep its list, and (at most once per FRESH_MS) every open stream.
local function touch_session()
  extend(INDEX, KEEP_MS)
  if redis.call('EXISTS', FRESH) == 1 then
    return
  end
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
      keep_open(meta, STREAM_PREFIX .. life)
    end
  end
  redis.call('SET', FRESH, '1', 'PX', FRESH_MS)
end

local function drop(life)
  local n = redis.call('DEL', META_PREFIX .. life, STREAM_PREFIX .. life)
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
  return last
end

local function finish(meta, stream, life, fin_ms)
  redis.call('HSET', meta, 'fin', '1')
  redis.call('PEXPIRE', meta, fin_ms)
  redis.call('PEXPIRE', stream, fin_ms)
  extend(INDEX, fin_ms)
  wake(life)
end
"""

# KEYS[3] session record. ARGV[7] protocol version, ARGV[8] idle TTL (ms), ARGV[9] the
# creator's binding (keyed digests).
_LUA_RECORD_SESSION = """
redis.call('HSET', KEYS[3], 'v', ARGV[7], 'd', '0', 'a', ARGV[9])
redis.call('PEXPIRE', KEYS[3], ARGV[8])
touch_session()
return 1
"""

# KEYS[3] session record. ARGV[7] refresh (1/0), ARGV[8] idle TTL (ms). -> {v, d, a} or nil
_LUA_GET_SESSION = """
local r = redis.call('HMGET', KEYS[3], 'v', 'd', 'a')
if not r[1] then
  return false
end
if ARGV[7] == '1' and r[2] ~= '1' then
  redis.call('PEXPIRE', KEYS[3], ARGV[8])
  touch_session()
end
return {r[1], r[2] or '0', r[3] or ''}
"""

# KEYS[3] session record. ARGV[7] tombstone TTL (ms).
_LUA_TOMBSTONE = """
local v = redis.call('HGET', KEYS[3], 'v') or ''
redis.call('HSET', KEYS[3], 'v', v, 'd', '1')
redis.call('PEXPIRE', KEYS[3], ARGV[7])
drop_all()
return 1
"""

_LUA_PURGE = """
drop_all()
return 1
"""

# ARGV[7] life.
_LUA_DROP = """
drop(ARGV[7])
return 1
"""

# KEYS[3] meta, KEYS[4] stream. ARGV[7] life, ARGV[8] kind, ARGV[9] owner,
# ARGV[10] max streams per session, ARGV[11] pending error datas (LF-joined; JSON has no raw LF),
# ARGV[12] the offset the stream starts after, ARGV[13] the creator's binding (keyed digests),
# ARGV[14] the creator's credential digest ('' : may evict any finished stream).
# -> 1 created, 0 limit reached
_LUA_CREATE = """
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
"""

# KEYS[3] meta, KEYS[4] stream. ARGV[7] life, ARGV[8] max events, ARGV[9] the writer's previous
# offset (-1: unknown), ARGV[10] token of this append (random; the same when the call is
# repeated), ARGV[11] new pending error datas given (1/0), ARGV[12] those datas (LF-joined),
# ARGV[13..] the events as pairs: data, '' (no event type) or '=' followed by the event type.
# -> {last offset, trimmed for the first time (1/0)}; {-1, 0} unknown stream; {-2, 0} events lost
_LUA_APPEND = """
local meta, stream, life = KEYS[3], KEYS[4], ARGV[7]
local m = redis.call('HMGET', meta, 'last', 'fin', 'tok', 'base')
if not m[1] then
  return {-1, 0}
end
if m[3] == ARGV[10] then
  -- a repeat of the newest append, applied before its reply was lost: do not store it twice
  return {tonumber(m[1]), 0}
end
local expected = tonumber(ARGV[9])
if expected >= 0 and tonumber(m[1]) < expected then
  if m[2] ~= '1' then
    drop(life)
  end
  return {-2, 0}
end
local max_events = tonumber(ARGV[8])
local last = 0
for i = 13, #ARGV, 2 do
  local event = ARGV[i + 1]
  if event == '' then
    last = add_event(meta, stream, max_events, ARGV[i], '0', '')
  else
    last = add_event(meta, stream, max_events, ARGV[i], '1', string.sub(event, 2))
  end
end
redis.call('HSET', meta, 'tok', ARGV[10])
if ARGV[11] == '1' then
  redis.call('HSET', meta, 'pend', ARGV[12])
end
local trimmed = 0
local stored = last - tonumber(m[4] or '0')
if stored > max_events and redis.call('HSETNX', meta, 'trimmed', '1') == 1 then
  trimmed = 1
end
if m[2] ~= '1' then
  keep_open(meta, stream)
end
touch_session()
wake(life)
return {last, trimmed}
"""

# KEYS[3] meta, KEYS[4] stream. ARGV[7] life, ARGV[8] finished-stream TTL (ms). -> 1 if it
# finished the stream now
_LUA_FINISH = """
local fin = redis.call('HGET', KEYS[3], 'fin')
if not fin or fin == '1' then
  return 0
end
finish(KEYS[3], KEYS[4], ARGV[7], tonumber(ARGV[8]))
touch_session()
return 1
"""

# KEYS[3] meta, KEYS[4] stream. ARGV[7] after, ARGV[8] limit, ARGV[9] reply byte budget.
# -> {finished (1/0), last, flat events}; {-1} unknown stream; {-2} cursor gone
_LUA_READ = """
local m = redis.call('HMGET', KEYS[3], 'last', 'fin')
if not m[1] then
  return {-1}
end
local last = tonumber(m[1])
local first = last - redis.call('XLEN', KEYS[4]) + 1
local after, limit = tonumber(ARGV[7]), tonumber(ARGV[8])
if after + 1 < first or after > last then
  return {-2}
end
if m[2] ~= '1' then
  keep_open(KEYS[3], KEYS[4])
end
touch_session()
-- At most `limit` entries, and no more bytes than the budget (but always one entry): a batch of
-- large events must not become one huge reply. Offsets are consecutive from after + 1, so the
-- reply is flat: data, then '' (no event type) or '=' and the type, per event.
local out, n, size, budget = {}, 0, 0, tonumber(ARGV[9])
local from = string.format('(0-%d', after)
while n < limit and size < budget do
  local chunk = redis.call('XRANGE', KEYS[4], from, '+', 'COUNT', math.min(256, limit - n))
  if #chunk == 0 then
    break
  end
  for _, entry in ipairs(chunk) do
    local fields = entry[2]
    size = size + #fields[2] + (fields[4] and #fields[4] or 0)
    if n > 0 and size > budget then
      break
    end
    n = n + 1
    out[2 * n - 1] = fields[2]
    out[2 * n] = fields[4] and ('=' .. fields[4]) or ''
    from = '(' .. entry[1]
  end
end
return {m[2] == '1' and 1 or 0, last, out}
"""

# KEYS[3] meta, KEYS[4] stream. ARGV[7] life, ARGV[8] how long the caller waits (ms).
# -> {last, finished (1/0)} or nil. Marks the stream watched (see wake) before looking, in the
# same script as the look: an append either came before (seen now) or will publish.
_LUA_WATCH = """
local m = redis.call('HMGET', KEYS[3], 'last', 'fin')
if not m[1] then
  return false
end
redis.call('SET', watch_key(ARGV[7]), '1', 'PX', ARGV[8])
return {tonumber(m[1]), m[2] == '1' and 1 or 0}
"""

# KEYS[3] meta, KEYS[4] stream.
# -> {kind, owner, last, finished (1/0), stored events, binding} or nil
_LUA_INFO = """
local m = redis.call('HMGET', KEYS[3], 'kind', 'owner', 'last', 'fin', 'auth')
if not m[3] then
  return false
end
if m[4] ~= '1' then
  keep_open(KEYS[3], KEYS[4])
end
touch_session()
return {m[1], m[2], tonumber(m[3]), m[4] == '1' and 1 or 0, redis.call('XLEN', KEYS[4]),
  m[5] or ''}
"""

# KEYS[3] meta, KEYS[4] stream. ARGV[7] life, ARGV[8] owner seen dead, ARGV[9] max events,
# ARGV[10] finished-stream TTL (ms), ARGV[11] caller token, ARGV[12] use the stored pending
# datas (1/0), ARGV[13..] error event datas (when not).
# -> 1 if this caller ended it (also when asked again after a lost reply)
_LUA_END_ORPHANED = """
local m = redis.call('HMGET', KEYS[3], 'owner', 'fin', 'ended_by', 'pend')
if m[2] == '1' and m[3] == ARGV[11] then
  return 1
end
if not m[1] or m[2] == '1' or m[1] ~= ARGV[8] then
  return 0
end
local max_events = tonumber(ARGV[9])
if ARGV[12] == '1' then
  for data in string.gmatch(m[4] or '', '[^\\n]+') do
    add_event(KEYS[3], KEYS[4], max_events, data, '0', '')
  end
else
  for i = 13, #ARGV do
    add_event(KEYS[3], KEYS[4], max_events, ARGV[i], '0', '')
  end
end
redis.call('HSET', KEYS[3], 'ended_by', ARGV[11])
finish(KEYS[3], KEYS[4], ARGV[7], tonumber(ARGV[10]))
return 1
"""

_UNKNOWN = -1
_LOST = -2


def redact_url(url: str) -> str:
    """*url* with its password (and any ``*pass*`` query value) replaced by ``***``.

    Args:
        url: a ``redis://``, ``rediss://`` or ``unix://`` URL.

    Returns:
        The URL, safe to log. The user name is kept (it identifies the ACL user).
    """
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, hostinfo = netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        netloc = f"{user}:***@{hostinfo}"
    redacted = f"{parts.scheme}://{netloc}{parts.path}"
    if parts.query:
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        redacted += "?" + urlencode([(k, "***" if "pass" in k.lower() else v) for k, v in pairs])
    return redacted


def _ms(seconds: float) -> int:
    """Seconds as whole milliseconds, at least 1 (a TTL of 0 would delete the key)."""
    return max(1, round(seconds * 1000))


async def _twice(attempt: Callable[[bool], Awaitable[T]]) -> T:
    """``attempt(False)``; on a dropped connection, ``attempt(True)`` once, at once.

    A pooled connection is found dead only when used (redis-py does not probe it first): after
    a Redis restart or failover each one fails once. The retry runs on a new connection.
    """
    try:
        return await attempt(False)
    except redis_errors.ConnectionError:
        return await attempt(True)


def _join_datas(datas: Sequence[str]) -> str:
    """Datas as one field value, LF-separated (each is single-line JSON)."""
    if any("\n" in data for data in datas):
        raise ValueError("pending error datas must be single lines")
    return "\n".join(datas)


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


@dataclass(slots=True)
class _Watch:
    """Local waiters of one stream life: one event, replaced at every wake-up."""

    changed: asyncio.Event = field(default_factory=asyncio.Event)
    #: Wake-ups received from Redis (not counting resubscriptions).
    messages: int = 0
    users: int = 0

    def wake(self, *, message: bool) -> None:
        if message:
            self.messages += 1
        self.changed.set()
        self.changed = asyncio.Event()


class RedisStore:
    """:class:`~mcp_sse_gateway.store.base.EventStore` in Redis, shared by all replicas.

    Args:
        client: command client. The store never opens more connections than its pool allows;
            :meth:`from_url` builds one bounded to :data:`COMMAND_CONNECTIONS`. Give it a
            blocking pool (a plain pool raises when exhausted) and ``socket_timeout=None``
            (see :data:`COMMAND_TIMEOUT_S`). A Redis Cluster client (see
            :class:`~mcp_sse_gateway.store.cluster.BoundedRedisCluster`) needs *pubsub_client*.
        pubsub_client: client whose pool provides the subscriber's one connection; defaults to
            *client* (then the subscriber takes one of its pooled connections). In Redis
            Cluster, a :class:`~mcp_sse_gateway.store.cluster.ClusterSubscriber`.
        key_prefix: prefix of every key and of the wake-up channel.
        session_idle_ttl_s: a session (record and open streams) expires this many seconds
            after its last use.
        max_events_per_stream: events kept per stream; older ones are trimmed.
        max_streams_per_session: stream lives kept per session.
        finished_stream_ttl_s: a finished stream stays replayable this many seconds.
        heartbeat_expiry_s: a replica's heartbeat key lives this many seconds.
        close_clients: :meth:`close` also closes the clients (true when the store built them).
        url_for_logs: where Redis is, for log lines; must already be redacted.

    Every method is safe to cancel: each change is one script, applied entirely or not at all,
    and a cancelled :meth:`wait` leaves nothing registered. Every method may raise
    :class:`~mcp_sse_gateway.errors.StoreUnavailable`, within :data:`COMMAND_TIMEOUT_S`.
    """

    def __init__(
        self,
        client: Redis | RedisCluster,
        *,
        pubsub_client: Redis | ClusterSubscriber | None = None,
        key_prefix: str = "mcp-sse-gateway",
        session_idle_ttl_s: float = 3600.0,
        max_events_per_stream: int = 10_000,
        max_streams_per_session: int = 100,
        finished_stream_ttl_s: float = 300.0,
        heartbeat_expiry_s: float = 15.0,
        close_clients: bool = False,
        url_for_logs: str = "",
    ) -> None:
        if pubsub_client is None and isinstance(client, RedisCluster):
            raise ValueError("a Redis Cluster client needs a pubsub_client (ClusterSubscriber)")
        self._client = client
        self._pubsub_client = pubsub_client if pubsub_client is not None else client
        self._prefix = key_prefix
        self._channel = wake_channel(key_prefix)
        self._idle_ms = _ms(session_idle_ttl_s)
        self._keep_ms = self._idle_ms + max(1, self._idle_ms // 10)
        self._fresh_ms = max(1, self._idle_ms // 10)
        self._max_events = max_events_per_stream
        self._max_streams = max_streams_per_session
        self._finished_ms = _ms(finished_stream_ttl_s)
        self._heartbeat_ms = _ms(heartbeat_expiry_s)
        self._read_max_bytes = READ_MAX_BYTES
        self._close_clients = close_clients
        self._url = url_for_logs
        scripts = {
            "record": _LUA_RECORD_SESSION,
            "get": _LUA_GET_SESSION,
            "tombstone": _LUA_TOMBSTONE,
            "purge": _LUA_PURGE,
            "drop": _LUA_DROP,
            "create": _LUA_CREATE,
            "append": _LUA_APPEND,
            "finish": _LUA_FINISH,
            "read": _LUA_READ,
            "info": _LUA_INFO,
            "watch": _LUA_WATCH,
            "orphan": _LUA_END_ORPHANED,
        }
        self._scripts = {
            name: client.register_script(_LUA_PRELUDE + body) for name, body in scripts.items()
        }
        self._watches: dict[tuple[str, str], _Watch] = {}
        self._subscribed = asyncio.Event()
        self._subscriber: asyncio.Task[None] | None = None
        self._wakeups_down = False
        # digest -> life -> last offset this process appended (detects lost events).
        self._written: dict[str, dict[str, int]] = {}
        self._tracked = 0
        self._heartbeats_sent: set[str] = set()
        self._healthy = True
        self._closed = False

    # Construction -----------------------------------------------------------------------------

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        key_prefix: str = "mcp-sse-gateway",
        session_idle_ttl_s: float = 3600.0,
        max_events_per_stream: int = 10_000,
        max_streams_per_session: int = 100,
        finished_stream_ttl_s: float = 300.0,
        heartbeat_expiry_s: float = 15.0,
        cluster: bool = False,
    ) -> RedisStore:
        """A store with its own bounded connections to the Redis at *url* (none opened yet).

        Args:
            url: ``redis://``, ``rediss://`` or ``unix://`` URL (see the module docstring); with
                *cluster*, ``redis://`` or ``rediss://`` of one node of the cluster.
            key_prefix: prefix of every key.
            session_idle_ttl_s: see the class.
            max_events_per_stream: see the class.
            max_streams_per_session: see the class.
            finished_stream_ttl_s: see the class.
            heartbeat_expiry_s: see the class.
            cluster: *url* names a node of a Redis Cluster: commands go through a cluster client
                (:data:`CLUSTER_COMMAND_CONNECTIONS_PER_NODE` connections per node), the
                wake-up subscriber to one node at a time.

        Returns:
            The store; :meth:`close` closes its connections.

        Raises:
            ValueError: the URL is malformed or of another scheme (with *cluster*: a
                ``unix://`` URL or a database other than 0).
        """
        options: dict[str, Any] = {
            "socket_connect_timeout": CONNECT_TIMEOUT_S,
            "socket_timeout": None,  # see COMMAND_TIMEOUT_S
            "socket_keepalive": True,
            "client_name": CLIENT_NAME,
            # redis-py repeats nothing; the store repeats a call itself, only when that is safe.
            "retry": Retry(NoBackoff(), 0),
        }
        url_options = dict(parse_url(url))
        for bound_here in ("max_connections", "timeout", "socket_timeout"):
            url_options.pop(bound_here, None)
        options.update(url_options)
        client: Redis | RedisCluster
        subscriber: Redis | ClusterSubscriber
        if cluster:
            client = cluster_client(
                options,
                commands_in_flight=CLUSTER_COMMAND_CONNECTIONS_PER_NODE,
                pool_wait_s=POOL_WAIT_S,
            )
            subscriber = ClusterSubscriber(client, options)
        else:
            commands = BlockingConnectionPool(
                max_connections=COMMAND_CONNECTIONS, timeout=POOL_WAIT_S, **options
            )
            wakeups = ConnectionPool(max_connections=SUBSCRIBER_CONNECTIONS, **options)
            client, subscriber = Redis.from_pool(commands), Redis.from_pool(wakeups)
        return cls(
            client,
            pubsub_client=subscriber,
            key_prefix=key_prefix,
            session_idle_ttl_s=session_idle_ttl_s,
            max_events_per_stream=max_events_per_stream,
            max_streams_per_session=max_streams_per_session,
            finished_stream_ttl_s=finished_stream_ttl_s,
            heartbeat_expiry_s=heartbeat_expiry_s,
            close_clients=True,
            url_for_logs=redact_url(url),
        )

    @classmethod
    def from_settings(cls, settings: StoreSettings) -> RedisStore:
        """A store bounded as ``[store]`` says (``redis_url`` required).

        Raises:
            ValueError: ``store.redis_url`` is not set or malformed.
        """
        if settings.redis_url is None:
            raise ValueError("store.redis_url is required for the redis backend")
        return cls.from_url(
            settings.redis_url.get_secret_value(),
            key_prefix=settings.key_prefix,
            session_idle_ttl_s=settings.session_idle_ttl_s,
            max_events_per_stream=settings.max_events_per_stream,
            max_streams_per_session=settings.max_streams_per_session,
            finished_stream_ttl_s=settings.finished_stream_ttl_s,
            heartbeat_expiry_s=settings.heartbeat_expiry_s,
            cluster=settings.redis_cluster,
        )

    @property
    def waiting(self) -> int:
        """Calls of :meth:`wait` in progress in this process."""
        return sum(watch.users for watch in self._watches.values())

    # Plumbing ---------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _guard(self, operation: str) -> AsyncIterator[None]:
        """Bound the commands of one call; map "Redis cannot serve this now" to StoreUnavailable.

        Outages and recoveries are logged once each.
        """
        if self._closed:
            raise StoreUnavailable("the event store is closed")
        try:
            async with asyncio.timeout(COMMAND_TIMEOUT_S):
                yield
        except UNAVAILABLE_ERRORS as exc:
            if self._healthy:
                self._healthy = False
                log.warning(
                    "store.redis_unavailable",
                    url=self._url,
                    operation=operation,
                    error=type(exc).__name__,
                )
            raise StoreUnavailable("the Redis event store cannot be reached") from exc
        if not self._healthy:
            self._healthy = True
            log.info("store.redis_recovered", url=self._url, operation=operation)

    async def _run(
        self,
        script: str,
        keys: SessionKeys,
        extra_keys: Sequence[str] = (),
        args: Sequence[str | int] = (),
    ) -> Any:
        """Run a script that is safe to repeat; repeat it once on a dead connection.

        Safe to repeat: idempotent, or carrying a token that recognises an applied attempt.
        """
        return await _twice(lambda _: self._run_once(script, keys, extra_keys, args))

    async def _run_once(
        self,
        script: str,
        keys: SessionKeys,
        extra_keys: Sequence[str] = (),
        args: Sequence[str | int] = (),
    ) -> Any:
        return await self._scripts[script](
            keys=[keys.index, keys.fresh, *extra_keys],
            args=[
                keys.meta_prefix,
                keys.stream_prefix,
                self._keep_ms,
                self._fresh_ms,
                self._channel,
                keys.wake_message(""),
                *args,
            ],
        )

    def _keys(self, session_id: str) -> SessionKeys:
        return SessionKeys.of(self._prefix, session_id)

    def _track(self, digest: str, life: str, offset: int) -> None:
        lives = self._written.setdefault(digest, {})
        if life not in lives:
            self._tracked += 1
        lives[life] = max(offset, lives.get(life, 0))  # concurrent appends complete out of order
        while self._tracked > MAX_TRACKED_STREAMS:
            oldest = next(iter(self._written))
            self._tracked -= len(self._written.pop(oldest))

    def _untrack(self, digest: str, life: str | None = None) -> None:
        lives = self._written.get(digest)
        if lives is None:
            return
        if life is None:
            self._tracked -= len(lives)
            del self._written[digest]
        elif lives.pop(life, None) is not None:
            self._tracked -= 1
            if not lives:
                del self._written[digest]

    # Sessions ---------------------------------------------------------------------------------

    async def record_session(
        self, session_id: str, protocol_version: str, *, auth: str = ""
    ) -> None:
        """Record (or refresh) a session's negotiated protocol version and creator binding.

        The record lives ``session_idle_ttl_s`` seconds from now (a tombstone is overwritten).

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        keys = self._keys(session_id)
        async with self._guard("record_session"):
            await self._run("record", keys, [keys.session], [protocol_version, self._idle_ms, auth])

    async def get_session(self, session_id: str, *, refresh: bool = True) -> SessionRecord | None:
        """The session's record, or None when there is none (never recorded, or expired).

        Args:
            session_id: the raw ``Mcp-Session-Id`` (only its digest reaches Redis).
            refresh: client traffic: a live, non-deleted record's idle TTL restarts, and so do
                the TTLs of the session's open streams.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        keys = self._keys(session_id)
        async with self._guard("get_session"):
            found = await self._run(
                "get", keys, [keys.session], ["1" if refresh else "0", self._idle_ms]
            )
        if found is None:
            return None
        return SessionRecord(
            keys.digest,
            _text(found[0]),
            deleted=_text(found[1]) == "1",
            auth=_text(found[2]) if len(found) > 2 else "",  # noqa: PLR2004 - {v, d, a}
        )

    async def tombstone_session(self, session_id: str) -> None:
        """Mark the session deleted for :data:`TOMBSTONE_TTL_S` seconds and drop its streams.

        Waiters of the dropped streams are woken.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        keys = self._keys(session_id)
        async with self._guard("tombstone_session"):
            await self._run("tombstone", keys, [keys.session], [_ms(TOMBSTONE_TTL_S)])
        self._untrack(keys.digest)

    async def purge_session(self, session_id: str) -> None:
        """Drop every stream of the session; waiters are woken. Idempotent.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        keys = self._keys(session_id)
        async with self._guard("purge_session"):
            await self._run("purge", keys)
        self._untrack(keys.digest)

    async def drop_stream(self, session_id: str, life: str) -> None:
        """Forget one stream life; its waiters are woken. Idempotent.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        keys = self._keys(session_id)
        async with self._guard("drop_stream"):
            await self._run("drop", keys, (), [life])
        self._untrack(keys.digest, life)

    # Streams ----------------------------------------------------------------------------------

    async def create_stream(
        self,
        session_id: str,
        life: str,
        *,
        kind: StreamKind,
        owner: str,
        pending: Sequence[str] = (),
        start_after: int = 0,
        auth: str = "",
        creator: str = "",
    ) -> None:
        """Store a new stream life's metadata (before its priming event leaves).

        Args:
            session_id: the raw session id.
            life: the new stream life (32 hex digits); an existing one is replaced.
            kind: ``request`` or ``standalone``.
            owner: the replica whose pump writes the stream (see :meth:`end_orphaned`).
            pending: error datas :meth:`end_orphaned` appends if the owner dies first (one
                JSON-RPC error response per request id; single-line JSON).
            start_after: the first event gets offset ``start_after + 1`` (a re-created stream
                life starts after every offset its earlier incarnation used).
            auth: the encoded binding of the creating request's credentials (no secret).
            creator: their digest: only finished streams of the same creator are evicted to
                make room (any, when ``""``).

        Raises:
            StoreLimitExceeded: the session already holds ``max_streams_per_session``
                streams and none is a finished one of this creator (those are evicted to make
                room first, oldest first).
            StoreUnavailable: Redis cannot be reached.
        """
        keys = self._keys(session_id)
        async with self._guard("create_stream"):
            created = await self._run(
                "create",
                keys,
                [keys.meta(life), keys.stream(life)],
                [
                    life,
                    kind,
                    owner,
                    self._max_streams,
                    _join_datas(pending),
                    start_after,
                    auth,
                    creator,
                ],
            )
        if not created:
            log.warning("store.streams_per_session_limit", limit=self._max_streams)
            raise StoreLimitExceeded("too many open streams in this session")
        self._track(keys.digest, life, 0)

    async def append(
        self,
        session_id: str,
        life: str,
        data: str,
        event: str | None,
        *,
        pending: Sequence[str] | None = None,
    ) -> int:
        """Append one event: :meth:`append_many` with one event; returns its offset."""
        return await self.append_many(session_id, life, [(data, event)], pending=pending)

    async def append_many(
        self,
        session_id: str,
        life: str,
        events: Sequence[tuple[str, str | None]],
        *,
        pending: Sequence[str] | None = None,
    ) -> int:
        """Append events in order and wake their readers, atomically (one script, one wake-up).

        Args:
            session_id: the raw session id.
            life: the stream life.
            events: ``(data, event type or None)`` pairs, at least one (each data's size is
                bounded upstream by ``max_event_bytes``).
            pending: when given, replaces the stream's pending error datas in the same script
                (the events answered requests; see :meth:`end_orphaned`).

        Returns:
            The offset of the last event (the first one's is ``len(events) - 1`` less).

        Raises:
            UnknownStream: the stream life does not exist (expired, purged, or lost by Redis),
                or events this process appended were lost (the life is then dropped).
            StoreUnavailable: Redis cannot be reached (the events may or may not be stored).
        """
        if not events:
            raise ValueError("append_many needs at least one event")
        keys = self._keys(session_id)
        expected = self._written.get(keys.digest, {}).get(life, -1)
        # A repeat after a lost reply carries the same token: the script recognises an applied
        # first attempt (unless another append to the stream came in between), never storing
        # the events twice.
        token = secrets.token_hex(8)
        args: list[Any] = [
            life,
            self._max_events,
            expected,
            token,
            "0" if pending is None else "1",
            "" if pending is None else _join_datas(pending),
        ]
        for data, event in events:
            args += (data, "" if event is None else "=" + event)
        async with self._guard("append"):
            offset, trimmed = await self._run(
                "append", keys, [keys.meta(life), keys.stream(life)], args
            )
        if offset == _LOST:
            log.error("store.stream_lost", session=keys.digest, expected_offset=expected)
            self._untrack(keys.digest, life)
            raise UnknownStream("events of this stream life were lost by the store")
        if offset == _UNKNOWN:
            self._untrack(keys.digest, life)
            raise UnknownStream
        if trimmed:
            log.warning("store.stream_trimmed", limit_events=self._max_events)
        if expected >= 0:
            self._track(keys.digest, life, offset)
        return int(offset)

    async def finish(self, session_id: str, life: str) -> None:
        """Append the terminal marker and wake readers. Idempotent; no-op on unknown streams.

        The stream then stays replayable ``finished_stream_ttl_s`` seconds.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        keys = self._keys(session_id)
        async with self._guard("finish"):
            await self._run(
                "finish", keys, [keys.meta(life), keys.stream(life)], [life, self._finished_ms]
            )
        self._untrack(keys.digest, life)

    async def read(self, session_id: str, life: str, after: int, limit: int) -> ReadResult:
        """Events with offsets after *after*, oldest first, at most *limit* (one script).

        Fewer than *limit* may come back while more are stored: a reply carries at most
        :data:`READ_MAX_BYTES` of event data (but always one event). Read again from the last
        offset returned.

        Raises:
            UnknownStream: no such stream life under this session.
            CursorGone: the event at ``after + 1`` is no longer stored (trimmed, evicted, lost),
                or *after* is beyond the last offset.
            StoreUnavailable: Redis cannot be reached.
        """
        keys = self._keys(session_id)
        async with self._guard("read"):
            reply = await self._run(
                "read",
                keys,
                [keys.meta(life), keys.stream(life)],
                [after, max(0, limit), self._read_max_bytes],
            )
        if reply[0] == _UNKNOWN:
            raise UnknownStream
        if reply[0] == _LOST:
            raise CursorGone
        finished, last, flat = reply
        events = [
            StoredEvent(
                after + 1 + index,
                _text(data),
                None if not event else _text(event)[1:],
            )
            for index, (data, event) in enumerate(zip(flat[::2], flat[1::2], strict=True))
        ]
        reached = events[-1].offset if events else after
        return ReadResult(events, bool(finished) and reached >= last)

    async def stream_info(self, session_id: str, life: str) -> StreamInfo | None:
        """The stream life's metadata, or None when it does not exist under this session.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        keys = self._keys(session_id)
        async with self._guard("stream_info"):
            reply = await self._run("info", keys, [keys.meta(life), keys.stream(life)])
        if reply is None:
            return None
        kind, owner, last, finished, stored, binding = reply
        return StreamInfo(
            life=life,
            kind=cast("StreamKind", _text(kind)),
            first_offset=int(last) - int(stored) + 1,
            last_offset=int(last),
            finished=bool(finished),
            owner=_text(owner),
            auth=_text(binding),
        )

    # Waiting ----------------------------------------------------------------------------------

    async def wait(self, session_id: str, life: str, after: int, timeout_s: float) -> bool:
        """Wait until an event after *after* is stored, or the stream finished or was dropped.

        Holds no Redis connection while waiting: the process's subscriber wakes it. The stream
        is checked once the subscription is in place (so a wake-up published before it is not
        missed) and again after the subscriber reconnected.

        Args:
            session_id: the raw session id.
            life: the stream life.
            after: the reader's cursor.
            timeout_s: the longest wait, seconds (each check of the stream adds at most one
                command round trip, bounded by the command timeout).

        Returns:
            True when woken by one of those (or by :meth:`close`), False when *timeout_s*
            seconds passed first. Safe to cancel.

        Raises:
            StoreUnavailable: Redis cannot be reached to check the stream.
        """
        keys = self._keys(session_id)
        self._start_subscriber()
        deadline = asyncio.get_running_loop().time() + max(0.0, timeout_s)
        watch = self._watches.setdefault((keys.digest, life), _Watch())
        watch.users += 1
        try:
            while True:
                changed, seen = watch.changed, watch.messages
                subscribed = self._subscribed.is_set()
                left_s = deadline - asyncio.get_running_loop().time()
                if self._closed or await self._has_news(keys, life, after, max(0.0, left_s)):
                    return True
                loop = asyncio.get_running_loop()
                if not subscribed:
                    # Wait for the subscription (bounded), then look again.
                    if loop.time() >= deadline:
                        return False
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(
                            min(UNSUBSCRIBED_RECHECK_S, deadline - loop.time())
                        ):
                            await self._subscribed.wait()
                    continue
                try:
                    async with asyncio.timeout_at(deadline):
                        await changed.wait()
                except TimeoutError:
                    return False
                if watch.messages != seen:
                    return True
                # Resubscribed after an outage (wake-ups may be lost), or closed: look again.
        finally:
            watch.users -= 1
            if watch.users == 0 and self._watches.get((keys.digest, life)) is watch:
                del self._watches[keys.digest, life]

    async def _has_news(self, keys: SessionKeys, life: str, after: int, wait_s: float) -> bool:
        """Whether the stream moved past *after*; else marks it watched for *wait_s* (+1 s)."""
        async with self._guard("wait"):
            reply = await self._run(
                "watch",
                keys,
                [keys.meta(life), keys.stream(life)],
                [life, _ms(wait_s + WATCH_MARGIN_S)],
            )
        return reply is None or int(reply[0]) > after or bool(reply[1])

    def _start_subscriber(self) -> None:
        if self._subscriber is None and not self._closed:
            self._subscriber = asyncio.get_running_loop().create_task(
                self._subscribe_forever(), name="mcp-sse-gateway-store-wakeups"
            )

    def _wake_all(self) -> None:
        for watch in self._watches.values():
            watch.wake(message=False)

    async def _subscribe_forever(self) -> None:
        """The subscriber task: (re)subscribe with bounded backoff, dispatch wake-ups."""
        backoff_s = SUBSCRIBER_BACKOFF_S[0]
        while True:
            pubsub = self._pubsub_client.pubsub()
            try:
                await pubsub.subscribe(self._channel)
                await self._dispatch(pubsub)
            except Exception as exc:  # noqa: BLE001 - the subscriber must outlive any failure
                if self._subscribed.is_set():
                    backoff_s = SUBSCRIBER_BACKOFF_S[0]  # it worked until now: a new outage
                    self._subscribed.clear()
                    # Waiters look at their stream now: they learn of the outage at once.
                    self._wake_all()
                if not self._wakeups_down:
                    self._wakeups_down = True
                    log.warning("store.redis_wakeups_lost", url=self._url, error=type(exc).__name__)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
            await asyncio.sleep(backoff_s * random.uniform(0.5, 1.0))  # noqa: S311 - jitter
            backoff_s = min(backoff_s * 2, SUBSCRIBER_BACKOFF_S[1])

    async def _dispatch(self, pubsub: PubSub) -> None:
        """Read the subscription until it fails (never returns normally)."""
        loop = asyncio.get_running_loop()
        last_seen = loop.time()
        pinged = False
        while True:
            message = await pubsub.get_message(timeout=SUBSCRIBER_POLL_S)
            now = loop.time()
            if message is None:
                if now - last_seen > SUBSCRIBER_DEAD_S:
                    raise redis_errors.TimeoutError("the wake-up subscription went silent")
                if now - last_seen > SUBSCRIBER_PING_S and not pinged:
                    await pubsub.ping()
                    pinged = True
                continue
            last_seen, pinged = now, False
            kind = _text(message["type"])
            if kind == "message":
                parsed = parse_wake_message(_text(message["data"]))
                watch = self._watches.get(parsed) if parsed else None
                if watch is not None:
                    watch.wake(message=True)
            elif kind == "subscribe":
                self._subscribed.set()
                if self._wakeups_down:
                    self._wakeups_down = False
                    log.info("store.redis_wakeups_restored", url=self._url)
                # Wake-ups published while we were not subscribed are lost: look again.
                self._wake_all()

    # Liveness (DESIGN D7) ---------------------------------------------------------------------

    async def heartbeat(self, replica_id: str) -> None:
        """Write this replica's heartbeat key (one per replica), alive ``heartbeat_expiry_s``.

        Call it every ``heartbeat_s``. Logs ``store.heartbeat_lapsed`` when the key had expired
        since the previous call: other replicas may have ended this replica's streams.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        key = heartbeat_key(self._prefix, replica_id)
        async with self._guard("heartbeat"):
            previous = await _twice(
                lambda _: self._client.set(key, "1", px=self._heartbeat_ms, get=True)
            )
        if previous is None and replica_id in self._heartbeats_sent:
            log.warning("store.heartbeat_lapsed", replica=replica_id)
        self._heartbeats_sent.add(replica_id)

    async def replica_alive(self, replica_id: str) -> bool:
        """Whether *replica_id*'s heartbeat key exists (it beat within ``heartbeat_expiry_s``).

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        async with self._guard("replica_alive"):
            key = heartbeat_key(self._prefix, replica_id)
            return bool(await _twice(lambda _: self._client.exists(key)))

    async def end_orphaned(
        self, session_id: str, life: str, error_datas: Sequence[str] | None = None
    ) -> bool:
        """End a stream whose owner replica is dead, exactly once across all replicas.

        If the stream is unfinished and its owner's heartbeat key is gone, appends
        *error_datas* (one event each, default type) and then the terminal marker, in one
        compare-and-set script (it ends the stream only if it is still unfinished and owned by
        the replica seen dead), and wakes its readers.

        Args:
            session_id: the raw session id.
            life: the stream life.
            error_datas: the SSE data of each error event (JSON-RPC error responses); None
                appends the stream's stored pending ones.

        Returns:
            True only for the one caller that ended the stream; False when the stream does not
            exist, is finished, or its owner is alive.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        keys = self._keys(session_id)
        token = secrets.token_hex(8)
        async with self._guard("end_orphaned"):
            owner, finished = await _twice(
                lambda _: self._client.hmget(keys.meta(life), ["owner", "fin"])
            )
            if owner is None or _text(finished or b"0") == "1":
                return False
            owner = _text(owner)
            if await _twice(lambda _: self._client.exists(heartbeat_key(self._prefix, owner))):
                return False
            ended = await self._run(
                "orphan",
                keys,
                [keys.meta(life), keys.stream(life)],
                [
                    life,
                    owner,
                    self._max_events,
                    self._finished_ms,
                    token,
                    "1" if error_datas is None else "0",
                    *(error_datas or ()),
                ],
            )
        if ended:
            log.warning("store.stream_orphaned", session=keys.digest, owner=owner)
            self._untrack(keys.digest, life)
        return bool(ended)

    # Lifecycle --------------------------------------------------------------------------------

    async def ping(self) -> None:
        """Return when Redis answers ``PING``.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        async with self._guard("ping"):
            await _twice(lambda _: self._client.ping())

    async def close(self) -> None:
        """Stop the subscriber, wake every waiter, release connections. Idempotent.

        Later calls of other methods raise StoreUnavailable.
        """
        if self._closed:
            return
        self._closed = True
        task, self._subscriber = self._subscriber, None
        while task is not None and not task.done():
            # Repeated: a client with a socket_timeout may swallow one cancellation (3.11).
            task.cancel()
            await asyncio.wait([task], timeout=0.1)
        self._wake_all()
        if self._close_clients:
            for client in {id(c): c for c in (self._client, self._pubsub_client)}.values():
                with contextlib.suppress(*UNAVAILABLE_ERRORS):
                    await client.aclose()
