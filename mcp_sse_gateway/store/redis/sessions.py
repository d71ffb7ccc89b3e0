"""Session records of the Redis event store, and the session-wide drops (DESIGN D2, D3).

:class:`SessionStore` adds to :class:`~mcp_sse_gateway.store.redis.streams.StreamStore` the
session record (protocol version, tombstone flag, creator binding), served from this replica's
cache for about a second (:mod:`~mcp_sse_gateway.store.redis.local_cache`), and the drops of
every stream of a session (DELETE).
"""

from __future__ import annotations

from typing import Any

from mcp_sse_gateway.store.base import SessionRecord
from mcp_sse_gateway.store.redis.calls import NEW, RUNNING
from mcp_sse_gateway.store.redis.local_cache import SessionCache
from mcp_sse_gateway.store.redis.replies import text
from mcp_sse_gateway.store.redis.streams import ms
from mcp_sse_gateway.store.redis.tasks import TaskStore

#: Tombstones only need to outlive a client's reconnection attempts (as in the memory store).
TOMBSTONE_TTL_S = 300.0


class SessionStore(TaskStore):
    """The session operations of a Redis event store (and, inherited, its stream operations).

    Args:
        idle_ms: a session record's idle TTL, ms.
        session_cache_s: how long a record read is served from memory, seconds.
        **streams: :class:`~mcp_sse_gateway.store.redis.leases.LeaseStore`'s arguments (tasks
            add none).
    """

    def __init__(self, *args: Any, idle_ms: int, session_cache_s: float, **streams: Any) -> None:
        super().__init__(*args, **streams)
        self._idle_ms = idle_ms
        self._sessions = SessionCache(session_cache_s)

    async def record_session(
        self, session_id: str, protocol_version: str, *, auth: str = ""
    ) -> None:
        """Record (or refresh) a session's negotiated protocol version and creator binding.

        The record lives ``session_idle_ttl_s`` seconds from now (a tombstone is overwritten).

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        keys = self._keys(session_id)
        self._sessions.forget(keys.digest)
        await self._script(
            "record_session",
            RUNNING,
            keys,
            [keys.session],
            [protocol_version, self._idle_ms, auth],
        )
        self._sessions.put(SessionRecord(keys.digest, protocol_version, auth=auth))

    async def get_session(self, session_id: str, *, refresh: bool = True) -> SessionRecord | None:
        """The session's record, or None when there is none (never recorded, or expired).

        A record read in the last second on this replica is served without a round trip
        (:mod:`~mcp_sse_gateway.store.redis.local_cache`: a DELETE on another replica shows
        here within that second); absent records are always looked up.

        Args:
            session_id: the raw ``Mcp-Session-Id`` (only its digest reaches Redis).
            refresh: client traffic: a live, non-deleted record's idle TTL restarts, and so do
                the TTLs of the session's open streams (at most once a second per replica).

        Raises:
            StoreUnavailable: Redis cannot be reached.
            StoreBusy: the call queue is full (client traffic only: *refresh*).
        """
        keys = self._keys(session_id)
        cached = self._sessions.get(keys.digest, refresh=refresh)
        if cached is not None:
            return cached
        record = None
        self._sessions.start_read(keys.digest)
        try:
            # Client traffic is new work; a running stream's check of its session is not.
            found = await self._script(
                "get_session",
                NEW if refresh else RUNNING,
                keys,
                [keys.session],
                ["1" if refresh else "0", self._idle_ms],
            )
            if found is not None:
                record = SessionRecord(
                    keys.digest,
                    text(found[0]),
                    deleted=text(found[1]) == "1",
                    auth=text(found[2]) if len(found) > 2 else "",  # noqa: PLR2004 - {v, d, a}
                )
        finally:
            self._sessions.finish_read(keys.digest, record, refreshed=refresh)
        return record

    async def tombstone_session(self, session_id: str) -> None:
        """Mark the session deleted for :data:`TOMBSTONE_TTL_S` seconds and drop its streams.

        Waiters of the dropped streams are woken.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        keys = self._keys(session_id)
        self._sessions.forget(keys.digest)
        await self._script(
            "tombstone_session",
            RUNNING,
            keys,
            [keys.session],
            [ms(TOMBSTONE_TTL_S)],
        )
        self._written.forget(keys.digest)
        self._sessions.forget(keys.digest)

    async def purge_session(self, session_id: str) -> None:
        """Drop every stream of the session; waiters are woken. Idempotent.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        keys = self._keys(session_id)
        await self._script("purge_session", RUNNING, keys)
        self._written.forget(keys.digest)
