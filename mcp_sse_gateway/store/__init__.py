"""Event stores: one interface (``store.base.EventStore``), several backends."""

from mcp_sse_gateway.store.base import (
    EventStore,
    ReadResult,
    SessionRecord,
    StoredEvent,
    StreamInfo,
    session_digest,
)
from mcp_sse_gateway.store.memory import MemoryStore

__all__ = [
    "EventStore",
    "MemoryStore",
    "ReadResult",
    "SessionRecord",
    "StoredEvent",
    "StreamInfo",
    "session_digest",
]
