"""Deliver one managed stream to one client connection (DESIGN D4, D6), as a state machine.

One cursor serves replay and live tail: the connection reads the stream after its cursor in
bounded batches (from the store, or from this process's local feed once it has caught up with
the pump), writes the events with the gateway's ids to a :class:`ClientSink`, and waits for news
when it has caught up. Nothing is sent twice and nothing is skipped at the switch, because there
is no switch. The connection:

* opens with a priming event (``id`` + ``retry`` + empty ``data``) on sessions of the primed era;
* sends ``: keepalive`` comments when idle for ``sse.keepalive_s``;
* closes after the terminal marker, or on purpose after ``sse.poll_after_ms`` (polling), after
  ``store.replay_max_passes`` full replay batches that never caught up, when a newer connection
  replaces it, or on drain: always after a ``retry`` field where the era allows one;
* is cut, without stalling anyone, when a write blocks for ``sse.slow_reader_cut_s`` (the sink
  raises :class:`~mcp_sse_gateway.errors.SlowReader`; a slow reader resumes from the store).

When the store becomes unreachable (D7, outages), the connection waits for it (sending
keepalives) or, once this process's pump moved the stream to lost mode, goes on from the local
feed: events stored before the outage keep their ids, later ones are sent without. On a resumed
stream whose owner replica stopped beating, ``check_owner`` ends the stream with the owner's
pending errors, so the client gets an error rather than a hang.

Each turn of :meth:`Delivery.run` is one step: **feed** (this process pumps the stream and
holds the cursor in memory), **store** (a bounded read after the cursor), **idle** (caught up:
wait for news, keepalive, owner check) or **outage** (wait for the store or the feed). A step
either goes on, or ends the connection with a reason.

Sources: WHATWG HTML, server-sent events; MCP 2025-11-25 transports, "Resumability and
Redelivery", SEP-1699.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import structlog

from mcp_sse_gateway.config import Settings
from mcp_sse_gateway.errors import (
    ClientGone,
    SlowReader,
    SSEError,
    StoreError,
    StoreUnavailable,
    StreamError,
    UnknownStream,
)
from mcp_sse_gateway.event_ids import event_id, priming_id
from mcp_sse_gateway.metrics import Metrics
from mcp_sse_gateway.sse import encode_comment, encode_priming, format_event, format_head
from mcp_sse_gateway.store.base import EventStore, ReadResult, StoredEvent
from mcp_sse_gateway.streams.alarm import SLACK_S, Alarm
from mcp_sse_gateway.streams.cursor import Delivered, DeliveryCursor
from mcp_sse_gateway.streams.feed import FeedEvent, LocalFeed
from mcp_sse_gateway.streams.life import LOST_PHASES, StreamLife
from mcp_sse_gateway.streams.reader import StoreReader
from mcp_sse_gateway.streams.registry import Registry
from mcp_sse_gateway.streams.sink import ClientSink, close_with_retry

log = structlog.get_logger("mcp_sse_gateway.delivery")

KEEPALIVE = encode_comment("keepalive")
#: Events are written in pieces of about this size: a slow reader is one whose single write of
#: at most this much stays blocked for ``slow_reader_cut_s`` (no progress), not one that needs
#: longer than that for a whole replay batch. Counted in characters (UTF-8 may be up to 4 times
#: as many bytes).
WRITE_CHUNK_BYTES = 256 * 1024
#: Event types whose block head a delivery keeps formatted, at most (others are formatted per
#: event: an upstream may make up a new type per event).
MAX_HEADS = 16
#: While the store is down, try it again this often, seconds (news of the feed wakes at once).
OUTAGE_STORE_CHECK_S = 1.0

#: A step that goes on (the next turn of the loop).
_AGAIN: Final = None
#: A step that found nothing for it to do: go to the store.
_TO_STORE: Final = ""


class Delivery:
    """The state machine of one connection: steps until a reason to end (module docstring).

    Args:
        sink: where to write.
        store: the event store holding the stream.
        stream: the stream life in this process (its feed, if this process pumps it).
        settings: ``sse`` and ``store`` sections apply.
        cursor: deliver events with offsets after this one.
        primes: the session's era opens with a priming event and may close on purpose.
        resuming: a resume (GET + ``Last-Event-ID``): it replays what is stored before a
            polling close, and ``poll_after_ms = 0`` does not close it on purpose at all.
        replay_until: the stream's last offset when the resume arrived: events up to it are
            what the client missed (counted as replayed).
        check_owner: called every ``store.heartbeat_s`` while the stream is idle: ends the
            stream if its owner replica died (the stream is then finished with errors).
        reader: this connection's claim on the stream (a standalone stream, D5): once a read
            names a newer reader, on any replica, the connection ends ``superseded``.
    """

    def __init__(
        self,
        sink: ClientSink,
        store: EventStore,
        stream: StreamLife,
        settings: Settings,
        *,
        cursor: int,
        primes: bool,
        resuming: bool = False,
        replay_until: int = 0,
        check_owner: Callable[[], Awaitable[object]] | None = None,
        reader: str | None = None,
        first: asyncio.Future[ReadResult] | None = None,
    ) -> None:
        self._sink, self._store, self._stream = sink, store, stream
        self._claim = reader
        self._sse, self._limits = settings.sse, settings.store
        self._batch = settings.store.replay_batch_events
        self._primes, self._resuming, self._check_owner = primes, resuming, check_owner
        self.cursor = DeliveryCursor(cursor)
        self.events = 0
        self._start, self._replay_until = cursor, replay_until
        self._reader = StoreReader(store, stream.session_id, stream.life, self._batch)
        if first is not None:
            self._reader.seed(cursor, first)
        self._replaying = True
        self._full_batches = 0
        #: Per event type, the block's lines up to its offset (see _write_events).
        self._heads: dict[str | None, str] = {}
        #: When the client last got something (events, or a keepalive comment).
        self._quiet_since = time.monotonic()
        self._close_at = self._polling_close(time.monotonic())
        #: The timeout of waits on the feed, made by the first one (see _wait_feed).
        self._alarm: Alarm | None = None
        #: Waits on the feed park there (see _take): not for a claimed (standalone) stream, nor
        #: one whose owner is checked on a timer of its own.
        self._parks = reader is None and check_owner is None
        #: The waiter of the wait parked on the feed now, and this connection's task.
        self._parked: asyncio.Future[bool] | None = None
        self._task: asyncio.Task[object] | None = None
        #: The stream's feed last seen (or its ended feed): read on to its end if the pump
        #: ended while this connection was behind (see _drained_feed).
        self._feed: LocalFeed | None = stream.feed or stream.ended_feed
        #: Every event of a pump that ended normally was delivered from its ended feed.
        self._fed_to_the_end = False

    def _polling_close(self, opened: float) -> float | None:
        """When to close on purpose (SEP-1699 polling), None for never.

        A new stream closes ``poll_after_ms`` after it opened (0: right after priming). A
        resume closes that long after it opened once it has caught up, but never at once: with
        0 it stays until the stream ends, so a client's reconnection always progresses.
        """
        poll_after_ms = self._sse.poll_after_ms
        if not self._primes or poll_after_ms is None:
            return None
        if self._resuming and poll_after_ms == 0:
            return None
        return opened + poll_after_ms / 1000

    async def run(self) -> str:
        """Deliver until the stream ends or a close is due; the reason (see :class:`Delivered`).

        Raises:
            SlowReader, ClientGone: from the sink.
            UnknownStream: the stream was dropped (session deleted or expired).
            StreamError, StoreError, SSEError: the stream cannot be served further.
        """
        self._task = asyncio.current_task()
        if self._primes and await self._prime():
            return "poll"
        try:
            while True:
                feed = self._current_feed()
                if feed is None and self._fed_to_the_end:
                    return "finished"
                if feed is not None:
                    # Step *feed*: events from this process's pump, without a store call.
                    events = feed.read(self.cursor.position, self._batch)
                    if events:
                        await self._write_events(events)
                        self._replaying = False
                        continue
                    step = await self._feed_has_nothing(feed, events)
                    if step != _TO_STORE:
                        if step is _AGAIN:
                            continue
                        return step
                step = await self._from_store()
                if step is not _AGAIN:
                    return step
        finally:
            self._reader.cancel()
            if self._alarm is not None:
                self._alarm.close()

    async def _prime(self) -> bool:
        """Write the priming event; whether the connection closes right after it (polling)."""
        life = self._stream.life
        await self._sink.write(
            encode_priming(priming_id(life, self.cursor.offset), self._sse.retry_ms)
        )
        return self._sse.poll_after_ms == 0 and not self._resuming

    def _current_feed(self) -> LocalFeed | None:
        """The stream's feed, or the one this connection still drains (see _drained_feed)."""
        feed = self._stream.feed
        if feed is None:
            return self._drained_feed()
        self._feed = feed
        return feed

    def _drained_feed(self) -> LocalFeed | None:
        """The feed of a pump that ended while this connection was behind, until its end.

        The life lets its feed go when the pump ends (the store has every event), but a
        connection behind the pump reads the rest from the memory it already holds rather than
        from the store, where a finished stream may be evicted under memory pressure. Kept
        while the cursor is before its end (a reader behind its window catches up from the
        store, then goes on from it); used while it holds the cursor; at its end the delivery is
        ``finished`` (see run). Never a lost feed (its life is retired once drained).
        """
        held = self._feed
        if held is None or not held.done or held.lost:
            self._feed = None
            return None
        if self.cursor.position >= held.end:
            # At the end of an ended, non-lost feed: the pump stored nothing after it.
            self._fed_to_the_end = True
            self._feed = None
            return None
        return held if held.read(self.cursor.position, 0) is not None else None

    async def _feed_has_nothing(
        self, feed: LocalFeed, events: list[FeedEvent] | None
    ) -> str | None:
        """Step *feed* without events to send: a gap, the store, or wait on the pump."""
        if events is None:
            # Behind what the feed holds: the store has it, unless the store was lost (a gap).
            return "store_lost" if feed.lost else _TO_STORE
        if feed.done:
            return "finished_unstored" if feed.lost else _TO_STORE
        if feed.lost:
            # A lost stream cannot be resumed (D7, outages): closed on purpose, the client
            # would never get the rest. It is carried to its end instead.
            self._close_at = None
        return await self._idle(feed)

    async def _from_store(self) -> str | None:
        """Step *store*: one bounded read after the cursor."""
        try:
            result = await self._reader.read(self.cursor.offset)
        except (StoreUnavailable, UnknownStream) as exc:
            await self._outage(exc)
            return _AGAIN
        if self._claim is not None and result.reader not in {"", self._claim}:
            return "superseded"  # a newer connection claimed the stream, maybe elsewhere
        if result.events:
            if len(result.events) == self._batch and not result.finished:
                # A replay: the store reads the next batch while this one is written.
                await self._reader.prefetch(result.events[-1].offset)
            await self._write_events(result.events)
        if result.finished:
            return "finished"
        if len(result.events) == self._batch:
            self._full_batches += 1
            bound = self._replaying and self._full_batches >= self._limits.replay_max_passes
            return "replay_bound" if bound else _AGAIN
        self._replaying = False
        self._full_batches = 0
        if result.events or self._stream.feed is not None:
            return _AGAIN
        return await self._idle()

    async def _idle(self, feed: LocalFeed | None = None) -> str | None:
        """Step *idle*: caught up; wait for news until the next keepalive or polling close.

        News comes from the *feed* when this process pumps the stream (and the feed holds the
        cursor), else from the store's wake-ups.
        """
        now = time.monotonic()
        keepalive_s = self._sse.keepalive_s
        wait_s = keepalive_s - (now - self._quiet_since)
        if self._close_at is not None:
            if now >= self._close_at:
                return "poll"
            wait_s = min(wait_s, self._close_at - now)
        if self._check_owner is not None:
            # Another replica writes this stream: look at its heartbeat every heartbeat_s, so
            # a dead owner's stream ends within heartbeat_expiry_s + heartbeat_s, whatever
            # keepalive_s is (D7).
            wait_s = min(wait_s, self._limits.heartbeat_s)
        try:
            if feed is not None:
                woken = await self._wait_feed(feed, wait_s)
            else:
                stream = self._stream
                woken = await self._store.wait(
                    stream.session_id,
                    stream.life,
                    self.cursor.offset,
                    max(wait_s, 0.0),
                    reader=self._claim,
                )
        except StoreUnavailable:
            return _AGAIN  # the next read fails too, and waits for the store or the feed
        if woken or self._due():
            return _AGAIN
        # A timer may ring a little early (uvloop's by up to its millisecond resolution).
        if time.monotonic() - self._quiet_since >= keepalive_s - SLACK_S:
            await self._sink.write(KEEPALIVE)
            self._quiet_since = time.monotonic()
        if self._check_owner is not None:
            # Unreachable store: the next read fails too, and waits for it (not an end).
            with contextlib.suppress(StoreUnavailable):
                await self._check_owner()
        return _AGAIN

    async def _wait_feed(self, feed: LocalFeed, wait_s: float) -> bool:
        """Wait for news of *feed* at most *wait_s* seconds; False on timeout.

        The timeout is this connection's :class:`Alarm`: one timer across many waits, where
        ``asyncio.timeout`` would schedule and cancel one per event.
        """
        waiter = feed.waiter(self.cursor.position)
        if waiter is None:
            return True
        alarm = self._alarm
        if alarm is None:
            alarm = self._alarm = Alarm(asyncio.get_running_loop())
        alarm.arm(waiter, alarm.loop.time() + wait_s)
        if self._parks:
            # New events are written by the pump's task through _take, without waking this one.
            feed.park(self.cursor.position, waiter, self._take)
            self._parked = waiter
        try:
            return await waiter
        finally:
            self._parked = None
            alarm.disarm()
            feed.forget(waiter)  # timed out or cancelled: the feed still holds it (and unparks)

    async def _outage(self, failure: StoreUnavailable | UnknownStream) -> None:
        """Step *outage*: return once the store is back, or the local feed can serve.

        The feed can serve when it went on without the store (lost mode), or when it is live
        and holds the cursor. Waits on the stream life's news (no polling), tries the store
        every :data:`OUTAGE_STORE_CHECK_S`, and sends keepalives meanwhile.

        Raises:
            UnknownStream: the stream was dropped and no lost feed carries it on.
        """
        loop = asyncio.get_running_loop()
        next_store_check = loop.time() + OUTAGE_STORE_CHECK_S
        next_keepalive = loop.time() + self._sse.keepalive_s
        logged = False
        while True:
            seen = self._stream.news
            feed = self._stream.feed
            if feed is not None and (
                feed.lost or (not feed.done and feed.read(self.cursor.position, 0) is not None)
            ):
                return
            if isinstance(failure, UnknownStream):
                raise failure
            if not logged:
                log.warning("stream.store_unavailable")
                logged = True
            now = loop.time()
            if now >= next_keepalive:
                await self._sink.write(KEEPALIVE)
                next_keepalive = now + self._sse.keepalive_s
            if now >= next_store_check:
                try:
                    await self._store.stream_info(self._stream.session_id, self._stream.life)
                except StoreUnavailable:
                    next_store_check = loop.time() + OUTAGE_STORE_CHECK_S
                else:
                    return
            await self._stream.wait_news(
                min(next_store_check, next_keepalive) - loop.time(), since=seen
            )

    @property
    def replayed(self) -> int:
        """Events delivered that were stored before the connection attached (a resume's)."""
        return max(0, min(self.cursor.offset, self._replay_until) - self._start)

    def _due(self) -> bool:
        return self._close_at is not None and time.monotonic() >= self._close_at

    def _format(
        self, events: Sequence[StoredEvent | FeedEvent], start: int
    ) -> tuple[bytes, int, tuple[int, int]]:
        """The SSE bytes of *events* from index *start* on, about :data:`WRITE_CHUNK_BYTES`.

        Returns the bytes, the index after their last event, and the cursor after them
        (offset, unstored), for the caller to set once it writes them. Events never stored
        (offset None: the store was lost) are sent without an id. The piece is formatted as
        text and encoded once (one encode per write, not per event).
        """
        life = self._stream.life
        # The cursor in locals (this loop runs per event).
        last, unstored = self.cursor.offset, self.cursor.unstored
        # The lines before the offset, per event type (checked once): the common block is
        # then one format, as a minted id holds only hex digits, "-" and digits.
        heads = self._heads
        pieces: list[str] = []
        size = 0
        index, total = start, len(events)
        while index < total:
            event = events[index]
            index += 1
            offset, data = event.offset, event.data
            if offset is None:
                block = format_event(data, event=event.event)
                unstored += 1
            else:
                if data and "\n" not in data and "\r" not in data:
                    head = heads.get(event.event)
                    if head is None:
                        head = format_head(event.event, f"{life}-")[:-1]
                        if len(heads) < MAX_HEADS:
                            heads[event.event] = head
                    block = f"{head}{offset}\ndata: {data}\n\n"
                else:
                    block = format_event(data, event=event.event, id=event_id(life, offset))
                last, unstored = offset, 0
            pieces.append(block)
            size += len(block)
            if size >= WRITE_CHUNK_BYTES:
                break
        return "".join(pieces).encode(), index, (last, unstored)

    async def _write_events(self, events: Sequence[StoredEvent | FeedEvent]) -> None:
        """Write *events* in pieces of about :data:`WRITE_CHUNK_BYTES`; advance the cursor.

        The cursor moves past a piece once it is encoded, before its write: a failed write
        (the client gone) leaves the cursor after what was attempted.
        """
        cursor = self.cursor
        index, total = 0, len(events)
        while index < total:
            piece, index, (cursor.offset, cursor.unstored) = self._format(events, index)
            await self._sink.write(piece)
        self.events += total
        self._quiet_since = time.monotonic()

    def _take(self, events: Sequence[FeedEvent]) -> bool:
        """The parked connection's callback (:meth:`LocalFeed.park`): write *events* now.

        Runs in the pump's task, right after the store acknowledged *events*. Writes them when
        the sink takes them at once (:meth:`ClientSink.write_now`) and moves the next keepalive
        or polling close as a write of the connection's own would; declines (False, nothing
        written, the cursor as it was) when the connection is being stopped (replaced, drain),
        the events need more than one piece, or the sink would block. Never raises.
        """
        waiter, task = self._parked, self._task
        if waiter is None or waiter.done() or task is None or task.cancelling():
            return False
        try:
            piece, stop, after = self._format(events, 0)
            if stop < len(events) or not self._sink.write_now(piece):
                return False
        except Exception:  # the connection's own write meets it again, with its handling
            log.exception("delivery.take_failed")
            return False
        self.cursor.offset, self.cursor.unstored = after
        self.events += stop
        self._replaying = False
        now = time.monotonic()
        self._quiet_since = now
        wait_s = self._sse.keepalive_s
        if self._close_at is not None:
            wait_s = min(wait_s, self._close_at - now)
        if self._alarm is not None:
            self._alarm.arm(waiter, self._alarm.loop.time() + wait_s)
        return True


async def deliver(
    sink: ClientSink,
    *,
    store: EventStore,
    registry: Registry,
    stream: StreamLife,
    settings: Settings,
    metrics: Metrics,
    cursor: int,
    primes: bool,
    resuming: bool = False,
    replay_until: int = 0,
    check_owner: Callable[[], Awaitable[object]] | None = None,
    reader: str | None = None,
    first: asyncio.Future[ReadResult] | None = None,
) -> Delivered:
    """Attach to *stream* (replacing an older connection) and deliver it until a close.

    Every end but a slow reader's and a vanished client's is written as ``retry`` then the
    end of the response: a client that reconnects waits ``sse.retry_ms``. A resume of a life
    lost to a store outage since it was checked is not attached: it ends ``store_lost`` at
    once, and the connection reading the lost feed goes on. *first* is the
    read of the batch after *cursor*, when the caller started it already (a resume checks its
    stream is still there before it answers 200).

    Returns:
        What was delivered, and why it ended.

    Raises:
        asyncio.CancelledError: the client went away (the stream and its pump are unaffected).
    """
    delivery = Delivery(
        sink,
        store,
        stream,
        settings,
        cursor=cursor,
        primes=primes,
        resuming=resuming,
        replay_until=replay_until,
        check_owner=check_owner,
        reader=reader,
        first=first,
    )
    ended = "client_gone"
    metrics.streams_active.inc()
    try:
        if resuming and stream.phase in LOST_PHASES:
            # Lost to a store outage since the resume was checked (during its authorization
            # probe): the feed's unstored events belong to the connection reading them, which
            # a resume must not replace. Not attached: it ends as the gap it is (its next
            # attempt gets 400), and that connection goes on.
            ended = "store_lost"
        else:
            ended = await _attached(delivery, registry, stream, sink)
        if ended in _ABRUPT:
            return _delivered(delivery, ended)
        if not await close_with_retry(sink, settings.sse.retry_ms):
            log.info("subscriber.dropped_slow", cursor=delivery.cursor.offset)
            ended = "slow_reader"
        return _delivered(delivery, ended)
    finally:
        metrics.streams_active.dec()
        metrics.events_delivered.inc(delivery.events)
        metrics.events_replayed.inc(delivery.replayed)
        metrics.count_connection_ended(ended)


#: Ends after which the response is not closed with ``retry`` (it was aborted, or the client
#: is gone).
_ABRUPT = frozenset({"slow_reader", "client_gone"})


async def _attached(
    delivery: Delivery, registry: Registry, stream: StreamLife, sink: ClientSink
) -> str:
    """Run *delivery* attached to *stream* (replacing an older connection); why it ended."""
    with registry.reading(stream) as attachment:
        try:
            return await delivery.run()
        except asyncio.CancelledError:
            if attachment.reason is None:
                raise
            # Told to stop by the registry (a newer connection, or drain): end politely.
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            return attachment.reason
        except SlowReader:
            log.info("subscriber.dropped_slow", cursor=delivery.cursor.offset)
            sink.abort()
            return "slow_reader"
        except ClientGone:
            return "client_gone"
        except UnknownStream:
            # Dropped while attached (session deleted or expired): nothing more will come.
            return "stream_dropped"
        except (StreamError, StoreError, SSEError) as exc:
            # The response has started: a second status line would corrupt the stream. End
            # it with retry; the client resumes and gets a clean answer (400 if trimmed).
            log.warning("stream.delivery_failed", error=type(exc).__name__)
            return "error"


def _delivered(delivery: Delivery, ended: str) -> Delivered:
    return Delivered(events=delivery.events, cursor=delivery.cursor.offset, ended=ended)
