"""Redis Cluster plumbing of the Redis event store (DESIGN D7): bounded clients, one subscriber.

:class:`BoundedRedisCluster` is redis-py's async cluster client with a bound on the commands in
flight. redis-py gives each node a pool of ``max_connections`` connections but raises
``MaxConnectionsError`` when a pool is exhausted instead of waiting (unlike the single-node
``BlockingConnectionPool``). With no more commands in flight than a node's pool holds, and each
command in flight using at most one connection of each node, no pool is ever exhausted: a burst
queues for a permit, as it queues for a connection on a single Redis.

:class:`ClusterSubscriber` chooses where the wake-up subscriber connects: a plain (non-cluster)
connection to one node. Classic ``PUBLISH`` is broadcast to every node of a cluster (also from a
script), so a subscription on any node receives every wake-up. It starts on the URL's node and,
as the subscriber reconnects only after its connection failed, moves on to the next node the
cluster client knows of at each reconnection, so a node that is gone is left behind.

Used by :mod:`mcp_sse_gateway.store.redis` only; no I/O happens at construction.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextvars import ContextVar
from typing import Any, cast

from redis import exceptions as redis_errors
from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterPipeline, RedisCluster
from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection

#: Options of a single-node connection that mean nothing to a cluster client (or are set here).
_NOT_FOR_CLUSTER = ("connection_class", "db", "path")


#: Set in a task while it holds a permit: a command run on behalf of another one (a pipeline
#: re-sending a redirected command) does not wait for a second permit.
_HOLDING_PERMIT: ContextVar[bool] = ContextVar("mcp_sse_gateway_cluster_permit", default=False)


class BoundedRedisCluster(RedisCluster):
    """An async Redis Cluster client with at most *commands_in_flight* commands in flight.

    Every node's pool is bounded to the same number, so a node never holds more command
    connections of this client than that. A command (or a pipeline, which redis-py also uses for
    multi-key commands such as ``EXISTS``) waits up to *pool_wait_s* seconds for a permit, then
    raises ``ConnectionError`` (as ``BlockingConnectionPool`` does).

    A failed topology discovery (no startup node reachable, slots not covered) is raised as
    ``ConnectionError``, like any other "cannot reach Redis"; redis-py raises it as a
    ``RedisClusterException``, which it also uses for programming errors (cross-slot keys).

    Args:
        commands_in_flight: the bound, also each node's ``max_connections``.
        pool_wait_s: how long a command waits for a permit, seconds.
        **options: :class:`~redis.asyncio.cluster.RedisCluster` arguments.
    """

    def __init__(self, *, commands_in_flight: int, pool_wait_s: float, **options: Any) -> None:
        super().__init__(max_connections=commands_in_flight, **options)
        self._permits = asyncio.Semaphore(commands_in_flight)
        self._pool_wait_s = pool_wait_s

    @contextlib.asynccontextmanager
    async def permit(self) -> AsyncIterator[None]:
        """Hold one permit (at most one connection per node) while the block runs."""
        if _HOLDING_PERMIT.get():
            yield
            return
        try:
            async with asyncio.timeout(self._pool_wait_s):
                await self._permits.acquire()
        except TimeoutError:
            raise redis_errors.ConnectionError("No connection available.") from None
        holding = _HOLDING_PERMIT.set(True)
        try:
            yield
        finally:
            _HOLDING_PERMIT.reset(holding)
            self._permits.release()

    def as_outage(self, exc: redis_errors.RedisClusterException) -> Exception:
        """*exc* as ``ConnectionError`` when it means the cluster cannot be reached or used."""
        if isinstance(exc, redis_errors.SlotNotCoveredError):
            return redis_errors.ConnectionError(f"Redis Cluster slots not covered: {exc}")
        if self._initialize:  # the topology is unknown: its discovery failed
            return redis_errors.ConnectionError(f"cannot discover the Redis Cluster: {exc}")
        return exc  # the topology is known: a usage error, not an outage

    async def initialize(self, *args: Any, **kwargs: Any) -> BoundedRedisCluster:
        """Discover the topology (once; again after a failure), sharing the nodes' pools.

        redis-py keeps the startup node given by the URL as an object of its own, whose one
        connection (used for ``CLUSTER SLOTS``) stays open beside that node's pool. Once the
        topology is known, the discovered node replaces it among the startup nodes and its
        connection is closed: later discoveries use the pools, within their bound.
        """
        await super().initialize(*args, **kwargs)
        manager = self.nodes_manager
        for name, node in list(manager.startup_nodes.items()):
            pooled = manager.nodes_cache.get(name)
            if pooled is not None and pooled is not node:
                manager.startup_nodes[name] = pooled
                with contextlib.suppress(redis_errors.RedisError, OSError):
                    await node.disconnect()
        return self

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        """Run one command (possibly on several nodes) once a permit is free."""
        async with self.permit():
            try:
                return await super().execute_command(*args, **kwargs)
            except redis_errors.RedisClusterException as exc:
                outage = self.as_outage(exc)
                if outage is exc:
                    raise
                raise outage from exc

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> Any:
        """A pipeline that runs under one permit (redis-py uses them for ``EXISTS``, ``DEL``)."""
        if shard_hint:
            raise redis_errors.RedisClusterException("shard_hint is deprecated in cluster mode")
        # redis-py's CommandsProtocol declares _event_dispatcher, which its async ClusterPipeline
        # never sets, so mypy takes every ClusterPipeline for abstract.
        return _BoundedPipeline(self, transaction)  # type: ignore[abstract]


class _BoundedPipeline(ClusterPipeline):
    """A cluster pipeline executed under one permit of its :class:`BoundedRedisCluster`."""

    async def execute(
        self, raise_on_error: bool = True, allow_redirections: bool = True
    ) -> list[Any]:
        client = cast("BoundedRedisCluster", self.cluster_client)
        async with client.permit():
            try:
                return await super().execute(raise_on_error, allow_redirections)
            except redis_errors.RedisClusterException as exc:
                outage = client.as_outage(exc)
                if outage is exc:
                    raise
                raise outage from exc


def cluster_client(
    options: dict[str, Any], *, commands_in_flight: int, pool_wait_s: float
) -> BoundedRedisCluster:
    """A :class:`BoundedRedisCluster` from single-node connection *options* (none opened yet).

    Args:
        options: as for a single-node connection pool: what ``parse_url`` returns for the URL
            (its host and port are the startup node) plus timeouts, client name and retry.
        commands_in_flight: see :class:`BoundedRedisCluster`.
        pool_wait_s: see :class:`BoundedRedisCluster`.

    Raises:
        ValueError: the options do not fit a cluster: a ``unix://`` URL, a database other than
            0, or a URL option the cluster client does not take.
    """
    if options.get("connection_class") is UnixDomainSocketConnection or "path" in options:
        raise ValueError("Redis Cluster needs a redis:// or rediss:// URL (not unix://)")
    if int(options.get("db") or 0) != 0:
        raise ValueError("Redis Cluster has only database 0 (the URL path must be /0 or empty)")
    cluster_options = {k: v for k, v in options.items() if k not in _NOT_FOR_CLUSTER}
    cluster_options.setdefault("host", "localhost")
    cluster_options.setdefault("port", 6379)
    if options.get("connection_class") is SSLConnection:
        cluster_options["ssl"] = True
    try:
        return BoundedRedisCluster(
            commands_in_flight=commands_in_flight, pool_wait_s=pool_wait_s, **cluster_options
        )
    except TypeError as exc:
        raise ValueError(f"a URL option is not supported with Redis Cluster: {exc}") from exc


class ClusterSubscriber:
    """The wake-up subscriber's connections in Redis Cluster: one node at a time, one connection.

    Stands in for the subscriber's client (:meth:`pubsub`, :meth:`aclose`). Each
    :meth:`pubsub` gets a pool of its own holding at most one connection, to the next node
    (round robin): first the startup node, then the nodes *cluster* has discovered. Closing the
    returned ``PubSub`` closes that connection, so at most one is open at a time as long as each
    is closed before the next is asked for (the subscriber does so).

    Args:
        cluster: the command client; only asked which nodes it knows.
        options: single-node connection options (host and port are the startup node's).
    """

    def __init__(self, cluster: RedisCluster, options: dict[str, Any]) -> None:
        self._cluster = cluster
        self._options = {k: v for k, v in options.items() if k not in ("host", "port", "db")}
        self._startup = (str(options.get("host", "localhost")), int(options.get("port", 6379)))
        self._attempts = 0
        self._pool: ConnectionPool | None = None
        #: ``(host, port)`` of the node of the latest subscription.
        self.node: tuple[str, int] | None = None

    def candidates(self) -> list[tuple[str, int]]:
        """Nodes to subscribe on, in the order they are tried: the startup node first."""
        nodes = [self._startup]
        for node in self._cluster.get_nodes():
            address = (str(node.host), int(node.port))
            if address not in nodes:
                nodes.append(address)
        return nodes

    def pubsub(self) -> PubSub:
        """A ``PubSub`` on the next node (its connection opens when it subscribes)."""
        nodes = self.candidates()
        self.node = nodes[self._attempts % len(nodes)]
        self._attempts += 1
        host, port = self.node
        self._pool = ConnectionPool(max_connections=1, host=host, port=port, **self._options)
        return Redis.from_pool(self._pool).pubsub()

    async def aclose(self) -> None:
        """Close the latest subscription's connection, if still open."""
        pool, self._pool = self._pool, None
        if pool is not None:
            with contextlib.suppress(redis_errors.RedisError, OSError):
                await pool.aclose()
