"""A request stream's newest events in this process's memory, beside the event store (D4, D7).

The pump of a request stream adds each batch of events to the stream's :class:`LocalFeed` right
after the store acknowledged it. A connection of the same process that keeps up with the stream
reads the feed instead of the store, and waits on the feed instead of on the store's wake-ups:
the live tail costs the store nothing. A connection further behind (a resume, a slow reader)
reads the store until it reaches the feed's window. Either way an event leaves only after it was
stored.

**The live end.** A reader that has caught up *parks* at the feed's end (:meth:`LocalFeed.park`)
with a callback that takes new events itself. The pump's :meth:`~LocalFeed.add_stored` then
hands the events it just stored to that callback, which writes them to the client at once when
the connection takes them without blocking; the reader's task is not woken (one loop turn and a
task switch less per event). When the callback declines (the client's buffer is full, the
connection is being replaced), the reader is woken as before and writes them itself.

**Outages.** When the pump cannot store an event (Redis unreachable), the connected client must
keep receiving, but the stream life can no longer be resumed: what follows is never stored. The
feed then switches to *lost* mode and receives every later event unstored; they are sent
**without** an event id. Per WHATWG HTML, server-sent events, an event without ``id`` leaves the
client's last event id unchanged, so a later resume names the last stored event, and the gateway
answers it with 400 (the stream life is dropped from the store once it is back): a gap is never
silent.

Positions: the event stored at offset *n* has position ``n - 1`` (request streams start at
offset 1); unstored events take the positions after the last stored one.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from typing import NamedTuple

#: A parked reader's callback: takes the events right after its position and returns True once
#: they are written (its position is then past them), or False to be woken for them instead.
Take = Callable[[Sequence["FeedEvent"]], bool]

#: Of the events its reader already passed, a feed keeps this many at most ...
RECENT_EVENTS = 256
#: ... and this many bytes of data (the oldest go first; at least one event is kept).
RECENT_BYTES = 256 * 1024
#: Events the reader has not reached yet are kept up to this many bytes of data; beyond it the
#: reader catches up from the store.
AHEAD_BYTES = 4 * 1024 * 1024
#: Default bound of a lost feed's unstored events (the reader is cut beyond it).
MAX_LOST_EVENTS = 100_000


_new_tuple = tuple.__new__


class FeedEvent(NamedTuple):
    """One event of a feed.

    Attributes:
        offset: its offset in the stream life, None when it was never stored (it is then sent
            without an id).
        data: the SSE data.
        event: the SSE event type, None for ``message``.
    """

    offset: int | None
    data: str
    event: str | None = None


class LocalFeed:
    """The newest events of one request stream, in order, bounded.

    Args:
        max_lost_events: in lost mode, events held at most (older ones are dropped, and a
            reader that still needed them is cut).
        on_news: called whenever the feed changes (events, lost mode, closed).
    """

    def __init__(
        self, *, max_lost_events: int = MAX_LOST_EVENTS, on_news: Callable[[], None] | None = None
    ) -> None:
        self._on_news = on_news
        self._events: deque[FeedEvent] = deque()
        self._first = 0  # position of _events[0]
        self._bytes = 0
        self._max_lost = max(1, max_lost_events)
        #: Futures of the readers waiting for news (resolved True by the next change).
        self._waiters: list[asyncio.Future[bool]] = []
        #: The store failed: events from now on are unstored.
        self.lost = False
        #: No event will follow (the pump ended).
        self.done = False
        #: The attached reader's position (events before it were delivered); see add_stored.
        self.reader_at = 0
        #: The reader parked at the end (see park): its waiter and its callback.
        self._parked: tuple[asyncio.Future[bool], Take] | None = None

    @property
    def end(self) -> int:
        """The position after the newest event."""
        return self._first + len(self._events)

    @property
    def parked(self) -> bool:
        """Whether a reader is parked at the end (see :meth:`park`)."""
        return self._parked is not None

    def add_stored(self, first_offset: int, events: Sequence[tuple[str, str | None]]) -> None:
        """Add events the store just acknowledged, offsets ``first_offset``, +1, …; wake.

        A reader parked at exactly ``first_offset - 1`` (see :meth:`park`) is handed the events
        first; if it takes them, it is not woken.
        """
        # Made as tuples directly: a named tuple's __new__ is a Python call (twice the time).
        added = [
            _new_tuple(FeedEvent, (first_offset + i, data, event))
            for i, (data, event) in enumerate(events)
        ]
        taken: asyncio.Future[bool] | None = None
        if first_offset - 1 != self.end:
            # Not contiguous (another writer, or offsets this feed never saw): start over.
            self._events.clear()
            self._first, self._bytes = first_offset - 1, 0
            self._events.extend(added)
        else:
            self._events.extend(added)
            parked = self._parked
            if parked is not None and self.reader_at == first_offset - 1 and _took(parked, added):
                taken = parked[0]
                self.reader_at = self.end
        for event in added:
            self._bytes += len(event.data)
        # Trim what the reader passed beyond the recent bounds, and anything beyond the hard one.
        while len(self._events) > 1 and (
            self._bytes > AHEAD_BYTES
            or (
                self._first < self.reader_at
                and (len(self._events) > RECENT_EVENTS or self._bytes > RECENT_BYTES)
            )
        ):
            self._bytes -= len(self._events.popleft().data)
            self._first += 1
        self._wake(taken)

    def lose(self) -> None:
        """The store failed: keep everything from now on (bounded), unstored."""
        self.lost = True
        self._wake()

    def push(self, data: str, event: str | None) -> None:
        """Add an event that was never stored (lost mode) and wake the reader.

        Bounded like stored events: what the reader passed is trimmed beyond the recent bounds
        (nothing resumes a lost stream), and unread events beyond ``max_lost_events`` or
        :data:`AHEAD_BYTES` go first (the reader that still needed them is cut).
        """
        self._events.append(FeedEvent(None, data, event))
        self._bytes += len(data)
        while len(self._events) > 1 and (
            len(self._events) > self._max_lost
            or self._bytes > AHEAD_BYTES
            or (
                self._first < self.reader_at
                and (len(self._events) > RECENT_EVENTS or self._bytes > RECENT_BYTES)
            )
        ):
            self._bytes -= len(self._events.popleft().data)
            self._first += 1
        self._wake()

    def close(self) -> None:
        """No event will follow. Idempotent."""
        self.done = True
        self._wake()

    def read(self, position: int, limit: int) -> list[FeedEvent] | None:
        """Up to *limit* events from *position* on.

        Returns:
            The events (empty when *position* is the end), or None when the feed no longer (or
            not yet) holds *position*: read the store instead.
        """
        start = position - self._first
        if start < 0 or start > len(self._events):
            return None
        self.reader_at = position
        stop = min(len(self._events), start + limit)
        return [self._events[i] for i in range(start, stop)]

    def waiter(self, position: int) -> asyncio.Future[bool] | None:
        """A future the next change of the feed resolves with True; None if there is no need.

        None when an event at *position* exists or the feed is closed already. The caller may
        resolve the future itself (a timeout, see :class:`~mcp_sse_gateway.streams.alarm.Alarm`)
        and must then :meth:`forget` it; a cancelled waiter is forgotten the same way.
        """
        if position < self.end or self.done:
            return None
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return waiter

    def forget(self, waiter: asyncio.Future[bool]) -> None:
        """Stop tracking *waiter* (one the feed did not resolve), and unpark it. Idempotent."""
        if waiter in self._waiters:
            self._waiters.remove(waiter)
        if self._parked is not None and self._parked[0] is waiter:
            self._parked = None

    def park(self, position: int, waiter: asyncio.Future[bool], take: Take) -> None:
        """Let *take* have the stored events that follow *position*, as they come.

        *position* is the reader's (it becomes :attr:`reader_at`), and *waiter* its, from
        :meth:`waiter` at that position. While it is parked, :meth:`add_stored` calls
        ``take(events)`` with each batch that follows the reader's position, synchronously, in
        the pump's task: True means written and past (the reader's position moves to the end,
        *waiter* stays pending), False leaves them to the reader, whose *waiter* is then
        resolved as usual. Unstored events (lost mode) and a feed that starts over always wake
        the reader. One reader is parked at a time; :meth:`forget` of its waiter unparks it.
        """
        self.reader_at = position
        self._parked = (waiter, take)

    async def wait(self, position: int, timeout_s: float) -> bool:
        """Wait until an event at *position* exists or the feed is closed; False on timeout."""
        waiter = self.waiter(position)
        if waiter is None:
            return True
        try:
            async with asyncio.timeout(timeout_s):
                return await waiter
        except TimeoutError:
            return False
        finally:
            self.forget(waiter)

    def _wake(self, taken: asyncio.Future[bool] | None = None) -> None:
        """Resolve every waiter but *taken* (a parked reader that took the news itself)."""
        waiters = self._waiters
        if waiters:
            if taken is None:
                self._waiters = []
            elif len(waiters) == 1 and waiters[0] is taken:
                waiters = []
            else:
                self._waiters = [taken] if taken in waiters else []
                waiters = [waiter for waiter in waiters if waiter is not taken]
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(True)
        if self._on_news is not None:
            self._on_news()


def _took(parked: tuple[asyncio.Future[bool], Take], events: Sequence[FeedEvent]) -> bool:
    """Whether the parked reader took *events*; a failing callback counts as declined.

    The callback runs in the pump's task: whatever it raises must not end the pump, and the
    reader, woken instead, meets the failure itself on its own write.
    """
    try:
        return parked[1](events)
    except Exception:  # noqa: BLE001 - a reader's bug, not the pump's: the reader is woken
        return False
