"""Session records and tombstones of the in-memory event store (DESIGN D7).

:class:`MemorySessions` adds to :class:`~mcp_sse_gateway.store.memory.streams.MemoryStreams`
the session records (protocol version, tombstone flag, creator binding): at most
``max_sessions``, the least recently used evicted first, each expiring ``session_idle_ttl_s``
after its last use (a tombstone after :data:`TOMBSTONE_TTL_S`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from mcp_sse_gateway.store.base import SessionRecord, session_digest
from mcp_sse_gateway.store.memory.leases import MemoryLeases

#: Tombstones only need to outlive a client's reconnection attempts.
TOMBSTONE_TTL_S = 300.0
#: A record is ~200 bytes: 100k sessions stay well under the memory store's byte cap.
DEFAULT_MAX_SESSIONS = 100_000


class MemorySessions(MemoryLeases):
    """The session operations of the in-memory event store (and, inherited, its streams').

    Args:
        max_sessions: bound on session records; the least recently used is evicted beyond it.
        **streams: :class:`~mcp_sse_gateway.store.memory.leases.MemoryLeases`'s arguments.
    """

    def __init__(self, *, max_sessions: int = DEFAULT_MAX_SESSIONS, **streams: Any) -> None:
        super().__init__(**streams)
        self._max_sessions = max_sessions
        self._sessions: OrderedDict[str, tuple[SessionRecord, float]] = OrderedDict()

    def _put(self, record: SessionRecord, ttl_s: float) -> None:
        self._sessions[record.key] = (record, self._clock() + ttl_s)
        self._sessions.move_to_end(record.key)
        while len(self._sessions) > self._max_sessions:
            # Only the record goes: its streams live on under their own bounds (idle TTL,
            # finished grace), so evicting a record never cuts a running tool call.
            self._sessions.popitem(last=False)

    async def record_session(
        self, session_id: str, protocol_version: str, *, auth: str = ""
    ) -> None:
        """Record (or refresh) a session's negotiated protocol version and creator binding."""
        self._put(
            SessionRecord(session_digest(session_id), protocol_version, auth=auth), self._ttl_s
        )

    async def get_session(self, session_id: str, *, refresh: bool = True) -> SessionRecord | None:
        """The session's record, or None; with *refresh*, a live record's idle TTL restarts."""
        key = session_digest(session_id)
        entry = self._sessions.get(key)
        if entry is None:
            return None
        record, expires_at = entry
        if expires_at <= self._clock():
            del self._sessions[key]
            self._drop_session_streams(key)
            return None
        if refresh and not record.deleted:
            self._put(record, self._ttl_s)
        return record

    async def tombstone_session(self, session_id: str) -> None:
        """Mark the session deleted for :data:`TOMBSTONE_TTL_S` seconds and drop its streams."""
        key = session_digest(session_id)
        entry = self._sessions.get(key)
        version = entry[0].protocol_version if entry else ""
        self._put(SessionRecord(key, version, deleted=True), TOMBSTONE_TTL_S)
        self._drop_session_streams(key)
