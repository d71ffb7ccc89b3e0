"""The Redis event store: the production backend, shared by every replica (DESIGN D7).

Data model (key names: :mod:`~mcp_sse_gateway.store.redis.keys`): one Redis stream per stream
life with explicit sequential entry ids ``0-<offset>``, a metadata hash next to it (kind, owner,
last offset, finished flag), a list of the session's lives, the session record, and one
heartbeat key per replica. Every write is one Lua script (:mod:`~mcp_sse_gateway.store.redis.lua`),
so it is atomic: ``append`` checks the stream exists, bumps the offset, adds the entry
(``XADD``), trims to ``max_events_per_stream`` (exact ``MAXLEN``), refreshes TTLs and publishes
a wake-up when a reader waits on the stream through the store.

Gaps are never silent: the oldest stored offset is derived from the stream itself
(``last - XLEN + 1``), so events that were trimmed, evicted or lost make a cursor before them
raise :class:`~mcp_sse_gateway.errors.CursorGone`; a stream life whose metadata is gone (Redis
restarted without persistence, TTL) raises :class:`~mcp_sse_gateway.errors.UnknownStream`.
Events this process appended and Redis then lost drop the stream life
(:mod:`~mcp_sse_gateway.store.redis.offsets`).

Every key has a TTL. Session records: ``session_idle_ttl_s`` (tombstones 300 s). An open stream's
keys and the session's list live ``session_idle_ttl_s`` to 1.1 times that after the session's last
use (any stream operation or ``get_session(refresh=True)``): the stream being used is refreshed by
this replica at most every 30 s (or ``session_idle_ttl_s / 20``;
:mod:`~mcp_sse_gateway.store.redis.local_cache`), the other open streams of the session at most
once per ``session_idle_ttl_s / 10`` (a ``fresh`` marker key). A finished stream lives
``finished_stream_ttl_s`` from its terminal marker. Heartbeats: ``heartbeat_expiry_s``.

The rest, one module each: connections, budgets and repeats
(:mod:`~mcp_sse_gateway.store.redis.connections`), the call queue, stall timeout and outages
(:mod:`~mcp_sse_gateway.store.redis.calls`), wake-ups
(:mod:`~mcp_sse_gateway.store.redis.wakeups`), liveness
(:mod:`~mcp_sse_gateway.store.redis.liveness`), Redis Cluster
(:mod:`~mcp_sse_gateway.store.redis.cluster`; every key of a session shares the hash tag
``{<digest>}``, so every script runs on one node).

Requires Redis ≥ 6.2 (``XRANGE`` exclusive ranges, ``SET … GET``).
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from mcp_sse_gateway.config import DEFAULT_MAX_QUEUED_CALLS, DEFAULT_STALL_TIMEOUT_S, StoreSettings
from mcp_sse_gateway.store.base import StoreObserver
from mcp_sse_gateway.store.redis.batches import Batches
from mcp_sse_gateway.store.redis.calls import LIVENESS, RUNNING, Calls
from mcp_sse_gateway.store.redis.cluster import ClusterSubscriber
from mcp_sse_gateway.store.redis.connections import (
    COMMAND_CONNECTIONS,
    Clients,
    close_clients,
    open_clients,
)
from mcp_sse_gateway.store.redis.keys import SessionKeys, wake_channel
from mcp_sse_gateway.store.redis.lane import Lane
from mcp_sse_gateway.store.redis.liveness import Liveness
from mcp_sse_gateway.store.redis.local_cache import (
    REFRESH_PERIOD_S,
    SESSION_CACHE_S,
)
from mcp_sse_gateway.store.redis.lua import Scripts
from mcp_sse_gateway.store.redis.offsets import WrittenOffsets
from mcp_sse_gateway.store.redis.replays import Replays
from mcp_sse_gateway.store.redis.replies import text
from mcp_sse_gateway.store.redis.sessions import SessionStore
from mcp_sse_gateway.store.redis.streams import ms
from mcp_sse_gateway.store.redis.wakeups import Wakeups

log = structlog.get_logger("mcp_sse_gateway.store")

#: A waiter's mark on its stream (only watched streams publish wake-ups) outlives its wait by
#: this much, seconds.
WATCH_MARGIN_S = 1.0


def _permits(client: Redis | RedisCluster, *, shares_subscriber: bool) -> int:
    """Calls in flight at most: the command connections.

    One fewer when the subscriber takes a connection of the same pool.
    """
    pool = getattr(client, "connection_pool", None)
    size = int(getattr(pool, "max_connections", COMMAND_CONNECTIONS) or COMMAND_CONNECTIONS)
    size = min(size, COMMAND_CONNECTIONS)
    return max(1, size - 1) if shares_subscriber else size


def _refresh_period(session_idle_ttl_s: float) -> float:
    """How long this replica skips refreshing a stream's TTLs, seconds."""
    return min(REFRESH_PERIOD_S, session_idle_ttl_s / 20)


def _session_cache_s(session_idle_ttl_s: float) -> float:
    """How long this replica serves a session record from memory, seconds."""
    return min(SESSION_CACHE_S, session_idle_ttl_s / 10)


class RedisStore(SessionStore):
    """:class:`~mcp_sse_gateway.store.base.EventStore` in Redis, shared by all replicas.

    Args:
        client: command client. The store never opens more connections than its pool allows;
            :meth:`from_url` builds one bounded as
            :mod:`~mcp_sse_gateway.store.redis.connections` says. Give it a blocking pool (a
            plain pool raises when exhausted) and ``socket_timeout=None`` (see
            :mod:`~mcp_sse_gateway.store.redis.calls`). A Redis Cluster
            client (:class:`~mcp_sse_gateway.store.redis.cluster.BoundedRedisCluster`) needs
            *pubsub_client*.
        pubsub_client: client whose pool provides the subscriber's one connection; defaults to
            *client* (then the subscriber takes one of its pooled connections). In Redis
            Cluster, a :class:`~mcp_sse_gateway.store.redis.cluster.ClusterSubscriber`.
        key_prefix: prefix of every key and of the wake-up channel.
        session_idle_ttl_s: a session (record and open streams) expires this many seconds
            after its last use.
        max_events_per_stream: events kept per stream; older ones are trimmed.
        max_streams_per_session: stream lives kept per session.
        finished_stream_ttl_s: a finished stream stays replayable this many seconds.
        heartbeat_expiry_s: a replica's heartbeat key lives this many seconds.
        stall_timeout_s: how long Redis may leave a command unanswered before the store counts
            as down, seconds (:mod:`~mcp_sse_gateway.store.redis.calls`; waiting in the queue
            does not count).
        max_queued_calls: queued calls beyond which new work gets ``StoreBusy``.
        observer: told each call's queue wait and round trip (metrics).
        close_clients: :meth:`close` also closes the clients (true when the store built them).
        url_for_logs: where Redis is, for log lines; must already be redacted.
        lane: a paced stream's lone appends and finishes go on a connection of their own, from
            the pump's task (:class:`~mcp_sse_gateway.store.redis.lane.Lane`; one more
            client connection). False sends every call in a pipeline; so should an in-process
            fake Redis, which answers without yielding, so every call would go alone.

    Every method is safe to cancel: each change is one script, applied entirely or not at all,
    and a cancelled :meth:`wait` leaves nothing registered. Every method may raise
    :class:`~mcp_sse_gateway.errors.StoreUnavailable` (Redis down or stalled); the methods
    that start new work (session records and lookups, new streams) may raise
    :class:`~mcp_sse_gateway.errors.StoreBusy` when the call queue is full.
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
        stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
        max_queued_calls: int = DEFAULT_MAX_QUEUED_CALLS,
        observer: StoreObserver | None = None,
        close_clients: bool = False,
        url_for_logs: str = "",
        lane: bool = True,
    ) -> None:
        subscriber: Redis | ClusterSubscriber
        if pubsub_client is not None:
            subscriber = pubsub_client
        elif isinstance(client, RedisCluster):
            raise ValueError("a Redis Cluster client needs a pubsub_client (ClusterSubscriber)")
        else:
            subscriber = client
        self._clients = Clients(client, subscriber, url_for_logs)
        self._client = client
        idle_ms = ms(session_idle_ttl_s)
        self._close_clients = close_clients
        observer = observer or StoreObserver()
        calls = Calls(
            _permits(client, shares_subscriber=subscriber is client),
            url_for_logs,
            stall_timeout_s=stall_timeout_s,
            max_queued_calls=max_queued_calls,
            on_queue_wait=observer.queue_wait,
            on_round_trip=observer.round_trip,
        )
        written = WrittenOffsets()
        scripts = Scripts(
            client,
            keep_ms=idle_ms + max(1, idle_ms // 10),
            fresh_ms=max(1, idle_ms // 10),
            channel=wake_channel(key_prefix),
        )
        super().__init__(
            scripts,
            calls,
            written,
            prefix=key_prefix,
            max_events=max_events_per_stream,
            max_streams=max_streams_per_session,
            finished_ms=ms(finished_stream_ttl_s),
            refresh_period_s=_refresh_period(session_idle_ttl_s),
            idle_ms=idle_ms,
            session_cache_s=_session_cache_s(session_idle_ttl_s),
        )
        if not isinstance(client, RedisCluster):
            self._batches = Batches(
                client,
                self._scripts,
                self._calls,
                lane=Lane(client, stall_timeout_s) if lane else None,
            )
            self._replays = Replays(client, self._scripts, self._calls)
        self._wakeups = Wakeups(self._clients.subscriber, wake_channel(key_prefix), url_for_logs)
        self._liveness = Liveness(
            client,
            self._scripts,
            self._calls,
            self._written,
            prefix=key_prefix,
            heartbeat_ms=ms(heartbeat_expiry_s),
            max_events=max_events_per_stream,
            finished_ms=self._finished_ms,
        )

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
        stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
        max_queued_calls: int = DEFAULT_MAX_QUEUED_CALLS,
        observer: StoreObserver | None = None,
    ) -> RedisStore:
        """A store with its own bounded connections to the Redis at *url* (none opened yet).

        Args:
            url: ``redis://``, ``rediss://`` or ``unix://`` URL (see
                :mod:`~mcp_sse_gateway.store.redis.connections`); with *cluster*, ``redis://``
                or ``rediss://`` of one node of the cluster.
            key_prefix: prefix of every key.
            session_idle_ttl_s: see the class.
            max_events_per_stream: see the class.
            max_streams_per_session: see the class.
            finished_stream_ttl_s: see the class.
            heartbeat_expiry_s: see the class.
            cluster: *url* names a node of a Redis Cluster.
            stall_timeout_s: see the class.
            max_queued_calls: see the class.
            observer: see the class.

        Returns:
            The store; :meth:`close` closes its connections.

        Raises:
            ValueError: the URL is malformed or of another scheme (with *cluster*: a
                ``unix://`` URL or a database other than 0).
        """
        clients = open_clients(url, cluster=cluster)
        return cls(
            clients.commands,
            pubsub_client=clients.subscriber,
            key_prefix=key_prefix,
            session_idle_ttl_s=session_idle_ttl_s,
            max_events_per_stream=max_events_per_stream,
            max_streams_per_session=max_streams_per_session,
            finished_stream_ttl_s=finished_stream_ttl_s,
            heartbeat_expiry_s=heartbeat_expiry_s,
            stall_timeout_s=stall_timeout_s,
            max_queued_calls=max_queued_calls,
            observer=observer,
            close_clients=True,
            url_for_logs=clients.url_for_logs,
        )

    @classmethod
    def from_settings(
        cls, settings: StoreSettings, *, observer: StoreObserver | None = None
    ) -> RedisStore:
        """A store bounded as ``[store]`` says (``redis_url`` required), observed by *observer*.

        Raises:
            ValueError: ``store.redis_url`` is not set or malformed.
        """
        if settings.redis_url is None:
            raise ValueError("store.redis_url is required for the redis backend")
        slack_s = settings.heartbeat_expiry_s - settings.heartbeat_s
        if settings.stall_timeout_s >= slack_s:
            # A heartbeat may wait for one stalled call, then stall itself: other replicas
            # could take this one for dead before its store counts as down.
            log.warning(
                "store.stall_timeout_exceeds_heartbeat_slack",
                stall_timeout_s=settings.stall_timeout_s,
                heartbeat_slack_s=slack_s,
            )
        return cls.from_url(
            settings.redis_url.get_secret_value(),
            key_prefix=settings.key_prefix,
            session_idle_ttl_s=settings.session_idle_ttl_s,
            max_events_per_stream=settings.max_events_per_stream,
            max_streams_per_session=settings.max_streams_per_session,
            finished_stream_ttl_s=settings.finished_stream_ttl_s,
            heartbeat_expiry_s=settings.heartbeat_expiry_s,
            cluster=settings.redis_cluster,
            stall_timeout_s=settings.stall_timeout_s,
            max_queued_calls=settings.max_queued_calls,
            observer=observer,
        )

    @property
    def clients(self) -> Clients:
        """The command client and the subscriber's client."""
        return self._clients

    @property
    def waiting(self) -> int:
        """Calls of :meth:`wait` in progress in this process."""
        return self._wakeups.waiting

    @property
    def parked(self) -> int:
        """Calls of :meth:`wait` that looked at their stream and now wait for a wake-up."""
        return self._wakeups.parked

    @property
    def queued(self) -> int:
        """Calls waiting now, for a connection or in a batch for its pipeline.

        See :mod:`~mcp_sse_gateway.store.redis.calls` and
        :mod:`~mcp_sse_gateway.store.redis.batches`.
        """
        return self._calls.queued + self._calls.also_queued()

    @property
    def subscribed(self) -> bool:
        """Whether this process's wake-up subscription is in place."""
        return self._wakeups.subscribed

    # Waiting ----------------------------------------------------------------------------------

    async def wait(
        self, session_id: str, life: str, after: int, timeout_s: float, *, reader: str | None = None
    ) -> bool:
        """Wait until an event after *after* is stored, or the stream finished or was dropped.

        Holds no Redis connection while waiting: the process's wake-up subscription wakes it
        (:mod:`~mcp_sse_gateway.store.redis.wakeups`). The stream is checked once the waiter is
        registered (so a wake-up published before is not missed) and again after each new
        subscription.

        Args:
            session_id: the raw session id.
            life: the stream life.
            after: the reader's cursor.
            timeout_s: the longest wait, seconds (each check of the stream adds at most one
                command round trip, bounded by the command timeout).
            reader: the caller's claim on the stream: a newer claim is news too.

        Returns:
            True when woken by one of those (or by :meth:`close`), False when *timeout_s*
            seconds passed first. Safe to cancel.

        Raises:
            StoreUnavailable: Redis cannot be reached to check the stream.
        """
        keys = self._keys(session_id)
        return await self._wakeups.wait(
            (keys.digest, life),
            lambda wait_s: self._has_news(keys, life, after, wait_s, reader),
            timeout_s,
        )

    async def _has_news(
        self, keys: SessionKeys, life: str, after: int, wait_s: float, reader: str | None
    ) -> bool:
        """Whether the stream moved on (or another reader than *reader* claimed it).

        Else it marks the stream watched for *wait_s* (+1 s).
        """
        reply = await self._script(
            "watch",
            RUNNING,
            keys,
            [keys.meta(life), keys.stream(life)],
            [life, ms(wait_s + WATCH_MARGIN_S)],
            operation="wait",
        )
        if reply is None or int(reply[0]) > after or bool(reply[1]):
            return True
        claimed = text(reply[2])
        return reader is not None and claimed not in {"", reader}

    # Liveness (DESIGN D7; :mod:`~mcp_sse_gateway.store.redis.liveness`) ----------------------

    async def heartbeat(self, replica_id: str) -> None:
        """Write this replica's heartbeat key; call it every ``heartbeat_s``.

        See :meth:`~mcp_sse_gateway.store.redis.liveness.Liveness.heartbeat`.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        await self._liveness.heartbeat(replica_id)

    async def replica_alive(self, replica_id: str) -> bool:
        """Whether *replica_id* beat within ``heartbeat_expiry_s``.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        return await self._liveness.replica_alive(replica_id)

    async def end_orphaned(
        self, session_id: str, life: str, error_datas: Sequence[str] | None = None
    ) -> bool:
        """End a stream whose owner replica is dead, exactly once across all replicas.

        Args:
            session_id: the raw session id.
            life: the stream life.
            error_datas: the SSE data of each error event (JSON-RPC error responses), appended
                before the terminal marker; None appends the stream's stored pending ones.

        Returns:
            True only for the one caller that ended the stream; False when the stream does not
            exist, is finished, or its owner is alive.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        return await self._liveness.end_orphaned(self._keys(session_id), life, error_datas)

    # Lifecycle --------------------------------------------------------------------------------

    async def ping(self) -> None:
        """Return when Redis answers ``PING``.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        async with self._calls.call("ping", LIVENESS):
            await self._client.ping()

    async def close(self) -> None:
        """Stop the subscriber, wake every waiter, release connections. Idempotent.

        Later calls of other methods raise StoreUnavailable.
        """
        if self._calls.closed:
            return
        self._calls.closed = True
        if self._batches is not None:
            await self._batches.close()
        await self._wakeups.close()
        if self._close_clients:
            await close_clients(self._clients)
