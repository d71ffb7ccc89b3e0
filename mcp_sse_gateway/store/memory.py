"""The in-memory event store: the embedded default, for one process only (DESIGN D7).

Every structure is bounded:

* session records expire after ``session_idle_ttl_s`` without use; at most ``max_sessions``;
* a stream keeps its newest ``max_events_per_stream`` events (older ones are trimmed: a cursor
  before them gets :class:`~mcp_sse_gateway.errors.CursorGone`);
* a session keeps at most ``max_streams_per_session`` streams (finished ones are evicted first);
* a finished stream stays replayable for ``finished_stream_ttl_s``;
* all stored event bytes stay under ``memory_max_bytes``: finished streams are evicted first,
  then the oldest events of the stream being written are trimmed.

Hitting a bound logs one line (``store.*``) and never fails silently.
Wake-ups cost one :class:`asyncio.Event` per stream, not one per waiting reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from mcp_sse_gateway.config import StoreSettings
from mcp_sse_gateway.errors import CursorGone, StoreLimitExceeded, UnknownStream
from mcp_sse_gateway.store.base import (
    ReadResult,
    SessionRecord,
    StoredEvent,
    StreamInfo,
    StreamKind,
    session_digest,
)

log = structlog.get_logger("mcp_sse_gateway.store")

#: Tombstones only need to outlive a client's reconnection attempts.
TOMBSTONE_TTL_S = 300.0
#: A record is ~200 bytes: 100k sessions stay well under the memory store's byte cap.
DEFAULT_MAX_SESSIONS = 100_000
#: Rough per-event overhead (object headers, deque slot) counted against the byte cap.
EVENT_OVERHEAD_BYTES = 120
#: Expired streams are swept at most this often, seconds: a sweep visits every stream.
SWEEP_INTERVAL_S = 1.0


def _event_bytes(data: str, event: str | None) -> int:
    """What one stored event counts against the byte cap: its UTF-8 size plus overhead."""
    size = len(data) if data.isascii() else len(data.encode("utf-8", "surrogatepass"))
    return size + len(event or "") + EVENT_OVERHEAD_BYTES


@dataclass(slots=True)
class _Stream:
    session_key: str
    life: str
    kind: StreamKind
    owner: str
    events: deque[StoredEvent] = field(default_factory=deque)
    first_offset: int = 1
    last_offset: int = 0
    finished: bool = False
    expires_at: float | None = None
    bytes: int = 0
    trimmed: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    waiters: int = 0
    #: Error datas for the requests still waiting for their response (see end_orphaned).
    pending: tuple[str, ...] = ()
    auth: str = ""
    creator: str = ""

    def info(self) -> StreamInfo:
        return StreamInfo(
            life=self.life,
            kind=self.kind,
            first_offset=self.first_offset,
            last_offset=self.last_offset,
            finished=self.finished,
            owner=self.owner,
            auth=self.auth,
        )

    def wake(self) -> None:
        # A new Event only when someone waits on the current one (this runs per append).
        if self.waiters:
            self.changed.set()
            self.changed = asyncio.Event()


class MemoryStore:
    """:class:`~mcp_sse_gateway.store.base.EventStore` held in this process's memory.

    Args:
        session_idle_ttl_s: a session expires this many seconds after its last use.
        max_sessions: bound on session records; the least recently used is evicted beyond it.
        max_events_per_stream: events kept per stream; older ones are trimmed.
        max_streams_per_session: streams kept per session.
        finished_stream_ttl_s: a finished stream is dropped this many seconds after finishing.
        max_bytes: cap on stored event bytes across all streams.
        heartbeat_expiry_s: a replica is alive this many seconds after its last heartbeat.
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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl_s = session_idle_ttl_s
        self._parked = 0
        self._max_sessions = max_sessions
        self._max_events = max_events_per_stream
        self._max_streams = max_streams_per_session
        self._finished_ttl_s = finished_stream_ttl_s
        self._max_bytes = max_bytes
        self._clock = clock
        self._sessions: OrderedDict[str, tuple[SessionRecord, float]] = OrderedDict()
        # session key -> life -> stream, insertion order = creation order.
        self._streams: dict[str, OrderedDict[str, _Stream]] = {}
        self._stream_touched: dict[str, float] = {}
        self._bytes = 0
        self._swept_at = float("-inf")
        self._heartbeat_expiry_s = heartbeat_expiry_s
        # replica id -> monotonic time its heartbeat expires.
        self._heartbeats: dict[str, float] = {}

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

    @property
    def stored_bytes(self) -> int:
        """Event bytes held now (data, event type and a fixed per-event overhead)."""
        return self._bytes

    # Sessions ---------------------------------------------------------------------------------

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

    async def drop_stream(self, session_id: str, life: str) -> None:
        """Forget one stream life. Idempotent."""
        streams = self._streams.get(session_digest(session_id))
        stream = streams.pop(life, None) if streams is not None else None
        if stream is not None:
            self._release(stream)

    async def purge_session(self, session_id: str) -> None:
        """Drop every stream of the session. Idempotent."""
        self._drop_session_streams(session_digest(session_id))

    def _drop_session_streams(self, key: str) -> None:
        for stream in self._streams.pop(key, {}).values():
            self._release(stream)
        self._stream_touched.pop(key, None)

    def _release(self, stream: _Stream) -> None:
        self._bytes -= stream.bytes
        stream.bytes = 0
        stream.events.clear()
        stream.wake()

    # Streams ----------------------------------------------------------------------------------

    def _sweep(self, now: float) -> None:
        """Drop finished streams past their grace period and streams of idle sessions.

        Runs at most every :data:`SWEEP_INTERVAL_S`; reads check expiry themselves meanwhile.
        """
        if now - self._swept_at < SWEEP_INTERVAL_S:
            return
        self._swept_at = now
        for key in list(self._streams):
            streams = self._streams[key]
            if now - self._stream_touched.get(key, now) > self._ttl_s:
                self._drop_session_streams(key)
                continue
            for life in [
                life
                for life, s in streams.items()
                if s.expires_at is not None and s.expires_at <= now
            ]:
                self._release(streams.pop(life))
            if not streams:
                del self._streams[key]
                self._stream_touched.pop(key, None)

    def _stream(self, session_id: str, life: str) -> _Stream:
        key = session_digest(session_id)
        now = self._clock()
        stream = self._streams.get(key, {}).get(life)
        if stream is None or (stream.expires_at is not None and stream.expires_at <= now):
            raise UnknownStream
        self._stream_touched[key] = now
        return stream

    async def create_stream(
        self,
        session_id: str,
        life: str,
        *,
        kind: StreamKind,
        owner: str,
        pending: Sequence[str] = (),
        start_after: int = 0,
        auth: str = "",
        creator: str = "",
    ) -> None:
        """Store a new stream life's metadata (before its priming event leaves).

        Raises:
            StoreLimitExceeded: the session already holds ``max_streams_per_session``
                unfinished streams (finished ones are evicted to make room first).
        """
        now = self._clock()
        self._sweep(now)
        key = session_digest(session_id)
        streams = self._streams.setdefault(key, OrderedDict())
        while len(streams) >= self._max_streams:
            oldest_finished = next(
                (
                    life
                    for life, s in streams.items()
                    if s.finished and (not creator or s.creator == creator)
                ),
                None,
            )
            if oldest_finished is None:
                log.warning("store.streams_per_session_limit", limit=self._max_streams)
                raise StoreLimitExceeded("too many open streams in this session")
            self._release(streams.pop(oldest_finished))
        streams[life] = _Stream(
            session_key=key,
            life=life,
            kind=kind,
            owner=owner,
            pending=tuple(pending),
            first_offset=start_after + 1,
            last_offset=start_after,
            auth=auth,
            creator=creator,
        )
        self._stream_touched[key] = now

    async def append(
        self,
        session_id: str,
        life: str,
        data: str,
        event: str | None,
        *,
        pending: Sequence[str] | None = None,
    ) -> int:
        """Append one event and wake its readers; returns its offset.

        With *pending*, the stream's pending error datas become *pending*.

        Raises:
            UnknownStream: the stream life does not exist (expired or purged).
        """
        return await self.append_many(session_id, life, [(data, event)], pending=pending)

    async def append_many(
        self,
        session_id: str,
        life: str,
        events: Sequence[tuple[str, str | None]],
        *,
        pending: Sequence[str] | None = None,
    ) -> int:
        """Append events in order (nothing else runs in between); returns the last offset.

        Raises:
            UnknownStream: the stream life does not exist (expired or purged).
        """
        if not events:
            raise ValueError("append_many needs at least one event")
        stream = self._stream(session_id, life)
        stored = stream.events
        offset = stream.last_offset
        size = 0
        for data, event in events:
            offset += 1
            stored.append(StoredEvent(offset, data, event))
            size += _event_bytes(data, event)
        stream.last_offset = offset
        if pending is not None:
            stream.pending = tuple(pending)
        stream.bytes += size
        self._bytes += size
        if len(stored) > self._max_events:
            while len(stored) > self._max_events:
                self._trim_oldest(stream)
            if not stream.trimmed:
                stream.trimmed = True
                log.warning("store.stream_trimmed", limit_events=self._max_events)
        if self._bytes > self._max_bytes:
            self._make_room(stream)
        stream.wake()
        return offset

    def _trim_oldest(self, stream: _Stream) -> None:
        dropped = stream.events.popleft()
        size = _event_bytes(dropped.data, dropped.event)
        stream.bytes -= size
        self._bytes -= size
        stream.first_offset = dropped.offset + 1

    def _make_room(self, writing: _Stream) -> None:
        """Keep the byte cap: evict finished streams (oldest first), then trim *writing*."""
        log.warning("store.memory_cap_reached", limit_bytes=self._max_bytes)
        for key in list(self._streams):
            streams = self._streams[key]
            for life in [life for life, s in streams.items() if s.finished]:
                self._release(streams.pop(life))
                if self._bytes <= self._max_bytes:
                    return
        while self._bytes > self._max_bytes and len(writing.events) > 1:
            self._trim_oldest(writing)

    async def finish(self, session_id: str, life: str) -> None:
        """Append the terminal marker; the stream stays replayable ``finished_stream_ttl_s``."""
        with contextlib.suppress(UnknownStream):
            stream = self._stream(session_id, life)
            if not stream.finished:
                stream.finished = True
                stream.expires_at = self._clock() + self._finished_ttl_s
                stream.wake()

    async def read(self, session_id: str, life: str, after: int, limit: int) -> ReadResult:
        """Events with offsets after *after*, oldest first, at most *limit*.

        Raises:
            UnknownStream: no such stream life under this session.
            CursorGone: the event at ``after + 1`` was trimmed.
        """
        stream = self._stream(session_id, life)
        if after + 1 < stream.first_offset or after > stream.last_offset:
            raise CursorGone
        start = after + 1 - stream.first_offset
        end = min(start + limit, len(stream.events))
        events = [stream.events[i] for i in range(start, end)]
        reached = events[-1].offset if events else after
        return ReadResult(events, stream.finished and reached >= stream.last_offset)

    async def wait(self, session_id: str, life: str, after: int, timeout_s: float) -> bool:
        """Wait until an event after *after* is stored, or the stream finished or was dropped.

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

    async def stream_info(self, session_id: str, life: str) -> StreamInfo | None:
        """The stream life's metadata, or None."""
        try:
            return self._stream(session_id, life).info()
        except UnknownStream:
            return None

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

    async def ping(self) -> None:
        """Always reachable."""

    async def close(self) -> None:
        """Drop everything and wake every reader. Idempotent."""
        for key in list(self._streams):
            self._drop_session_streams(key)
        self._sessions.clear()
