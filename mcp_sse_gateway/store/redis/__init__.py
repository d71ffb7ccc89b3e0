"""The Redis event store (DESIGN D7), one job per module.

* :mod:`.store`: :class:`RedisStore`, the ``EventStore`` implementation (construction, waiting,
  liveness, lifecycle), on :mod:`.sessions` (session records) and :mod:`.streams` (stream reads
  and writes).
* :mod:`.lua` and ``scripts/*.lua``: the atomic scripts every read and write runs.
* :mod:`.keys`: every key and channel name.
* :mod:`.connections`: connection budgets, timeouts, repeats.
* :mod:`.calls`: the call queue (priorities, bound), the stall timeout, outages.
* :mod:`.wakeups`: the Pub/Sub subscription fanned out to local waiters.
* :mod:`.liveness`: replica heartbeats and ending a dead owner's streams.
* :mod:`.leases`: standalone leases (holder, fencing epoch) and stream claims (DESIGN D5).
* :mod:`.offsets`: what this process appended, to detect lost events.
* :mod:`.cluster`: Redis Cluster: bounded commands in flight, the subscriber's node.
"""

from mcp_sse_gateway.config import DEFAULT_MAX_QUEUED_CALLS, DEFAULT_STALL_TIMEOUT_S
from mcp_sse_gateway.store.redis.connections import (
    CLIENT_NAME,
    CLUSTER_COMMAND_CONNECTIONS_PER_NODE,
    COMMAND_CONNECTIONS,
    CONNECT_TIMEOUT_S,
    MAX_CLUSTER_CONNECTIONS_PER_NODE,
    MAX_CONNECTIONS_PER_PROCESS,
    POOL_WAIT_S,
    SUBSCRIBER_CONNECTIONS,
    UNAVAILABLE_ERRORS,
)
from mcp_sse_gateway.store.redis.sessions import TOMBSTONE_TTL_S
from mcp_sse_gateway.store.redis.store import RedisStore
from mcp_sse_gateway.store.redis.streams import READ_MAX_BYTES

__all__ = [
    "CLIENT_NAME",
    "CLUSTER_COMMAND_CONNECTIONS_PER_NODE",
    "COMMAND_CONNECTIONS",
    "CONNECT_TIMEOUT_S",
    "DEFAULT_MAX_QUEUED_CALLS",
    "DEFAULT_STALL_TIMEOUT_S",
    "MAX_CLUSTER_CONNECTIONS_PER_NODE",
    "MAX_CONNECTIONS_PER_PROCESS",
    "POOL_WAIT_S",
    "READ_MAX_BYTES",
    "SUBSCRIBER_CONNECTIONS",
    "TOMBSTONE_TTL_S",
    "UNAVAILABLE_ERRORS",
    "RedisStore",
]
