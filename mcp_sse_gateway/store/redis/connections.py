"""Connections of the Redis event store: budgets, timeouts, repeats, and outages (DESIGN D7).

**At most 10 connections per process whatever the number of waiting clients**
(:data:`MAX_CONNECTIONS_PER_PROCESS`): a blocking pool of :data:`COMMAND_CONNECTIONS` (8) for
commands (a burst queues for a connection in :mod:`~mcp_sse_gateway.store.redis.calls`), the
one connection of the wake-up subscriber (:mod:`~mcp_sse_gateway.store.redis.wakeups`), and the
lane of paced streams' lone appends (:class:`~mcp_sse_gateway.store.redis.lane.Lane`). In
Redis Cluster the bound is **per node** (:data:`MAX_CLUSTER_CONNECTIONS_PER_NODE`): 8 command
connections per node, at most 8 commands in flight across the cluster, plus the subscriber's
one connection on the node it listens on (:mod:`~mcp_sse_gateway.store.redis.cluster`).

Repeats are redis-py's own (:class:`redis.asyncio.retry.Retry`): a command whose connection
turned out to be dead is sent once more, at once, on a new connection. redis-py finds a pooled
connection dead only by using it, so after a Redis restart or failover each one fails once.
Every store call is safe to repeat: its script is idempotent or carries a token that recognises
an applied first attempt. Only ``ConnectionError`` is repeated: an unreachable Redis whose
connect times out fails after :data:`CONNECT_TIMEOUT_S`, not twice that. In Redis Cluster the
cluster client repeats once after ``ConnectionError``, ``TimeoutError`` or ``CLUSTERDOWN``, with
the topology discovered again.

How calls wait for these connections, and when a late answer counts as an outage:
:mod:`~mcp_sse_gateway.store.redis.calls`.

URLs: ``redis://[user:password@]host:port/db``, ``rediss://…`` (TLS; a private CA is given as
``?ssl_ca_certs=/path/ca.pem``, client certificates as ``ssl_certfile``/``ssl_keyfile``) or
``unix:///path/redis.sock``. A ``max_connections`` in the URL is ignored: the bound above holds.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff

from mcp_sse_gateway.config import redact_url
from mcp_sse_gateway.store.redis.cluster import ClusterSubscriber, cluster_client
from mcp_sse_gateway.store.redis.wakeups import (
    SUBSCRIBER_BACKOFF_S,
    SUBSCRIBER_PING_S,
    SUBSCRIBER_REPEATS,
)

#: Command connections per process (a blocking pool: a burst queues instead of connecting more).
COMMAND_CONNECTIONS = 8
#: The Pub/Sub connection of the wake-up subscriber.
SUBSCRIBER_CONNECTIONS = 1
#: The connection of paced streams' lone appends (not in Redis Cluster).
LANE_CONNECTIONS = 1
#: The most connections one store opens to Redis, whatever the number of waiting clients.
MAX_CONNECTIONS_PER_PROCESS = COMMAND_CONNECTIONS + SUBSCRIBER_CONNECTIONS + LANE_CONNECTIONS
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
#: Times redis-py sends a command again, at once, after its connection failed.
COMMAND_REPEATS = 1
#: Name of this store's connections in ``CLIENT LIST``.
CLIENT_NAME = "mcp-sse-gateway"

#: redis-py errors meaning "Redis cannot serve this now" (connection, timeout, failover,
#: loading, out of memory; in Redis Cluster also a cluster that is down or redirects without
#: end: ``ClusterError``, covering ``ClusterDownError`` and an exhausted ``MOVED``/``ASK`` chain),
#: mapped to StoreUnavailable. A failed topology discovery arrives as ``ConnectionError``
#: (:class:`~mcp_sse_gateway.store.redis.cluster.BoundedRedisCluster`).
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


@dataclass(frozen=True, slots=True)
class Clients:
    """The connections of one store (none opened yet).

    Attributes:
        commands: the command client, bounded as the module says.
        subscriber: provides the wake-up subscriber's one connection (a plain client on its own
            one-connection pool; in Redis Cluster a
            :class:`~mcp_sse_gateway.store.redis.cluster.ClusterSubscriber`).
        url_for_logs: the URL with its secrets redacted.
    """

    commands: Redis | RedisCluster
    subscriber: Redis | ClusterSubscriber
    url_for_logs: str


def command_retry() -> Retry:
    """redis-py's repeat of a command: :data:`COMMAND_REPEATS` times, at once, on a new connection.

    Only after ``ConnectionError`` (see the module docstring). For a client built elsewhere:
    ``retry=command_retry()``.
    """
    return Retry(NoBackoff(), COMMAND_REPEATS, supported_errors=(redis_errors.ConnectionError,))


def connection_options(url: str) -> dict[str, Any]:
    """redis-py connection options for *url*: its own, plus the timeouts and repeats above.

    Raises:
        ValueError: the URL is malformed or of another scheme.
    """
    options: dict[str, Any] = {
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        # Calls are bounded by the store (calls.py) with asyncio.timeout: on Python 3.11 the
        # socket_timeout's write path (asyncio.wait_for) can swallow a cancellation.
        "socket_timeout": None,
        "socket_keepalive": True,
        "client_name": CLIENT_NAME,
        "retry": command_retry(),
    }
    url_options = dict(parse_url(url))
    for bound_here in ("max_connections", "timeout", "socket_timeout"):
        url_options.pop(bound_here, None)
    if "path" in url_options:
        del options["socket_keepalive"]  # a unix socket (``unix://``) has no TCP keepalive
    options.update(url_options)
    return options


def subscriber_options(options: dict[str, Any]) -> dict[str, Any]:
    """*options* for the wake-up subscriber: redis-py's health check, reconnects with backoff.

    See :mod:`~mcp_sse_gateway.store.redis.wakeups`.
    """
    first_s, cap_s = SUBSCRIBER_BACKOFF_S
    return {
        **options,
        "health_check_interval": SUBSCRIBER_PING_S,
        "retry": Retry(
            ExponentialWithJitterBackoff(cap=cap_s, base=first_s),
            SUBSCRIBER_REPEATS,
            supported_errors=(redis_errors.ConnectionError, redis_errors.TimeoutError),
        ),
    }


def open_clients(url: str, *, cluster: bool = False) -> Clients:
    """The bounded command client and the subscriber's client for the Redis at *url*.

    Args:
        url: see the module docstring; with *cluster*, ``redis://`` or ``rediss://`` of one node.
        cluster: *url* names a node of a Redis Cluster.

    Raises:
        ValueError: the URL is malformed or of another scheme (with *cluster*: a ``unix://``
            URL or a database other than 0).
    """
    options = connection_options(url)
    if cluster:
        commands = cluster_client(
            options,
            commands_in_flight=CLUSTER_COMMAND_CONNECTIONS_PER_NODE,
            pool_wait_s=POOL_WAIT_S,
        )
        subscriber = ClusterSubscriber(commands, subscriber_options(options))
        return Clients(commands, subscriber, redact_url(url))
    pool = BlockingConnectionPool(
        max_connections=COMMAND_CONNECTIONS, timeout=POOL_WAIT_S, **options
    )
    wakeups = ConnectionPool(max_connections=SUBSCRIBER_CONNECTIONS, **subscriber_options(options))
    return Clients(Redis.from_pool(pool), Redis.from_pool(wakeups), redact_url(url))


async def close_clients(clients: Clients) -> None:
    """Release both clients' connections (each once, when they are the same); never raises."""
    for client in {id(c): c for c in (clients.commands, clients.subscriber)}.values():
        with contextlib.suppress(*UNAVAILABLE_ERRORS):
            await client.aclose()
