"""The pump: reads one upstream SSE response into the event store (DESIGN D4).

A pump is owned by the app, not by the client's request: it keeps reading after the client's
connection dropped (a disconnect is not a cancellation; MCP 2025-11-25 transports,
"Resumability and Redelivery"), so no message is lost.

For each upstream message it drops the upstream's id and appends the event (store first, then
readers are woken). When the upstream response ends it appends the terminal marker. If the
upstream breaks before every JSON-RPC response of the request arrived, it appends a JSON-RPC
error response for each pending request id (code :data:`~mcp_sse_gateway.jsonrpc.
UPSTREAM_STREAM_BROKEN`), then the marker: no client waits forever. If the upstream itself
primed and closed on purpose (a resumable upstream, SEP-1699), the pump first resumes it with
``GET`` + the upstream's own ``Last-Event-ID``.

If the store becomes unreachable mid-stream (DESIGN D7, outages), the pump moves its stream life
to lost mode (:meth:`~mcp_sse_gateway.streams.life.StreamLife.lose`): its local feed carries the
connected client on (the new events without ids), and the stream life ends for resumption.

The pump also keeps the stream's *pending* error datas in the store (one JSON-RPC error per
request still unanswered), so that if this replica dies, another one ends the stream with them
(:meth:`~mcp_sse_gateway.store.base.EventStore.end_orphaned`).

Sans-IO towards HTTP: the upstream is an async iterator of byte chunks (which raises
:class:`~mcp_sse_gateway.errors.UpstreamError` when it breaks) plus a ``reopen`` callback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import structlog

from mcp_sse_gateway import jsonrpc
from mcp_sse_gateway.errors import (
    EventTooLarge,
    LeaseLost,
    SSEError,
    StoreError,
    StoreUnavailable,
    StreamError,
    UnknownStream,
    UpstreamError,
)
from mcp_sse_gateway.sse import ServerSentEvent, SSEDecoder
from mcp_sse_gateway.store.base import EventStore, Lease
from mcp_sse_gateway.streams.feed import LocalFeed
from mcp_sse_gateway.streams.life import StreamLife

log = structlog.get_logger("mcp_sse_gateway.pump")

#: Message of the JSON-RPC error appended for each request whose response never came.
BROKEN_MESSAGE = "Upstream stream ended before the response (gateway)"
#: A resumable upstream that keeps closing without progress is given up on after this many
#: reconnections in a row.
MAX_UPSTREAM_RESUMES = 32
#: Used when a resumable upstream closed on purpose without sending ``retry``, seconds.
DEFAULT_UPSTREAM_RETRY_S = 1.0
#: The shortest wait before resuming an upstream, whatever its ``retry`` (0 included), seconds.
MIN_UPSTREAM_RETRY_S = 0.1

Chunks = AsyncIterator[bytes]
#: ``reopen(last_event_id)`` → a new upstream body, or None when the upstream refuses to resume.
Reopen = Callable[[str], Awaitable[Chunks | None]]


def pending_errors(request_ids: Sequence[jsonrpc.JSONRPCId]) -> list[str]:
    """The SSE data of the gateway's error for each request id (single-line JSON each)."""
    return [
        json.dumps(jsonrpc.error_response(rid, jsonrpc.UPSTREAM_STREAM_BROKEN, BROKEN_MESSAGE))
        for rid in request_ids
    ]


@dataclass(slots=True)
class PumpResult:
    """What a pump did, for the canonical ``stream.finished`` log line.

    Attributes:
        events: events stored (upstream messages plus the gateway's own errors); those a lost
            stream's feed carried unstored are not counted.
        broken: the upstream ended or failed before every response arrived.
        pending: request ids left without a response when the upstream ended.
        store_lost: the store failed mid-stream: later events went to the local feed only, or
            (without a stream life to carry them) were not read.
        lease_lost: an append was refused: the session's lease is another replica's now.
        resumable: some body of the upstream primed or sent ``retry``: it closes on purpose
            (SEP-1699), and its clean ends are polling, not failures.
        retry_ms: the upstream's last ``retry``, ms (None: it sent none).
        unfinished: every event was stored but the terminal marker: the store failed at the
            very end. The caller finishes the stream once the store is back.
    """

    events: int = 0
    broken: bool = False
    pending: list[jsonrpc.JSONRPCId] = field(default_factory=list)
    store_lost: bool = False
    lease_lost: bool = False
    resumable: bool = False
    retry_ms: int | None = None
    unfinished: bool = False


class _Abandoned(Exception):
    """The stream is lost and its reader left: what the upstream still sends has no reader."""


@dataclass(slots=True)
class _Sink:
    """Where the pump's events go: the store (then the feed), or only the feed once lost."""

    store: EventStore
    session_id: str
    life: str
    stream: StreamLife | None
    on_store_lost: Callable[[], None] | None
    lease: Lease | Callable[[], Lease] | None = None
    #: Called once when the stream turns out dropped from the store (to retire the life).
    on_dropped: Callable[[], None] | None = None
    #: The stream was dropped from the store while pumped; the feed went on alone.
    dropped: bool = False
    #: The last append carried the terminal marker (the upstream body had ended).
    finished: bool = False

    #: The stream's feed when the pump started, kept by the pump itself: a life retired while
    #: the pump still runs never takes it out of lost mode (no write after a gap).
    feed: LocalFeed | None = None

    def __post_init__(self) -> None:
        self.feed = self.stream.feed if self.stream is not None else None

    @property
    def lost(self) -> bool:
        return self.feed is not None and self.feed.lost

    async def put(
        self,
        events: list[tuple[str, str | None]],
        pending: list[str] | None,
        *,
        finish: bool = False,
    ) -> bool:
        """Store *events* (then add them to the feed), or push them unstored once lost.

        With *finish*, the store finishes the stream in the same call (not once lost: a lost
        stream is never finished).

        Returns:
            Whether they were stored.

        Raises:
            _Abandoned: lost, and the client that read the stream left: no one can ever read
                what follows (a lost stream is not resumable).
        """
        stream, feed = self.stream, self.feed
        if feed is None or not feed.lost:
            try:
                lease = self.lease() if callable(self.lease) else self.lease
                last = await self.store.append_many(
                    self.session_id, self.life, events, pending=pending, lease=lease, finish=finish
                )
            except (StoreUnavailable, UnknownStream) as failure:
                if stream is None or feed is None:
                    raise
                self._go_lost(stream, failure)
            else:
                self.finished = finish
                if feed is not None:
                    feed.add_stored(last - len(events) + 1, events)
                return True
        if stream is not None and stream.reader is None and feed.reader_at > 0:
            raise _Abandoned
        for data, event in events:
            feed.push(data, event)
        return False

    def _go_lost(self, stream: StreamLife, failure: StoreUnavailable | UnknownStream) -> None:
        """From now on the feed carries the stream on alone, unstored (lost mode).

        The store is down (D7, outages), or the stream was dropped under the pump (the session
        deleted or expired): the client attached here still gets what the upstream sends, its
        pending requests' errors included.
        """
        if isinstance(failure, UnknownStream):
            log.info("stream.dropped_while_pumping")
            self.dropped = True
            then = self.on_dropped
        else:
            log.warning("store.lost_mid_stream")
            then = self.on_store_lost
        stream.lose()
        if then is not None:
            then()


def _response_ids(data: str) -> list[jsonrpc.JSONRPCId]:
    """Ids of the JSON-RPC responses in one SSE data field; cheap for notifications."""
    # Notifications and requests carry "method"; only responses settle a pending id. Checking
    # for the member names first avoids parsing the (usually larger) notification bodies.
    if '"result"' not in data and '"error"' not in data:
        return []
    messages = jsonrpc.parse_messages(data)
    return [
        m["id"]
        for m in messages or ()
        if "method" not in m
        and ("result" in m or "error" in m)
        and isinstance(m.get("id"), (str, int))
        and not isinstance(m["id"], bool)
    ]


async def run_pump(
    store: EventStore,
    session_id: str,
    life: str,
    body: Chunks,
    *,
    request_ids: list[jsonrpc.JSONRPCId],
    max_event_bytes: int,
    reopen: Reopen | None = None,
    finish: bool = True,
    stream: StreamLife | None = None,
    on_store_lost: Callable[[], None] | None = None,
    lease: Lease | Callable[[], Lease] | None = None,
    on_dropped: Callable[[], None] | None = None,
) -> PumpResult:
    """Read *body* into stream *life* of the session until it ends.

    Args:
        store: where events go.
        session_id: the stream's session.
        life: the stream life, already created in the store.
        body: the upstream response body as byte chunks.
        request_ids: the JSON-RPC request ids the response must answer (empty for a standalone
            GET stream).
        max_event_bytes: bound on one event; a bigger one breaks the stream (pending requests
            get the gateway's error).
        reopen: resumes a resumable upstream that closed on purpose; None to never resume.
        finish: append the terminal marker at the end (False for a standalone stream whose
            life continues across upstream GETs).
        stream: the stream life in this process, whose local feed gets each stored batch; if
            the store becomes unreachable the life goes on in lost mode (None: a store failure
            breaks the stream). The pump closes the feed when done.
        on_store_lost: called once when the life switches to lost mode (to retire it).
        on_dropped: called once when the stream was dropped from the store under the pump
            (session deleted or expired): the life goes on in lost mode too, for the client
            attached here, and is retired.
        lease: the session's standalone lease the appends are fenced by (DESIGN D5), or a
            callable giving the current one: once another replica took it over, the pump
            stops (``lease_lost``).

    Returns:
        What was appended.

    Cancelling stops reading; pending requests then get the gateway's error and the marker is
    appended (best effort), so readers never hang.
    """
    pending: dict[jsonrpc.JSONRPCId, None] = dict.fromkeys(request_ids)
    result = PumpResult()
    sink = _Sink(store, session_id, life, stream, on_store_lost, lease, on_dropped)
    resumes = 0
    # One decoder for every body: the upstream's last event id carries over a body without ids
    # (as EventSource's does across reconnections); each body's framing starts afresh.
    decoder = SSEDecoder(max_event_bytes=max_event_bytes)
    # The upstream showed it is resumable (it primed or sent retry on some body): its later
    # clean ends are deliberate too, a replay body without either included.
    resumable = False
    retry_ms: int | None = None
    resumed = False
    try:
        while True:
            before = decoder.last_event_id
            closed = await _read_body_or_end(
                sink, body, decoder, pending, result, stop_when_answered=resumed, finish=finish
            )
            if resumed:
                await _close_body(body)
            decoder.end()
            if closed is None:
                break
            result.resumable = resumable = resumable or closed.on_purpose
            if closed.retry_ms is not None:
                result.retry_ms = retry_ms = closed.retry_ms
            upstream_id = decoder.last_event_id
            # Only an upstream that closed on purpose (it primed, or sent retry: SEP-1699) is
            # resumed; one that just stopped (a crash, no resumability) is not asked for a
            # replay it may answer with unrelated messages.
            if not pending or reopen is None or not upstream_id or not resumable:
                result.broken = bool(pending)
                break
            # Progress is the upstream's last event id moving on (stored or not: a lost stream's
            # events count too); a replay that repeats itself is not progress.
            resumes = 0 if upstream_id != before else resumes + 1
            if resumes > MAX_UPSTREAM_RESUMES:
                result.broken = True
                break
            await asyncio.sleep(
                max(retry_ms / 1000, MIN_UPSTREAM_RETRY_S)
                if retry_ms is not None
                else DEFAULT_UPSTREAM_RETRY_S
            )
            reopened = await reopen(upstream_id)
            if reopened is None:
                result.broken = True
                break
            log.info("upstream.resumed", resumes=resumes)
            body, resumed = reopened, True
    finally:
        if resumed:  # a cancelled pump leaves no resumed upstream GET open
            with contextlib.suppress(Exception):
                await _close_body(body)
        result.pending = list(pending)
        result.store_lost = result.store_lost or (sink.lost and not sink.dropped)
        await _settle(sink, result, finish=finish)
    return result


@dataclass(slots=True)
class _Closed:
    """How an upstream body that ended cleanly closed.

    Attributes:
        retry_ms: its last ``retry`` field, ms (None: none).
        on_purpose: it primed (an event with an id and no data) or sent ``retry``: a
            resumable upstream closing on purpose (SEP-1699), to be resumed.
    """

    retry_ms: int | None = None
    on_purpose: bool = False


async def _read_body_or_end(
    sink: _Sink,
    body: Chunks,
    decoder: SSEDecoder,
    pending: dict[jsonrpc.JSONRPCId, None],
    result: PumpResult,
    *,
    stop_when_answered: bool,
    finish: bool = False,
) -> _Closed | None:
    """Read one upstream body into the sink; how it closed, or None when it ended the pump.

    Every failure ends the pump, recorded in *result*: it never escapes (a client must never
    hang on a stream whose pump died).
    """
    try:
        closed = await _read_body(
            sink,
            body,
            decoder,
            pending,
            result,
            stop_when_answered=stop_when_answered,
            finish=finish,
        )
    except _Abandoned:
        # Lost, and its client gone: nothing can read what follows; stop reading the upstream.
        log.info("stream.abandoned", pending=len(pending))
        result.broken = bool(pending)
    except LeaseLost:
        # Another replica pumps the session's upstream GET now: this one must stop.
        log.info("standalone.lease_lost")
        result.lease_lost = True
    except StreamError:
        # The stream was dropped under the pump (session deleted or expired).
        log.info("stream.dropped_while_pumping")
        pending.clear()
    except StoreUnavailable:
        # No local feed to carry it on: the stream cannot go on; it has a gap from here.
        log.warning("store.lost_mid_stream")
        result.broken, result.store_lost = bool(pending), True
    except (UpstreamError, SSEError) as exc:
        # The body broke off (reset, truncated, read timeout) or an event is too large.
        log.warning("upstream.stream_broken", error=type(exc).__name__)
        result.broken = bool(pending)
    except StoreError as exc:
        log.warning("store.append_failed", error=type(exc).__name__)
        result.broken = bool(pending)
    except Exception:  # a bug must end the stream, never hang its client
        log.exception("pump.failed")
        result.broken = bool(pending)
    else:
        return closed
    return None


async def _read_body(
    sink: _Sink,
    body: Chunks,
    decoder: SSEDecoder,
    pending: dict[jsonrpc.JSONRPCId, None],
    result: PumpResult,
    *,
    stop_when_answered: bool = False,
    finish: bool = False,
) -> _Closed:
    """Append every message of one upstream body; how it closed (its last ``retry``, ms).

    With *stop_when_answered*, reading stops after the chunk that settled the last pending
    request: a resumed upstream may hold its replay open with nothing left to send on it.

    With *finish* (the pump ends the stream), the last chunk's append carries the terminal
    marker when the body had already ended as it was read and every request was answered: the
    pump then ends without resuming anything, and the marker comes one store call sooner.

    Raises:
        EventTooLarge: after appending what the same chunk completed before the big event.
    """
    closed = _Closed()
    async for chunk in body:
        failure: EventTooLarge | None = None
        try:
            events = decoder.feed(chunk)
        except EventTooLarge as too_large:
            events, failure = too_large.events, too_large  # type: ignore[assignment]
        # One store call per chunk: under load a chunk carries many events.
        batch, settled = _scan(events, closed, pending)
        if batch:
            last = finish and not pending and failure is None and _ended(body)
            errors = pending_errors(list(pending)) if settled else None
            if await sink.put(batch, errors, finish=last):
                result.events += len(batch)
        if failure is not None:
            raise failure
        if stop_when_answered and settled and not pending:
            break
    return closed


def _scan(
    events: list[ServerSentEvent], closed: _Closed, pending: dict[jsonrpc.JSONRPCId, None]
) -> tuple[list[tuple[str, str | None]], bool]:
    """The events to store of one chunk, and whether one settled a pending request.

    Notes on *closed* the signs of a close on purpose (priming, ``retry``); pops settled ids
    from *pending*.
    """
    batch: list[tuple[str, str | None]] = []
    settled = False
    for event in events:
        if event.retry is not None:
            closed.retry_ms, closed.on_purpose = event.retry, True
        if not event.data:
            # No data (id/retry only) or the upstream's own priming event.
            if event.id:
                closed.on_purpose = True
            continue
        for rid in _response_ids(event.data):
            settled = pending.pop(rid, 0) is None or settled
        batch.append((event.data, _event_type(event.event)))
    return batch, settled


def _ended(body: Chunks) -> bool:
    """The body already ended (its end arrived with the chunk just read): ``ended``, if it says."""
    return getattr(body, "ended", False) is True


async def _close_body(body: Chunks) -> None:
    """Close a body the pump is done with (its ``finally`` releases the upstream response)."""
    aclose = getattr(body, "aclose", None)
    if aclose is not None:
        await aclose()


def _event_type(event: str | None) -> str | None:
    """The event type to store, as the upstream wrote it (``message`` and ``""`` included).

    None when the upstream wrote no ``event`` field; an unsendable one (NUL) is dropped too.
    Some clients dispatch only explicitly typed events, so an explicit ``event: message`` is
    kept (DESIGN D3).
    """
    if event is None or "\x00" in event:
        return None
    return event


async def _settle(sink: _Sink, result: PumpResult, *, finish: bool) -> None:
    """Append the gateway's error for each pending request, then the terminal marker."""
    errors = pending_errors(result.pending)
    finishing = False
    try:
        if errors and await sink.put([(data, None) for data in errors], []):
            result.events += len(errors)
        if finish and not sink.lost and not sink.finished:
            finishing = True
            await sink.store.finish(sink.session_id, sink.life)
    except _Abandoned:
        pass
    except (StoreError, StreamError) as exc:
        # Only the marker is missing: every event is stored, so the stream is finished later
        # rather than given up (its readers would wait for an end that never comes).
        result.unfinished = finishing and isinstance(exc, StoreUnavailable)
        log.warning("store.settle_failed", pending=len(result.pending))
    except Exception:  # whatever failed, the pump ends normally (log.exception: a bug)
        log.exception("store.settle_failed", pending=len(result.pending))
    finally:
        if sink.feed is not None:
            sink.feed.close()
        if sink.stream is not None:
            sink.stream.pump_ended()
