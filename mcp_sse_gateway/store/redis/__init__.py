"""The Redis event store (DESIGN D7), one job per module.

* :mod:`.store`: :class:`RedisStore`, the ``EventStore`` implementation: sessions and streams.
* :mod:`.lua` and ``scripts/*.lua``: the atomic scripts every read and write runs.
* :mod:`.keys`: every key and channel name.
* :mod:`.connections`: connection budgets, timeouts, repeats, outages.
* :mod:`.wakeups`: the Pub/Sub subscription fanned out to local waiters.
* :mod:`.liveness`: replica heartbeats and ending a dead owner's streams.
* :mod:`.offsets`: what this process appended, to detect lost events.
* :mod:`.cluster`: Redis Cluster: bounded commands in flight, the subscriber's node.
"""

from mcp_sse_gateway.store.redis.connections import (
    CLIENT_NAME,
    CLUSTER_COMMAND_CONNECTIONS_PER_NODE,
    COMMAND_CONNECTIONS,
    COMMAND_TIMEOUT_S,
    CONNECT_TIMEOUT_S,
    MAX_CLUSTER_CONNECTIONS_PER_NODE,
    MAX_CONNECTIONS_PER_PROCESS,
    POOL_WAIT_S,
    SUBSCRIBER_CONNECTIONS,
    UNAVAILABLE_ERRORS,
)
from mcp_sse_gateway.store.redis.store import TOMBSTONE_TTL_S, RedisStore
from mcp_sse_gateway.store.redis.streams import READ_MAX_BYTES

__all__ = [
    "CLIENT_NAME",
    "CLUSTER_COMMAND_CONNECTIONS_PER_NODE",
    "COMMAND_CONNECTIONS",
    "COMMAND_TIMEOUT_S",
    "CONNECT_TIMEOUT_S",
    "MAX_CLUSTER_CONNECTIONS_PER_NODE",
    "MAX_CONNECTIONS_PER_PROCESS",
    "POOL_WAIT_S",
    "READ_MAX_BYTES",
    "SUBSCRIBER_CONNECTIONS",
    "TOMBSTONE_TTL_S",
    "UNAVAILABLE_ERRORS",
    "RedisStore",
]
