"""One stream life as this process sees it: its local feed, its attached reader, its phase.

A :class:`StreamLife` exists while this process pumps the stream (it then holds the pump's
:class:`~mcp_sse_gateway.streams.feed.LocalFeed`) or a client connection of this process reads
it (it then holds that connection's :class:`Attachment`), and is forgotten when neither is true
(:class:`~mcp_sse_gateway.streams.registry.Registry`). Its phases::

    created ──► live ──► finished            the pump appended the terminal marker
                  │
                  └────► lost ──► retired    the store failed mid-stream: the feed carries the
                                             connected client on, the life is dropped from the
                                             store (resumes get 400), then the feed goes

A life this process only reads (another replica pumps it, or the pump already ended) stays
``created``: it has no feed, and its reader follows the store alone.

News, for the reader: events in the feed, the feed appearing, switching to lost mode or
closing; :meth:`StreamLife.wait_news` waits for any of them (a reader waiting out a store
outage). A reader caught up with the stream waits on the feed when it can serve it, else on the
store's wake-ups (:mod:`mcp_sse_gateway.streams.delivery`).
"""

from __future__ import annotations

import asyncio
import enum

from mcp_sse_gateway.streams.feed import LocalFeed

#: Reasons an attachment ends before its stream does; sent as the cancel message.
SUPERSEDED = "superseded"
DRAINING = "draining"


class Phase(enum.StrEnum):
    """Where a stream life is, as this process sees it (see the module docstring)."""

    CREATED = "created"
    LIVE = "live"
    FINISHED = "finished"
    LOST = "lost"
    RETIRED = "retired"


#: The phases of a life the store lost events of: never resumed, whatever the store says.
LOST_PHASES = frozenset({Phase.LOST, Phase.RETIRED})


class Attachment:
    """One client connection reading one stream; ends when another connection replaces it.

    Attributes:
        key: ``(session digest, stream life)``.
        reason: why it was told to stop (:data:`SUPERSEDED`, :data:`DRAINING`), else None.
    """

    def __init__(self, key: tuple[str, str], task: asyncio.Task[object] | None) -> None:
        self.key = key
        self.reason: str | None = None
        self._task = task

    def stop(self, reason: str) -> None:
        """Ask the connection to end: its task gets a CancelledError carrying *reason*."""
        if self.reason is None:
            self.reason = reason
            if self._task is not None and not self._task.done():
                self._task.cancel(reason)


class StreamLife:
    """One stream life in this process: its pump's feed and its one attached reader.

    Args:
        key: ``(session digest, stream life)``.
        session_id: the session (kept for store calls, never logged).
        life: the stream life id.
    """

    def __init__(self, key: tuple[str, str], session_id: str, life: str) -> None:
        self.key = key
        self.session_id = session_id
        self.life = life
        self.phase = Phase.CREATED
        self.feed: LocalFeed | None = None
        #: The feed of a pump that ended normally (every event stored): a connection behind
        #: the pump reads the rest from it rather than the store (see Delivery). Kept while
        #: the life is, which is while a reader is attached, or by whoever holds the life.
        self.ended_feed: LocalFeed | None = None
        self.reader: Attachment | None = None
        self._news: asyncio.Event | None = None
        #: Counts news (see :meth:`wait_news`).
        self.news = 0

    # The pump's side ------------------------------------------------------------------------

    def start_feed(self, *, max_lost_events: int) -> LocalFeed:
        """This process pumps the stream from now on: its feed (phase ``live``)."""
        self.feed = LocalFeed(max_lost_events=max_lost_events, on_news=self._wake)
        self.phase = Phase.LIVE
        self._wake()
        return self.feed

    def pump_ended(self) -> None:
        """The pump is done: ``finished``, unless the life was lost (it is retired then)."""
        if self.phase is Phase.LIVE:
            self.phase = Phase.FINISHED
            self.ended_feed, self.feed = self.feed, None
        self._wake()

    def lose(self) -> None:
        """The store failed mid-stream: the feed goes on alone, in lost mode (phase ``lost``)."""
        if self.feed is not None:
            self.feed.lose()
        self.phase = Phase.LOST
        self._wake()

    def retire(self) -> None:
        """The lost life was dropped from the store and its feed drained: forget the feed."""
        self.phase = Phase.RETIRED
        self.feed = None
        self._wake()

    # The reader's side ----------------------------------------------------------------------

    def attach(self) -> Attachment:
        """Record the current task as this life's reader, replacing (stopping) the older one."""
        task = asyncio.current_task()
        attachment = Attachment(self.key, task)
        older, self.reader = self.reader, attachment
        if older is not None:
            older.stop(SUPERSEDED)
        return attachment

    def detach(self, attachment: Attachment) -> None:
        """Forget *attachment* unless a newer one already replaced it."""
        if self.reader is attachment:
            self.reader = None

    @property
    def idle(self) -> bool:
        """Nothing of this process holds the life any more: neither a feed nor a reader."""
        return self.feed is None and self.reader is None

    async def wait_news(self, timeout_s: float, *, since: int | None = None) -> bool:
        """Wait until the feed appears, gets events, switches to lost mode or closes.

        With *since* (a value of :attr:`news` read earlier), news that came after it returns
        at once: nothing is missed between a check and the wait.

        Returns:
            False on timeout.
        """
        if since is not None and since != self.news:
            return True
        if self._news is None:
            self._news = asyncio.Event()
        news = self._news
        try:
            async with asyncio.timeout(max(timeout_s, 0.0)):
                await news.wait()
        except TimeoutError:
            return False
        return True

    def _wake(self) -> None:
        self.news += 1
        news, self._news = self._news, None
        if news is not None:
            news.set()
