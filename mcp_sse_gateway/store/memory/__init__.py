"""The in-memory event store: the embedded default, for one process only (DESIGN D7).

Every structure is bounded:

* session records expire after ``session_idle_ttl_s`` without use; at most ``max_sessions``;
* a stream keeps its newest ``max_events_per_stream`` events (older ones are trimmed: a cursor
  before them gets :class:`~mcp_sse_gateway.errors.CursorGone`);
* a session keeps at most ``max_streams_per_session`` streams (finished ones are evicted first);
* a finished stream stays replayable for ``finished_stream_ttl_s``;
* all stored event bytes stay under ``memory_max_bytes``: finished streams are evicted first,
  those read to their end first, then the one that finished first (whatever its session),
  then the oldest events of the stream being written are trimmed.

Hitting a bound logs a line (``store.*``; the byte cap at most one per 10 s) and never fails
silently.
Wake-ups cost one :class:`asyncio.Event` per stream, not one per waiting reader.

One job per module:

* :mod:`.store`: :class:`MemoryStore`, the ``EventStore`` implementation (construction, waiting,
  liveness, lifecycle), on :mod:`.sessions` and :mod:`.streams`.
* :mod:`.sessions`: session records and tombstones.
* :mod:`.leases`: standalone leases (local to the process) and stream claims (DESIGN D5).
* :mod:`.streams`: stream lives, their events, bounds, byte cap and wake-up events.
"""

from mcp_sse_gateway.store.memory.sessions import DEFAULT_MAX_SESSIONS, TOMBSTONE_TTL_S
from mcp_sse_gateway.store.memory.store import MemoryStore
from mcp_sse_gateway.store.memory.streams import EVENT_OVERHEAD_BYTES, SWEEP_INTERVAL_S

__all__ = [
    "DEFAULT_MAX_SESSIONS",
    "EVENT_OVERHEAD_BYTES",
    "SWEEP_INTERVAL_S",
    "TOMBSTONE_TTL_S",
    "MemoryStore",
]
