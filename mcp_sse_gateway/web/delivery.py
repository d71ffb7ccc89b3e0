"""Deliver one managed stream to one client connection (DESIGN D4, D6).

One cursor serves replay and live tail: the connection reads the store after its cursor in
bounded batches, writes the events with the gateway's ids, and waits for the store to wake it
when it has caught up. Nothing is sent twice and nothing is skipped at the switch, because there
is no switch. The connection:

* opens with a priming event (``id`` + ``retry`` + empty ``data``) on sessions of the primed era;
* sends ``: keepalive`` comments when idle for ``sse.keepalive_s``;
* closes after the terminal marker, or on purpose after ``sse.poll_after_ms`` (polling), after
  ``store.replay_max_passes`` full replay batches that never caught up, when a newer connection
  replaces it, or on drain: always after a ``retry`` field where the era allows one;
* is cut, without stalling anyone, when a write blocks for ``sse.slow_reader_cut_s`` (a slow
  reader resumes from the store).

When the store becomes unreachable (D7, outages), the connection waits for it (sending
keepalives) or, once this replica's pump moved the stream to a local feed
(:mod:`mcp_sse_gateway.feed`), goes on from that feed: events stored before the outage keep
their ids, later ones are sent without. On a resumed stream whose owner replica stopped beating,
the connection ends the stream with the owner's pending errors (``end_orphaned``), so the client
gets an error rather than a hang.

Sources: WHATWG HTML, server-sent events; MCP 2025-11-25 transports, "Resumability and
Redelivery", SEP-1699.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import structlog
from aiohttp import web

from mcp_sse_gateway.config import Settings
from mcp_sse_gateway.errors import (
    SSEError,
    StoreError,
    StoreUnavailable,
    StreamError,
    UnknownStream,
)
from mcp_sse_gateway.event_ids import event_id, priming_id
from mcp_sse_gateway.feed import FeedEvent, LocalFeed
from mcp_sse_gateway.registry import Registry
from mcp_sse_gateway.sse import encode_comment, encode_event, encode_priming, encode_retry
from mcp_sse_gateway.store.base import EventStore, ReadResult, StoredEvent
from mcp_sse_gateway.web.keys import METRICS

log = structlog.get_logger("mcp_sse_gateway.delivery")

SSE_RESPONSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache, no-transform",
    "X-Accel-Buffering": "no",
}
KEEPALIVE = encode_comment("keepalive")
#: Events are written in pieces of about this size: a slow reader is one whose single write of
#: at most this much stays blocked for ``slow_reader_cut_s`` (no progress), not one that needs
#: longer than that for a whole replay batch.
WRITE_CHUNK_BYTES = 256 * 1024
#: While the store is down, look for a local feed this often, seconds ...
OUTAGE_FEED_CHECK_S = 0.1
#: ... and try the store again this often, seconds.
OUTAGE_STORE_CHECK_S = 1.0


@dataclass(slots=True)
class Delivery:
    """What one connection delivered, for the canonical log line.

    Attributes:
        events: events written.
        cursor: the last offset written (or the starting cursor).
        ended: why the connection ended: ``finished``, ``poll``, ``replay_bound``, a registry
            reason (``superseded``, ``draining``), ``slow_reader`` or ``client_gone``.
    """

    events: int
    cursor: int
    ended: str = ""


class _SlowReaderError(Exception):
    pass


async def deliver(
    request: web.Request,
    *,
    store: EventStore,
    registry: Registry,
    settings: Settings,
    session_id: str,
    session_key: str,
    life: str,
    cursor: int,
    primes: bool,
    resuming: bool = False,
    headers: dict[str, str] | None = None,
    check_owner: Callable[[], Awaitable[object]] | None = None,
) -> tuple[web.StreamResponse, Delivery]:
    """Stream *life* to the client from *cursor* until one of the closes above.

    Args:
        request: the client's request.
        store: the event store holding the stream.
        registry: to attach (replacing an older connection to the same stream).
        settings: ``sse`` and ``store`` sections apply.
        session_id: the request's ``Mcp-Session-Id``.
        session_key: its digest.
        life: the stream life.
        cursor: deliver events with offsets after this one.
        primes: the session's era opens with a priming event and may close on purpose.
        resuming: a resume (GET + ``Last-Event-ID``): it replays what is stored before a
            polling close, and ``poll_after_ms = 0`` does not close it on purpose at all.
        headers: extra response headers (e.g. ``Mcp-Session-Id`` relayed from the upstream).
        check_owner: called every ``store.heartbeat_s`` while the stream is idle: ends the
            stream if its owner replica died (the stream is then finished with errors, and
            delivered).

    Returns:
        The prepared (and ended) response, and what was delivered.

    Raises:
        asyncio.CancelledError: the client went away (the stream and its pump are unaffected).
    """
    sse = settings.sse
    response = web.StreamResponse(status=200, headers={**(headers or {}), **SSE_RESPONSE_HEADERS})
    await response.prepare(request)
    attachment = registry.attach((session_key, life))
    delivery = Delivery(events=0, cursor=cursor)
    metrics = request.app[METRICS]
    metrics.streams_active.inc()
    reader = _Reader(store, session_id, life, settings.store.replay_batch_events)
    try:
        await _run(
            response,
            delivery,
            reader,
            store=store,
            settings=settings,
            session_id=session_id,
            life=life,
            primes=primes,
            resuming=resuming,
            feeds=registry.feeds,
            feed_key=(session_key, life),
            check_owner=check_owner,
        )
    except asyncio.CancelledError:
        if attachment.reason is None:
            delivery.ended = "client_gone"
            raise
        # Told to stop by the registry (a newer connection, or drain): end politely.
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        delivery.ended = attachment.reason
        await _close_with_retry(response, sse.retry_ms)
    except _SlowReaderError:
        delivery.ended = "slow_reader"
        log.info("subscriber.dropped_slow", cursor=delivery.cursor)
        if request.transport is not None:
            # abort, not close: close would wait to flush the buffer the reader never drains.
            request.transport.abort()
        return response, delivery
    except ConnectionResetError:
        delivery.ended = "client_gone"
        return response, delivery
    except UnknownStream:
        # Dropped while attached (session deleted or expired): nothing more will come.
        delivery.ended = "stream_dropped"
        await _close_with_retry(response, sse.retry_ms)
    except (StreamError, StoreError, SSEError) as exc:
        # The response has started: a second status line would corrupt the stream. End it with
        # retry; the client resumes and gets a clean answer (e.g. 400 for a trimmed cursor).
        delivery.ended = "error"
        log.warning("stream.delivery_failed", error=type(exc).__name__)
        await _close_with_retry(response, sse.retry_ms)
    finally:
        reader.cancel()
        registry.detach(attachment)
        metrics.streams_active.dec()
        metrics.events_delivered.inc(delivery.events)
        metrics.connections_ended.labels(delivery.ended or "client_gone").inc()
    return response, delivery


async def _write(response: web.StreamResponse, data: bytes, timeout_s: float) -> None:
    try:
        async with asyncio.timeout(timeout_s):
            await response.write(data)
    except TimeoutError:
        raise _SlowReaderError from None


async def _close_with_retry(response: web.StreamResponse, retry_ms: int) -> None:
    """Send ``retry`` then end the response: a client that reconnects waits *retry_ms*."""
    try:
        await response.write(encode_retry(retry_ms))
        await response.write_eof()
    except ConnectionResetError:
        pass


class _Reader:
    """Reads batches of one stream from the store, the next one possibly ahead of time."""

    def __init__(self, store: EventStore, session_id: str, life: str, batch: int) -> None:
        self._store, self._session_id, self._life, self._batch = store, session_id, life, batch
        self._ahead: asyncio.Future[ReadResult] | None = None
        self._ahead_after = -1

    def prefetch(self, after: int) -> None:
        """Start reading the batch after *after* now."""
        self.cancel()
        self._ahead = asyncio.ensure_future(
            self._store.read(self._session_id, self._life, after, self._batch)
        )
        self._ahead_after = after

    async def read(self, after: int) -> ReadResult:
        """The batch after *after* (the prefetched one if it was for the same cursor)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            if self._ahead_after == after:
                return await ahead
            ahead.cancel()
        return await self._store.read(self._session_id, self._life, after, self._batch)

    def cancel(self) -> None:
        """Drop a read ahead (its result, or failure, is not wanted)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.cancel()
            ahead.add_done_callback(_consume)


def _consume(future: asyncio.Future[ReadResult]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: no "exception was never retrieved" warning


async def _run(  # noqa: C901, PLR0911, PLR0912, PLR0915 - one loop, one cursor: replay, live tail
    response: web.StreamResponse,
    delivery: Delivery,
    reader: _Reader,
    *,
    store: EventStore,
    settings: Settings,
    session_id: str,
    life: str,
    primes: bool,
    resuming: bool,
    feeds: dict[tuple[str, str], LocalFeed],
    feed_key: tuple[str, str],
    check_owner: Callable[[], Awaitable[object]] | None,
) -> None:
    sse = settings.sse
    cut_s = sse.slow_reader_cut_s
    batch = settings.store.replay_batch_events
    opened = time.monotonic()
    # Polling (SEP-1699): a new stream closes poll_after_ms after it opened (0: right after
    # priming). A resume closes that long after it opened once it has caught up, but never at
    # once: with 0 it stays until the stream ends, so a client's reconnection always progresses.
    poll_s = sse.poll_after_ms / 1000 if primes and sse.poll_after_ms is not None else None
    close_at = None if poll_s is None or (resuming and poll_s == 0) else opened + poll_s
    if primes:
        await _write(
            response, encode_priming(priming_id(life, delivery.cursor), sse.retry_ms), cut_s
        )
        if sse.poll_after_ms == 0 and not resuming:
            await _close(response, delivery, "poll", sse.retry_ms)
            return
    replaying = True
    full_batches = 0
    # When the client last got something (events, or a keepalive comment).
    quiet_since = time.monotonic()
    # Position in the stream's local feed (if this process pumps it): offset n is at n - 1.
    position = delivery.cursor
    while True:
        feed = feeds.get(feed_key)
        if feed is not None:
            events = feed.read(position, batch)
            if events:
                await _write_events(response, delivery, life, events, cut_s)
                position += len(events)
                replaying = False
                quiet_since = time.monotonic()
                continue
            if events is None and feed.lost:
                # Behind what the feed holds, and the store cannot serve the rest: a gap.
                await _close(response, delivery, "store_lost", sse.retry_ms)
                return
            if events is not None and feed.done and feed.lost:
                await _close(response, delivery, "finished_unstored", sse.retry_ms)
                return
            if events is not None and not feed.done:
                # Caught up with this process's pump: wait on it, not on the store.
                wait_s = _wait_s(sse.keepalive_s, close_at)
                if wait_s is None:
                    await _close(response, delivery, "poll", sse.retry_ms)
                    return
                if not await feed.wait(position, wait_s) and not _due(close_at):
                    await _write(response, KEEPALIVE, cut_s)
                continue
            # Not held by the feed (behind its window), or the pump finished: the store.
        try:
            result = await reader.read(delivery.cursor)
        except (StoreUnavailable, UnknownStream) as exc:
            await _await_store_or_feed(
                exc, response, store, settings, session_id, life, feeds, feed_key, position
            )
            continue
        if result.events:
            if len(result.events) == batch and not result.finished:
                # A replay: the store reads the next batch while this one is written.
                reader.prefetch(result.events[-1].offset)
            await _write_events(response, delivery, life, result.events, cut_s)
            position = delivery.cursor
            quiet_since = time.monotonic()
        if result.finished:
            await _close(response, delivery, "finished", sse.retry_ms)
            return
        if len(result.events) == batch:
            full_batches += 1
            if replaying and full_batches >= settings.store.replay_max_passes:
                await _close(response, delivery, "replay_bound", sse.retry_ms)
                return
            continue
        replaying = False
        full_batches = 0
        if result.events or feed_key in feeds:
            continue
        wait_s = _wait_s(sse.keepalive_s - (time.monotonic() - quiet_since), close_at)
        if wait_s is None:
            await _close(response, delivery, "poll", sse.retry_ms)
            return
        if check_owner is not None:
            # Another replica writes this stream: look at its heartbeat every heartbeat_s, so
            # a dead owner's stream ends within heartbeat_expiry_s + heartbeat_s, whatever
            # keepalive_s is (D7).
            wait_s = min(wait_s, settings.store.heartbeat_s)
        try:
            woken = await store.wait(session_id, life, delivery.cursor, max(wait_s, 0.0))
        except StoreUnavailable:
            continue  # the next read fails too, and waits for the store or a feed
        if not woken and not _due(close_at):
            if time.monotonic() - quiet_since >= sse.keepalive_s:
                await _write(response, KEEPALIVE, cut_s)
                quiet_since = time.monotonic()
            if check_owner is not None:
                await check_owner()


def _wait_s(keepalive_s: float, close_at: float | None) -> float | None:
    """Seconds to wait for events: until the next keepalive or polling close (None: due now)."""
    if close_at is None:
        return keepalive_s
    left = close_at - time.monotonic()
    return None if left <= 0 else min(keepalive_s, left)


def _due(close_at: float | None) -> bool:
    return close_at is not None and time.monotonic() >= close_at


async def _close(response: web.StreamResponse, delivery: Delivery, why: str, retry_ms: int) -> None:
    delivery.ended = why
    await _close_with_retry(response, retry_ms)


async def _write_events(
    response: web.StreamResponse,
    delivery: Delivery,
    life: str,
    events: Sequence[StoredEvent | FeedEvent],
    cut_s: float,
) -> None:
    """Write *events* in pieces of about :data:`WRITE_CHUNK_BYTES`; advance the cursor.

    Events never stored (offset None: the store was lost) are sent without an id.
    """
    pieces: list[bytes] = []
    size = 0
    for event in events:
        offset = event.offset
        piece = encode_event(
            event.data, event=event.event, id=None if offset is None else event_id(life, offset)
        )
        pieces.append(piece)
        size += len(piece)
        if offset is not None:
            delivery.cursor = offset
        if size >= WRITE_CHUNK_BYTES:
            await _write(response, b"".join(pieces), cut_s)
            pieces, size = [], 0
    if pieces:
        await _write(response, b"".join(pieces), cut_s)
    delivery.events += len(events)


async def _await_store_or_feed(  # noqa: PLR0917 - private helper of _run
    failure: StoreUnavailable | UnknownStream,
    response: web.StreamResponse,
    store: EventStore,
    settings: Settings,
    session_id: str,
    life: str,
    feeds: dict[tuple[str, str], LocalFeed],
    feed_key: tuple[str, str],
    position: int,
) -> None:
    """After a failed read: return once the store is back, or the local feed can serve.

    The feed can serve when it went on without the store (lost mode), or when it is live and
    holds *position*. Sends keepalives meanwhile.

    Raises:
        UnknownStream: the stream was dropped and no lost feed carries it on.
    """
    loop = asyncio.get_running_loop()
    next_store_check = loop.time() + OUTAGE_STORE_CHECK_S
    next_keepalive = loop.time() + settings.sse.keepalive_s
    logged = False
    while True:
        feed = feeds.get(feed_key)
        if feed is not None and (
            feed.lost or (not feed.done and feed.read(position, 0) is not None)
        ):
            return
        if isinstance(failure, UnknownStream):
            raise failure
        if not logged:
            log.warning("stream.store_unavailable")
            logged = True
        now = loop.time()
        if now >= next_keepalive:
            await _write(response, KEEPALIVE, settings.sse.slow_reader_cut_s)
            next_keepalive = now + settings.sse.keepalive_s
        if now >= next_store_check:
            try:
                await store.stream_info(session_id, life)
            except StoreUnavailable:
                next_store_check = loop.time() + OUTAGE_STORE_CHECK_S
            else:
                return
        await asyncio.sleep(OUTAGE_FEED_CHECK_S)
