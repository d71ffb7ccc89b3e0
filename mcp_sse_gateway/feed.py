"""A stream's events kept in process memory while the event store is down (DESIGN D7).

When a pump cannot store an event (Redis unreachable), the connected client must keep
receiving, but the stream life can no longer be resumed: the events from then on are never
stored. The pump then moves the stream to a :class:`LocalFeed`: the last events it stored (so a
reader a little behind loses nothing) followed by every later event, sent **without** an event
id. Per WHATWG HTML, server-sent events, an event without ``id`` leaves the client's last event
id unchanged, so a later resume names the last stored event, and the gateway answers it with 400
(the stream life is dropped from the store once it is back): a gap is never silent.

A feed has one reader (the connection attached to the stream) and is bounded: a reader further
behind than ``max_events`` is cut and resumes (getting 503 or 400).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from mcp_sse_gateway.store.base import StoredEvent

#: Events a pump remembers after storing them, so a reader slightly behind can switch to the
#: feed without a gap (they are the feed's first events).
RECENT_EVENTS = 1024
#: Default bound of a feed, in events.
MAX_FEED_EVENTS = 100_000


@dataclass(frozen=True, slots=True)
class FeedEvent:
    """One event of a feed.

    Attributes:
        offset: its offset in the stream life when it was stored, None when it never was
            (then it is sent without an id).
        data: the SSE data.
        event: the SSE event type, None for ``message``.
    """

    offset: int | None
    data: str
    event: str | None = None


class LocalFeed:
    """The events of one stream life from the store's outage on, in order, bounded.

    Args:
        recent: the last events stored before the outage, oldest first.
        max_events: events held at most; older ones are dropped (their reader is cut).

    Positions are absolute indexes into the feed (0 is its first event ever), so a reader
    notices when the events it needs were dropped.
    """

    def __init__(self, recent: Iterable[StoredEvent], *, max_events: int = MAX_FEED_EVENTS) -> None:
        self._events: deque[FeedEvent] = deque(
            (FeedEvent(e.offset, e.data, e.event) for e in recent), maxlen=max(1, max_events)
        )
        self._base = 0
        self._appended = self._stored = len(self._events)
        self._first_stored = self._events[0].offset if self._events else None
        self._last_stored = self._events[-1].offset if self._events else None
        self._changed = asyncio.Event()
        self.done = False

    @property
    def end(self) -> int:
        """The position after the newest event."""
        return self._appended

    def push(self, data: str, event: str | None) -> None:
        """Add an event that was never stored (sent without id) and wake the reader."""
        if len(self._events) == self._events.maxlen:
            self._base += 1
        self._events.append(FeedEvent(None, data, event))
        self._appended += 1
        self._wake()

    def close(self) -> None:
        """No event will follow: the reader ends after the last one. Idempotent."""
        self.done = True
        self._wake()

    def position_after(self, cursor: int) -> int | None:
        """The position of the first event after the stored offset *cursor*.

        Returns:
            None when the feed does not hold the event right after *cursor* (the reader is
            further behind than the pump remembered): it cannot continue without a gap.
        """
        if self._last_stored is None or cursor >= self._last_stored:
            return self._stored
        if cursor + 1 >= self._first_stored:  # type: ignore[operator]
            return cursor + 1 - self._first_stored  # type: ignore[operator]
        return None

    def read(self, position: int, limit: int) -> list[FeedEvent] | None:
        """Up to *limit* events from *position* on; None when they were dropped (bound)."""
        if position < self._base:
            return None
        start = position - self._base
        return [self._events[i] for i in range(start, min(len(self._events), start + limit))]

    async def wait(self, position: int, timeout_s: float) -> bool:
        """Wait until an event at *position* exists or the feed is closed; False on timeout."""
        if position < self._appended or self.done:
            return True
        try:
            async with asyncio.timeout(timeout_s):
                await self._changed.wait()
        except TimeoutError:
            return False
        return True

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
