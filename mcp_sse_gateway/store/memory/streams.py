"""Streams of the in-memory event store: events, their bounds and the byte cap (DESIGN D7).

:class:`MemoryStreams` holds every session's stream lives (:class:`Stream`): it appends, trims
(``max_events_per_stream``, then the byte cap), finishes, reads and sweeps them. Each stream
carries the :class:`asyncio.Event` its readers wait on (one per stream, not one per reader);
:class:`~mcp_sse_gateway.store.memory.store.MemoryStore` waits on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from mcp_sse_gateway.errors import CursorGone, StoreLimitExceeded, UnknownStream
from mcp_sse_gateway.store.base import (
    Lease,
    ReadResult,
    StoredEvent,
    StreamInfo,
    StreamKind,
    session_digest,
)

log = structlog.get_logger("mcp_sse_gateway.store")

#: Rough per-event overhead (object headers, deque slot) counted against the byte cap.
EVENT_OVERHEAD_BYTES = 120
#: Expired streams are swept at most this often, seconds: a sweep visits every stream.
SWEEP_INTERVAL_S = 1.0
#: While the byte cap keeps being reached, ``store.memory_cap_reached`` is logged at most this
#: often, seconds, with what was evicted and trimmed since the last line.
CAP_LOG_INTERVAL_S = 10.0


def event_bytes(data: str, event: str | None) -> int:
    """What one stored event counts against the byte cap: its UTF-8 size plus overhead."""
    size = len(data) if data.isascii() else len(data.encode("utf-8", "surrogatepass"))
    return size + len(event or "") + EVENT_OVERHEAD_BYTES


@dataclass(slots=True)
class Stream:
    """One stream life held in memory: its events, bounds, metadata and wake-up event."""

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
    trace: str = ""
    #: The newest connection that claimed the stream (DESIGN D5), ``""`` for none.
    reader: str = ""

    def info(self) -> StreamInfo:
        """The stream's metadata, as the store interface returns it."""
        return StreamInfo(
            life=self.life,
            kind=self.kind,
            first_offset=self.first_offset,
            last_offset=self.last_offset,
            finished=self.finished,
            owner=self.owner,
            auth=self.auth,
            trace=self.trace,
        )

    def wake(self) -> None:
        """Wake every reader waiting on the stream."""
        # A new Event only when someone waits on the current one (this runs per append).
        if self.waiters:
            self.changed.set()
            self.changed = asyncio.Event()


class MemoryStreams:
    """The stream operations of the in-memory event store.

    Args:
        session_idle_ttl_s: a session's streams are dropped this many seconds after its last use.
        max_events_per_stream: events kept per stream; older ones are trimmed.
        max_streams_per_session: streams kept per session.
        finished_stream_ttl_s: a finished stream is dropped this many seconds after finishing.
        max_bytes: cap on stored event bytes across all streams.
        clock: monotonic clock in seconds (tests inject their own).
    """

    def __init__(
        self,
        *,
        session_idle_ttl_s: float,
        max_events_per_stream: int,
        max_streams_per_session: int,
        finished_stream_ttl_s: float,
        max_bytes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl_s = session_idle_ttl_s
        self._max_events = max_events_per_stream
        self._max_streams = max_streams_per_session
        self._finished_ttl_s = finished_stream_ttl_s
        self._max_bytes = max_bytes
        self._clock = clock
        # session key -> life -> stream, insertion order = creation order.
        self._streams: dict[str, OrderedDict[str, Stream]] = {}
        # Every finished stream held, across sessions, in the byte cap's eviction order: those
        # read to their end first (in that order), then the others, oldest finish first (a
        # stream that just finished may still be read by its client, or not yet resumed).
        self._read_out: OrderedDict[tuple[str, str], Stream] = OrderedDict()
        self._finished: OrderedDict[tuple[str, str], Stream] = OrderedDict()
        # The byte cap's log line: when it was last written, and what was done since.
        self._cap_logged_at = float("-inf")
        self._cap_evicted = 0
        self._cap_trimmed = 0
        self._stream_touched: dict[str, float] = {}
        self._bytes = 0
        self._swept_at = float("-inf")

    @property
    def stored_bytes(self) -> int:
        """Event bytes held now (data, event type and a fixed per-event overhead)."""
        return self._bytes

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

    def _release(self, stream: Stream) -> None:
        """Forget *stream*'s events (the caller took it out of ``_streams``); wake its readers."""
        key = (stream.session_key, stream.life)
        if self._finished.get(key) is stream:
            del self._finished[key]
        elif self._read_out.get(key) is stream:
            del self._read_out[key]
        self._bytes -= stream.bytes
        stream.bytes = 0
        stream.events.clear()
        stream.wake()

    def _sweep(self, now: float) -> None:
        """Drop finished streams past their grace period and streams of idle sessions.

        Runs at most every :data:`SWEEP_INTERVAL_S`; reads check expiry themselves meanwhile.
        """
        if now - self._swept_at < SWEEP_INTERVAL_S:
            return
        self._swept_at = now
        self.log_cap(now)
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

    def _stream(self, session_id: str, life: str) -> Stream:
        key = session_digest(session_id)
        now = self._clock()
        streams = self._streams.get(key)
        stream = streams.get(life) if streams is not None else None
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
        trace: str = "",
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
        replaced = streams.pop(life, None)
        if replaced is not None:  # a life created again: its old events go first
            self._release(replaced)
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
        streams[life] = Stream(
            session_key=key,
            life=life,
            kind=kind,
            owner=owner,
            pending=tuple(pending),
            first_offset=start_after + 1,
            last_offset=start_after,
            auth=auth,
            creator=creator,
            trace=trace,
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
        lease: Lease | None = None,
        finish: bool = False,
    ) -> int:
        """Append events in order (nothing else runs in between); returns the last offset.

        With *lease*, fenced: refused unless it is still the session's. With *finish*, the
        stream is finished right after (as :meth:`finish`).

        Raises:
            UnknownStream: the stream life does not exist (expired or purged).
            LeaseLost: *lease* is no longer the session's (nothing is stored).
        """
        if not events:
            raise ValueError("append_many needs at least one event")
        if lease is not None:
            self._check_lease(session_id, lease)
        stream = self._stream(session_id, life)
        stored = stream.events
        offset = stream.last_offset
        size = 0
        new_tuple = tuple.__new__  # a StoredEvent without its __new__'s Python call
        for data, event in events:
            offset += 1
            stored.append(new_tuple(StoredEvent, (offset, data, event)))
            size += event_bytes(data, event)
        stream.last_offset = offset
        if pending is not None:
            stream.pending = tuple(pending)
        stream.bytes += size
        self._bytes += size
        if len(stored) > self._max_events:
            self._trim_to_bound(stream)
        if self._bytes > self._max_bytes:
            self._make_room(stream)
        elif self._cap_evicted or self._cap_trimmed:  # held back within the interval
            self.log_cap(self._clock())
        if finish:
            self._finish(stream)  # after the cap's evictions, as a finish of its own would be
        stream.wake()
        return offset

    def _check_lease(self, session_id: str, lease: Lease) -> None:
        """Refuse an append under *lease* unless it is the session's (see MemoryLeases)."""
        raise NotImplementedError

    def _trim_to_bound(self, stream: Stream) -> None:
        """Trim *stream* to ``max_events_per_stream`` (logged the first time)."""
        while len(stream.events) > self._max_events:
            self._trim_oldest(stream)
        if not stream.trimmed:
            stream.trimmed = True
            log.warning("store.stream_trimmed", limit_events=self._max_events)

    def _trim_oldest(self, stream: Stream) -> None:
        dropped = stream.events.popleft()
        size = event_bytes(dropped.data, dropped.event)
        stream.bytes -= size
        self._bytes -= size
        stream.first_offset = dropped.offset + 1

    def _make_room(self, writing: Stream) -> None:
        """Keep the byte cap: evict finished streams, then trim *writing*.

        Finished streams a read reached the end of go first, in that order; then the others,
        oldest finish first, whichever session holds them: one that finished a moment ago may
        still be delivered to a client reading behind its pump, or wait for a polling client's
        resume, and is the last one to go.
        """
        evicted = trimmed = 0
        for finished in (self._read_out, self._finished):
            while self._bytes > self._max_bytes and finished:
                (key, life), stream = finished.popitem(last=False)
                streams = self._streams.get(key)
                if streams is not None and streams.get(life) is stream:
                    del streams[life]
                self._release(stream)
                evicted += 1
        while self._bytes > self._max_bytes and len(writing.events) > 1:
            self._trim_oldest(writing)
            trimmed += 1
        self._cap_evicted += evicted
        self._cap_trimmed += trimmed
        self.log_cap(self._clock(), reached=True)

    def log_cap(self, now: float, *, reached: bool = False, force: bool = False) -> None:
        """Write ``store.memory_cap_reached`` if due: at most once per interval.

        A line is due when the cap was just *reached* or evictions and trims happened since the
        last line (written by the next append or sweep once the interval passed, or on close
        with *force*): what the cap did is reported at most :data:`CAP_LOG_INTERVAL_S` after
        the store's next use.
        """
        if not (reached or self._cap_evicted or self._cap_trimmed):
            return
        if not force and now - self._cap_logged_at < CAP_LOG_INTERVAL_S:
            return
        log.warning(
            "store.memory_cap_reached",
            limit_bytes=self._max_bytes,
            streams_evicted=self._cap_evicted,
            events_trimmed=self._cap_trimmed,
        )
        self._cap_logged_at = now
        self._cap_evicted = self._cap_trimmed = 0

    async def finish(self, session_id: str, life: str) -> None:
        """Append the terminal marker; the stream stays replayable ``finished_stream_ttl_s``."""
        with contextlib.suppress(UnknownStream):
            stream = self._stream(session_id, life)
            if not stream.finished:
                self._finish(stream)
                stream.wake()

    def _finish(self, stream: Stream) -> None:
        if not stream.finished:
            stream.finished = True
            stream.expires_at = self._clock() + self._finished_ttl_s
            self._finished[(stream.session_key, stream.life)] = stream
            # The session's streams: open ones in creation order, finished ones in the order
            # they finished (and expire), as the Redis store lists them; the oldest finished
            # one goes first at the session's bound (create_stream).
            streams = self._streams.get(stream.session_key)
            if streams is not None and streams.get(stream.life) is stream:
                streams.move_to_end(stream.life)

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
        # One walk from the nearer end of the deque (indexing it walks for every event).
        held = stream.events
        end = min(start + max(0, limit), len(held))
        if start > len(held) // 2:
            events = list(itertools.islice(reversed(held), len(held) - end, len(held) - start))
            events.reverse()
        else:
            events = list(itertools.islice(held, start, end))
        reached = events[-1].offset if events else after
        ended = stream.finished and reached >= stream.last_offset
        if ended:
            key = (stream.session_key, life)
            if self._finished.get(key) is stream:  # read out: the first to go under the cap
                del self._finished[key]
                self._read_out[key] = stream
        return ReadResult(events, ended, stream.reader)

    async def stream_info(self, session_id: str, life: str) -> StreamInfo | None:
        """The stream life's metadata, or None."""
        try:
            return self._stream(session_id, life).info()
        except UnknownStream:
            return None
