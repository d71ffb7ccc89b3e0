"""HTTP handlers of managed streams: POST (D4), standalone GET (D5), resume (D6).

The stream layer (:mod:`mcp_sse_gateway.streams`) does the work; this module turns a request
into its calls, authorizes resumes and joins (D8), and writes the stream to an SSE response.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from mcp_sse_gateway import jsonrpc
from mcp_sse_gateway.eras import Era
from mcp_sse_gateway.errors import (
    CursorGone,
    GatewayError,
    InvalidEventId,
    StoreUnavailable,
    StreamError,
    UnknownStream,
)
from mcp_sse_gateway.event_ids import Cursor
from mcp_sse_gateway.store.base import ReadResult, SessionRecord, StreamInfo, session_digest
from mcp_sse_gateway.streams.cursor import Delivered
from mcp_sse_gateway.streams.delivery import deliver
from mcp_sse_gateway.streams.life import StreamLife
from mcp_sse_gateway.streams.standalone import Refused, standalone_life
from mcp_sse_gateway.streams.upgrade import accepts_event_stream
from mcp_sse_gateway.streams.upstream import UpstreamCall, stream_headers
from mcp_sse_gateway.tracing import KIND, LIFE, SESSION
from mcp_sse_gateway.web.keys import AUTHORIZER, METRICS, SETTINGS, STREAMS, TRACING
from mcp_sse_gateway.web.passthrough import relay_response
from mcp_sse_gateway.web.sse_sink import open_sse

log = structlog.get_logger("mcp_sse_gateway.managed")

#: How long a resume's first read may hold back the 200, seconds (see _first_batch).
FIRST_BATCH_WAIT_S = 1.0

#: A resume's outcome in its span when its ``Last-Event-ID`` cannot be served (400).
RESUME_OUTCOMES: dict[type[StreamError], str] = {
    InvalidEventId: "invalid",
    UnknownStream: "unknown_stream",
    CursorGone: "cursor_gone",
}


async def post(
    request: web.Request,
    *,
    session_id: str,
    era: Era,
    call: UpstreamCall,
    body: bytes | None,
    request_ids: list[jsonrpc.JSONRPCId],
    method: str | None = None,
    upgrade: bool = False,
) -> web.StreamResponse:
    """Forward a POST of a resumable session; an SSE answer becomes a managed stream.

    *method* is the JSON-RPC method (one message) or ``"batch"``, for the stream's span. With
    *upgrade* (``sse.upgrade_json`` applies: see :func:`upgrades`), a JSON answer becomes one
    too, and the client gets its stream after ``sse.upgrade_wait_ms`` whatever the upstream does.

    Raises:
        GatewayBusy: this replica pumps ``server.max_pumps`` streams already (503).
        StoreLimitExceeded: the session holds ``max_streams_per_session`` open streams.
        UpstreamError: the upstream failed before its response headers (502).
    """
    streams = request.app[STREAMS]
    sse = request.app[SETTINGS].sse
    response, stream = await streams.requests.open_post(
        session_id,
        call,
        body,
        request_ids,
        method=method,
        upgrade_wait_s=sse.upgrade_wait_ms / 1000 if upgrade else None,
    )
    if stream is None:
        assert response is not None, "an answer relayed as it is has a response"
        async with response:
            return await relay_response(request, response)
    out, delivered = await _deliver(
        request,
        session_id,
        stream.life,
        cursor=0,
        primes=era.primes,
        headers=stream_headers(response) if response is not None else None,
        opened=stream,
    )
    log.info(
        "stream.delivered", life=stream.life[:8], events=delivered.events, ended=delivered.ended
    )
    return out


def upgrades(
    request: web.Request, body: bytes | None, messages: list[dict[str, Any]] | None
) -> bool:
    """Whether ``sse.upgrade_json`` applies to this POST of a resumable session.

    One JSON-RPC request (not ``initialize``, not a batch, even of one: a batch's answer is one
    JSON array, and initialize's answer carries the session), from a client whose ``Accept``
    names ``text/event-stream``. Notifications and responses keep the upstream's 202.
    """
    if not request.app[SETTINGS].sse.upgrade_json:
        return False
    message = jsonrpc.lone_message(body, messages)
    return (
        message is not None
        and jsonrpc.is_request(message)
        and message.get("method") != "initialize"
        and accepts_event_stream(request.headers.get("Accept"))
    )


async def resume(
    request: web.Request,
    *,
    session_id: str,
    era: Era,
    last_event_id: str,
    call: UpstreamCall,
    record: SessionRecord | None,
) -> web.StreamResponse:
    """Answer GET + ``Last-Event-ID`` from the store (D6); never forwarded upstream.

    The request's credentials are authorized first (D8): the upstream's refusal of them
    is relayed instead of the replay.

    Raises:
        InvalidEventId: malformed, or an offset this stream never reached.
        UnknownStream: no such stream life under this session.
        CursorGone: the events after the cursor were trimmed.
    """
    with request.app[TRACING].span(
        "mcp.resume", attributes={SESSION: session_digest(session_id)[:12]}
    ) as span:
        try:
            cursor, info = await request.app[STREAMS].resumes.resume_target(
                session_id, last_event_id
            )
        except StreamError as exc:
            failed = RESUME_OUTCOMES.get(type(exc), "invalid")
            request.app[METRICS].resumes.labels(failed).inc()
            span.set("mcp.resume.outcome", failed)
            raise
        span.set(LIFE, cursor.life)
        span.set(KIND, info.kind)
        span.set("mcp.resume.from_offset", cursor.offset)
        if info.trace:
            # The request that created the stream (this replica or another): a link, since
            # this resume belongs to a later request of its own.
            span.link(info.trace)

        def decided(outcome: str) -> None:
            # Counted when decided: a client that leaves mid-replay was served all the same.
            request.app[METRICS].resumes.labels(outcome).inc()
            span.set("mcp.resume.outcome", outcome)

        out, delivered = await _resume(
            request, session_id, era, (cursor, info), call, record, decided
        )
        if delivered is not None:
            span.set("mcp.resume.events", delivered.events)
            span.set("mcp.resume.ended", delivered.ended)
        return out


async def _resume(  # noqa: PLR0917 - the parts of resume()
    request: web.Request,
    session_id: str,
    era: Era,
    target: tuple[Cursor, StreamInfo],
    call: UpstreamCall,
    record: SessionRecord | None,
    decided: Callable[[str], None],
) -> tuple[web.StreamResponse, Delivered | None]:
    """The resume once its cursor is known: the answer and what it delivered.

    *decided* is told the outcome (``refused``, ``done``, ``served``) as soon as it is known.
    """
    cursor, info = target
    refused = await _authorize(request, session_id, info, call, record)
    if refused is not None:
        decided("refused")
        return refused, None
    if info.finished and cursor.offset >= info.last_offset:
        # 204 makes EventSource and the SDK clients stop reconnecting: nothing will follow.
        decided("done")
        return web.Response(status=204, headers={"Content-Type": "text/event-stream"}), None
    first = await _first_batch(request, session_id, cursor, info, decided)
    check_owner = request.app[STREAMS].resumes.owner_check(session_id, info)
    if check_owner is not None and not info.finished:
        await check_owner()
    reader = None
    if info.kind == "standalone":
        reader = await _join_standalone(request, session_id, call)
    decided("served")
    out, delivered = await _deliver(
        request,
        session_id,
        cursor.life,
        cursor=cursor.offset,
        primes=era.primes,
        resuming=True,
        replay_until=info.last_offset,
        check_owner=check_owner,
        reader=reader,
        first=first,
    )
    log.info(
        "stream.resumed",
        life=cursor.life[:8],
        from_offset=cursor.offset,
        events=delivered.events,
        ended=delivered.ended,
    )
    return out, delivered


async def _first_batch(
    request: web.Request,
    session_id: str,
    cursor: Cursor,
    info: StreamInfo,
    decided: Callable[[str], None],
) -> asyncio.Future[ReadResult] | None:
    """The first read of a finished request stream's replay, started before the 200 is sent.

    A finished stream may be evicted (the session's bound) or expire between the resume's
    lookup and its first read, and the authorization's probe of the upstream puts a round
    trip in between: read first, so that such a resume gets 400 like any unknown stream, not
    a 200 with a priming event and nothing else. The delivery starts from this read (no read
    more). A running stream is never evicted. A store that cannot be reached now is left to
    the delivery, which waits for it as on any outage; one that is slow to answer (a stalled
    Redis) holds the answer back :data:`FIRST_BATCH_WAIT_S` at most, then the delivery takes
    the read on.

    Raises:
        UnknownStream, CursorGone: the stream, or the events after the cursor, are gone.
    """
    if not info.finished or info.kind != "request":
        return None
    settings = request.app[SETTINGS]
    read = asyncio.ensure_future(
        request.app[STREAMS].ctx.store.read(
            session_id, cursor.life, cursor.offset, settings.store.replay_batch_events
        )
    )
    read.add_done_callback(_retrieved)  # whoever awaits it later still gets its outcome
    try:
        done, _ = await asyncio.wait({read}, timeout=FIRST_BATCH_WAIT_S)
    except asyncio.CancelledError:
        read.cancel()
        raise
    if not done:
        return read
    failure = read.exception()
    if failure is None:
        return read
    if isinstance(failure, StoreUnavailable):
        return None
    if isinstance(failure, StreamError):
        decided(RESUME_OUTCOMES.get(type(failure), "invalid"))
    raise failure


def _retrieved(future: asyncio.Future[ReadResult]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: no "exception was never retrieved" warning


async def standalone(
    request: web.Request,
    *,
    session_id: str,
    era: Era,
    call: UpstreamCall,
    record: SessionRecord | None,
) -> web.StreamResponse:
    """A plain GET: attach to the session's standalone stream at its live end (D5).

    Joining an upstream GET already open for the session is authorized first (D8); a
    GET that opens one is authorized by the upstream itself.
    """
    streams = request.app[STREAMS]

    async def authorize_join(info: StreamInfo | None) -> web.StreamResponse | None:
        return await _authorize(request, session_id, info, call, record)

    refused = await streams.standalone.ensure(session_id, call, authorize_join)
    if refused is not None:
        if refused.response is not None:
            async with refused.response:
                return await relay_response(request, refused.response)
        assert refused.refusal is not None, "a refusal carries one of the two"
        return refused.refusal
    life = standalone_life(session_id)
    reader = await streams.standalone.claim(session_id, life)
    info = await streams.ctx.store.stream_info(session_id, life)
    out, _ = await _deliver(
        request,
        session_id,
        life,
        cursor=info.last_offset if info is not None else 0,
        primes=era.primes,
        reader=reader,
    )
    return out


async def _join_standalone(request: web.Request, session_id: str, call: UpstreamCall) -> str:
    """A resume of the standalone stream (already authorized): keep its upstream GET open (D5).

    The resume's headers may open (or take over) the upstream GET, without its
    ``Last-Event-ID`` (the gateway's, meaningless upstream). Returns the connection's claim.
    """
    streams = request.app[STREAMS]

    async def already_authorized(info: StreamInfo | None) -> None:  # noqa: ARG001
        return None

    async def keep_open() -> None:
        # In the background: the replay never waits for (or fails with) the upstream.
        try:
            refused: Refused[None] | None = await streams.standalone.ensure(
                session_id, call.reopen(), already_authorized
            )
        except (GatewayError, OSError) as exc:
            log.warning("standalone.open_failed", error=type(exc).__name__)
            return
        if refused is not None and refused.response is not None:
            # The upstream refuses a GET with these credentials now: what is stored is still
            # served (the resume was authorized), nothing live follows from here.
            refused.response.close()

    streams.ctx.registry.spawn(keep_open(), name="standalone.join", background=True)
    return await streams.standalone.claim(session_id, standalone_life(session_id))


async def _authorize(
    request: web.Request,
    session_id: str,
    info: StreamInfo | None,
    call: UpstreamCall,
    record: SessionRecord | None,
) -> web.StreamResponse | None:
    """Authorize serving *info*'s stream to *request* (D8); the refusal to answer, or None.

    The stream's creator binding applies, else the session's.
    """
    binding = (info.auth if info is not None else "") or (record.auth if record else "")
    return await request.app[AUTHORIZER].authorize(
        request,
        session_id=session_id,
        binding=binding,
        url=call.url,
        headers=call.headers,
        protocol_version=record.protocol_version if record else None,
    )


async def _deliver(
    request: web.Request,
    session_id: str,
    life: str,
    *,
    cursor: int,
    primes: bool,
    resuming: bool = False,
    replay_until: int = 0,
    headers: dict[str, str] | None = None,
    check_owner: Callable[[], Awaitable[object]] | None = None,
    reader: str | None = None,
    opened: StreamLife | None = None,
    first: asyncio.Future[ReadResult] | None = None,
) -> tuple[web.StreamResponse, Delivered]:
    """Open the SSE response and deliver stream *life* to it from *cursor* (streams.delivery).

    *opened* is the life this request's pump started (a POST): its feed, or what is left of it
    once the pump ended, serves the connection before the store does. *first* is the batch
    after *cursor*, being read or read already (see _first_batch).
    """
    app = request.app
    settings = app[SETTINGS]
    response, sink = await open_sse(request, headers, settings.sse.slow_reader_cut_s)
    streams = app[STREAMS]
    delivered = await deliver(
        sink,
        store=streams.ctx.store,
        registry=streams.ctx.registry,
        # Taken once the response is prepared: deliver() releases it, whatever happens.
        stream=(
            streams.ctx.registry.adopt(opened)
            if opened is not None
            else streams.requests.stream(session_id, life)
        ),
        settings=settings,
        metrics=app[METRICS],
        cursor=cursor,
        primes=primes,
        resuming=resuming,
        replay_until=replay_until,
        check_owner=check_owner,
        reader=reader,
        first=first,
    )
    return response, delivered
