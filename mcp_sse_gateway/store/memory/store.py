"""The in-memory event store itself: construction, waiting, liveness, lifecycle (DESIGN D7).

:class:`MemoryStore` is the :class:`~mcp_sse_gateway.store.base.EventStore` implementation, on
:class:`~mcp_sse_gateway.store.memory.sessions.MemorySessions` (session records) and
:class:`~mcp_sse_gateway.store.memory.streams.MemoryStreams` (stream reads and writes). Its
readers wait on their stream's :class:`asyncio.Event`; replica heartbeats are kept per replica.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from mcp_sse_gateway.config import StoreSettings
from mcp_sse_gateway.errors import UnknownStream
from mcp_sse_gateway.store.memory.sessions import DEFAULT_MAX_SESSIONS, MemorySessions
from mcp_sse_gateway.store.memory.tasks import DEFAULT_MAX_TASKS, MemoryTasks


class MemoryStore(MemorySessions):
    """:class:`~mcp_sse_gateway.store.base.EventStore` held in this process's memory.

    Args:
        session_idle_ttl_s: a session expires this many seconds after its last use.
        max_sessions: bound on session records; the least recently used is evicted beyond it.
        max_events_per_stream: events kept per stream; older ones are trimmed.
        max_streams_per_session: streams kept per session.
        finished_stream_ttl_s: a finished stream is dropped this many seconds after finishing.
        max_bytes: cap on stored event bytes across all streams.
        heartbeat_expiry_s: a replica is alive this many seconds after its last heartbeat.
        max_tasks: task records kept at most (DESIGN D11).
        clock: monotonic clock in seconds (tests inject their own).
    """

    def __init__(
        self,
        *,
        session_idle_ttl_s: float = 3600.0,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        max_events_per_stream: int = 10_000,
        max_streams_per_session: int = 100,
        finished_stream_ttl_s: float = 300.0,
        max_bytes: int = 256 * 1024 * 1024,
        heartbeat_expiry_s: float = 15.0,
        max_tasks: int = DEFAULT_MAX_TASKS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            max_sessions=max_sessions,
            session_idle_ttl_s=session_idle_ttl_s,
            max_events_per_stream=max_events_per_stream,
            max_streams_per_session=max_streams_per_session,
            finished_stream_ttl_s=finished_stream_ttl_s,
            max_bytes=max_bytes,
            clock=clock,
        )
        self._parked = 0
        self._heartbeat_expiry_s = heartbeat_expiry_s
        # replica id -> monotonic time its heartbeat expires.
        self._heartbeats: dict[str, float] = {}
        self._tasks = MemoryTasks(clock, max_tasks)

    @classmethod
    def from_settings(cls, settings: StoreSettings) -> MemoryStore:
        """A store bounded as ``[store]`` says."""
        return cls(
            session_idle_ttl_s=settings.session_idle_ttl_s,
            max_events_per_stream=settings.max_events_per_stream,
            max_streams_per_session=settings.max_streams_per_session,
            finished_stream_ttl_s=settings.finished_stream_ttl_s,
            max_bytes=settings.memory_max_bytes,
            heartbeat_expiry_s=settings.heartbeat_expiry_s,
        )

    async def wait(
        self, session_id: str, life: str, after: int, timeout_s: float, *, reader: str | None = None
    ) -> bool:
        """Wait until an event after *after* is stored, the stream finished, dropped or claimed.

        With *reader*, a stream claimed by another reader already is news at once.

        Returns:
            True when woken by one of those, False when *timeout_s* seconds passed first.
            Safe to cancel.
        """
        try:
            stream = self._stream(session_id, life)
        except UnknownStream:
            return True
        if stream.last_offset > after or stream.finished:
            return True
        if reader is not None and stream.reader not in {"", reader}:
            return True
        stream.waiters += 1
        self._parked += 1
        try:
            async with asyncio.timeout(timeout_s):
                await stream.changed.wait()
        except TimeoutError:
            return False
        finally:
            stream.waiters -= 1
            self._parked -= 1
        return True

    @property
    def parked(self) -> int:
        """Calls of :meth:`wait` waiting for a change of their stream (in this process)."""
        return self._parked

    # Liveness (DESIGN D7) ---------------------------------------------------------------------

    async def heartbeat(self, replica_id: str) -> None:
        """Mark *replica_id* alive for ``heartbeat_expiry_s`` seconds (one entry per replica)."""
        now = self._clock()
        for replica in [r for r, expires_at in self._heartbeats.items() if expires_at <= now]:
            del self._heartbeats[replica]
        self._heartbeats[replica_id] = now + self._heartbeat_expiry_s

    async def replica_alive(self, replica_id: str) -> bool:
        """Whether *replica_id* sent a heartbeat within ``heartbeat_expiry_s`` seconds."""
        return self._heartbeats.get(replica_id, float("-inf")) > self._clock()

    async def end_orphaned(
        self, session_id: str, life: str, error_datas: Sequence[str] | None = None
    ) -> bool:
        """End a stream whose owner replica is dead: errors, then the terminal marker, once.

        *error_datas* None appends the stream's pending ones (from create_stream/append).

        Returns:
            True only for the caller that ended it; False when the stream does not exist, is
            finished, or its owner is alive.
        """
        try:
            stream = self._stream(session_id, life)
        except UnknownStream:
            return False
        if stream.finished or await self.replica_alive(stream.owner):
            return False
        # Nothing below suspends (these coroutines never await), so no other caller can run
        # between the check above and the marker: the compare-and-set is atomic.
        for data in stream.pending if error_datas is None else error_datas:
            await self.append(session_id, life, data, None)
        await self.finish(session_id, life)
        return True

    # Tasks (DESIGN D11) ------------------------------------------------------------------------

    async def get_task(self, task_id: str) -> tuple[int, str] | None:
        """A task's version and record (JSON text), or None when unknown or expired."""
        return self._tasks.get(task_id)

    async def put_task(self, task_id: str, record: str, *, version: int, ttl_ms: int) -> bool:
        """Write a task's record if it is still at *version* (0: create it, TTL *ttl_ms*).

        Raises:
            StoreLimitExceeded: a creation while ``max_tasks`` live records are kept.
        """
        return self._tasks.put(task_id, record, version=version, ttl_ms=ttl_ms)

    async def ping(self) -> None:
        """Always reachable."""

    async def close(self) -> None:
        """Drop everything and wake every reader. Idempotent."""
        self.log_cap(self._clock(), force=True)
        for key in list(self._streams):
            self._drop_session_streams(key)
        self._sessions.clear()
        self._tasks.clear()
