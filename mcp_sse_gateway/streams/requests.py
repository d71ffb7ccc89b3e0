"""Request streams: the SSE answer of a POST as a managed stream (D4), and its resumes (D6).

The upstream request of a managed POST runs in an app-owned task from the start, so a client
that disconnects (even before the response headers) never aborts the tool call upstream. Its
pump fills the store and this process's local feed; a resume on any replica reads the store
after the client's cursor. A stream life the store lost events of is retired (dropped, so a
resume gets 400 rather than a silent gap), and a stream whose owner replica died is ended with
the owner's pending errors by the first reader that notices (D7).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from mcp_sse_gateway import jsonrpc, tracing
from mcp_sse_gateway.errors import (
    CursorGone,
    InvalidEventId,
    StoreError,
    StreamError,
    UnknownStream,
    UpstreamError,
)
from mcp_sse_gateway.event_ids import Cursor, new_life, parse_event_id
from mcp_sse_gateway.store.base import StreamInfo, session_digest
from mcp_sse_gateway.streams.context import StreamContext
from mcp_sse_gateway.streams.life import StreamLife
from mcp_sse_gateway.streams.pump import Chunks, PumpResult, pending_errors, run_pump
from mcp_sse_gateway.streams.upstream import (
    UpstreamCall,
    UpstreamResponse,
    body_chunks,
    is_event_stream,
)
from mcp_sse_gateway.tracing import Attribute

log = structlog.get_logger("mcp_sse_gateway.managed")

#: Retiring a stream life the store lost events of: retry delays, seconds (doubling, jittered).
RETIRE_BACKOFF_S = (0.25, 5.0)
#: A retired life's feed is kept this long for its reader to drain it, seconds.
FEED_GRACE_S = 60.0
#: Replicas whose liveness is remembered at once (each entry lives a fraction of a second).
MAX_KNOWN_OWNERS = 4096

#: What opening a POST gives: the upstream's response, and the stream life it feeds (None when
#: the answer is not an event stream: it is relayed as it is).
Opened = tuple[UpstreamResponse, StreamLife | None]


class RequestStreams:
    """Managed POST streams and resumes of one app.

    Args:
        ctx: the app's stream layer.
    """

    def __init__(self, ctx: StreamContext) -> None:
        self._ctx = ctx
        #: Other replicas seen alive lately: replica id → monotonic time until which that holds
        #: (shared by every reader of their streams on this replica).
        self._owners_alive_until: dict[str, float] = {}

    def stream(self, session_id: str, life: str) -> StreamLife:
        """The stream life *life* of the session in this process (for a connection to read)."""
        return self._ctx.registry.life((session_digest(session_id), life), session_id, life)

    # POST -----------------------------------------------------------------------------------

    async def open_post(
        self,
        session_id: str,
        call: UpstreamCall,
        body: bytes | None,
        request_ids: list[jsonrpc.JSONRPCId],
        *,
        method: str | None = None,
    ) -> Opened:
        """Forward a POST of a resumable session; an SSE answer becomes a managed stream.

        A POST carrying JSON-RPC requests gets its stream life stored before anything is
        forwarded, so the store's bounds refuse it (503) before the upstream runs anything.
        Cancelling (the client left) cancels only the wait: the upstream request goes on, and
        an answer that is not a stream is closed unread. *method* (the JSON-RPC method, for
        the stream's span) is reported when tracing is on.

        Returns:
            The upstream's response and, for an event stream, its stream life (being pumped).

        Raises:
            GatewayBusy: this replica pumps ``server.max_pumps`` streams already (503).
            StoreLimitExceeded: the session holds ``max_streams_per_session`` open streams.
            UpstreamError: the upstream failed before its response headers (502).
        """
        if request_ids:
            # Only a request starts a pump; notifications and answers to the server's requests
            # (which running calls wait for) always go through.
            self._ctx.check_pump_capacity(standalone=False)
        # The request's span: the stream's span and its resumes link to it.
        origin = _Origin(self._ctx.tracing.origin(), time.time_ns(), method)
        life = (
            await self._new_request_stream(session_id, request_ids, call, origin.trace)
            if request_ids
            else None
        )
        opened: asyncio.Future[Opened] = asyncio.get_running_loop().create_future()
        self._ctx.registry.spawn(
            self._start_post(session_id, call, body, request_ids, (life, origin), opened),
            name="post.open",
        )
        try:
            # Waiting on the future, not the task: a client that leaves cancels only the wait.
            await asyncio.wait({opened})
        except asyncio.CancelledError:
            opened.add_done_callback(_close_unclaimed)
            raise
        return opened.result()

    async def _new_request_stream(
        self,
        session_id: str,
        request_ids: list[jsonrpc.JSONRPCId],
        call: UpstreamCall,
        trace: str,
    ) -> str:
        """Create a request stream life owned by this replica and return it.

        Its pending errors are those of *request_ids* (see ``EventStore.end_orphaned``); it is
        bound to the credentials of the POST (*call*) that creates it (DESIGN D8).

        Raises:
            StoreLimitExceeded: the session holds ``max_streams_per_session`` open streams.
        """
        life = new_life()
        await self._ctx.store.create_stream(
            session_id,
            life,
            kind="request",
            owner=self._ctx.replica_id,
            pending=pending_errors(request_ids),
            auth=call.auth,
            creator=call.creator,
            trace=trace,
        )
        return life

    async def _start_post(  # noqa: PLR0917 - the task body of open_post
        self,
        session_id: str,
        call: UpstreamCall,
        body: bytes | None,
        request_ids: list[jsonrpc.JSONRPCId],
        life_origin: tuple[str | None, _Origin],
        opened: asyncio.Future[Opened],
    ) -> None:
        store = self._ctx.store
        life, origin = life_origin
        try:
            response = await self._ctx.upstream.open("POST", call.url, call.headers, body)
            if not is_event_stream(response):
                if life is not None:
                    # Best effort: the answer must reach the client (the life expires anyway).
                    with contextlib.suppress(StoreError, StreamError):
                        await store.drop_stream(session_id, life)
                opened.set_result((response, None))
                return
            if life is None:
                # An event stream answering only notifications or responses: unusual, kept.
                life = await self._new_request_stream(session_id, request_ids, call, origin.trace)
        except BaseException as exc:
            if life is not None:
                with contextlib.suppress(StoreError, StreamError):
                    await store.drop_stream(session_id, life)
            if not opened.done():
                opened.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        # The feed exists before the client's connection attaches: it reads the live tail
        # from memory from its first event on.
        stream = self.stream(session_id, life)
        stream.start_feed(max_lost_events=self._ctx.settings.store.max_events_per_stream)
        opened.set_result((response, stream))
        attributes: dict[str, Attribute] = {
            tracing.SESSION: session_digest(session_id)[:12],
            tracing.LIFE: life,
            tracing.KIND: "request",
            "mcp.stream.requests": len(request_ids),
        }
        if origin.method is not None:
            attributes[tracing.METHOD] = origin.method
        # A root of its own, linked to the request: the pump outlives it. It starts when the
        # upstream request did.
        with self._ctx.tracing.span(
            "mcp.stream",
            attributes=attributes,
            links=(origin.trace,),
            detached=True,
            start_ns=origin.started_ns,
        ) as span:
            result = await self._pump(stream, response, call, request_ids)
            span.set("mcp.stream.events_stored", result.events)
            span.set("mcp.stream.end", _end_of(result))
            if result.broken:
                span.fail("upstream ended before every response")

    async def _pump(
        self,
        stream: StreamLife,
        response: UpstreamResponse,
        call: UpstreamCall,
        request_ids: list[jsonrpc.JSONRPCId],
    ) -> PumpResult:
        """Run the pump of a request stream to its end; log the canonical line."""
        try:
            result = await run_pump(
                self._ctx.store,
                stream.session_id,
                stream.life,
                response.chunks(),
                request_ids=request_ids,
                max_event_bytes=self._ctx.settings.store.max_event_bytes,
                reopen=self._reopener(call),
                stream=stream,
                on_store_lost=lambda: self._store_lost(stream),
            )
        finally:
            response.close()
            self._ctx.registry.release(stream)
        metrics = self._ctx.metrics
        metrics.events_stored.inc(result.events)
        if result.broken:
            metrics.pumps_broken.inc()
        log.info(
            "stream.finished",
            life=stream.life[:8],
            events=result.events,
            broken=result.broken,
            pending=len(result.pending),
        )
        return result

    def _reopener(self, call: UpstreamCall) -> Callable[[str], Awaitable[Chunks | None]]:
        """Resume a resumable upstream that closed on purpose (SEP-1699), as the client would."""

        async def reopen(last_event_id: str) -> Chunks | None:
            again = call.reopen(last_event_id)
            try:
                response = await self._ctx.upstream.open("GET", again.url, again.headers, None)
            except UpstreamError:
                return None
            if not is_event_stream(response):
                response.close()
                return None
            return body_chunks(response)

        return reopen

    def _store_lost(self, stream: StreamLife) -> None:
        """The pump could not store an event: the feed carries the stream on; retire the life."""
        self._ctx.metrics.streams_store_lost.inc()
        self._ctx.registry.spawn(self._retire(stream), name="stream.retire", background=True)

    async def _retire(self, stream: StreamLife) -> None:
        """Drop a stream life that has a gap from the store (so resumes get 400), then the feed.

        Retries while the store is down, for at most ``session_idle_ttl_s`` (by then the
        stream's keys expired anyway).
        """
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self._ctx.settings.store.session_idle_ttl_s
        delay_s = RETIRE_BACKOFF_S[0]
        try:
            while True:
                try:
                    await self._ctx.store.drop_stream(stream.session_id, stream.life)
                    log.info("stream.retired", life=stream.life[:8])
                    break
                except StoreError:
                    if loop.time() >= give_up_at:
                        break
                await asyncio.sleep(delay_s * random.uniform(0.5, 1.0))  # noqa: S311 - jitter
                delay_s = min(delay_s * 2, RETIRE_BACKOFF_S[1])
            # Keep the feed until the pump closed it, then while its reader drains it (bounded).
            feed = stream.feed
            while feed is not None and not feed.done:
                await feed.wait(feed.end, FEED_GRACE_S)
            if stream.reader is not None:
                await asyncio.sleep(FEED_GRACE_S)
        finally:
            stream.retire()
            self._ctx.registry.release(stream)

    # Resume ---------------------------------------------------------------------------------

    async def resume_target(self, session_id: str, last_event_id: str) -> tuple[Cursor, StreamInfo]:
        """The cursor a ``Last-Event-ID`` names and its stream's metadata (D6).

        Raises:
            InvalidEventId: malformed, or an offset this stream never reached.
            UnknownStream: no such stream life under this session.
            CursorGone: the events after the cursor were trimmed.
            StoreUnavailable: the store cannot be asked.
        """
        cursor = parse_event_id(last_event_id)
        if cursor is None:
            raise InvalidEventId
        info = await self._ctx.store.stream_info(session_id, cursor.life)
        if info is None:
            raise UnknownStream
        if cursor.offset > info.last_offset:
            raise InvalidEventId
        if cursor.offset + 1 < info.first_offset:
            raise CursorGone
        return cursor, info

    def owner_check(
        self, session_id: str, info: StreamInfo
    ) -> Callable[[], Awaitable[bool]] | None:
        """For a request stream another replica writes: end it if that replica died (D7).

        It runs when a resume starts and then every ``store.heartbeat_s`` while the stream is
        idle. An owner seen alive is taken as alive for a quarter of ``heartbeat_s`` by every
        reader on this replica: one store command per owner and period, however many clients
        wait. The stream is ended with the JSON-RPC errors its writer left pending, exactly
        once whichever replicas check at the same time.

        Returns:
            The check (True when it ended the stream), or None when there is nothing to check.
        """
        if info.kind != "request" or info.owner == self._ctx.replica_id:
            return None
        alive_until = self._owners_alive_until
        cache_s = self._ctx.settings.store.heartbeat_s / 4
        store = self._ctx.store

        async def check() -> bool:
            now = time.monotonic()
            if alive_until.get(info.owner, 0.0) > now:
                return False
            if await store.replica_alive(info.owner):
                if len(alive_until) >= MAX_KNOWN_OWNERS:
                    alive_until.clear()
                alive_until[info.owner] = now + cache_s
                return False
            alive_until.pop(info.owner, None)
            ended = await store.end_orphaned(session_id, info.life)
            if ended:
                self._ctx.metrics.streams_orphaned.inc()
                log.warning("stream.orphan_ended", life=info.life[:8])
            return ended

        return check


@dataclass(frozen=True, slots=True)
class _Origin:
    """The request that starts a stream: its ``traceparent``, start (ns) and JSON-RPC method."""

    trace: str
    started_ns: int
    method: str | None


def _end_of(result: PumpResult) -> str:
    """How a pump ended, for its span: ``finished``, ``broken`` or ``store_lost``."""
    if result.store_lost:
        return "store_lost"
    return "broken" if result.broken else "finished"


def _close_unclaimed(future: asyncio.Future[Opened]) -> None:
    """The client left before the upstream answered: close a non-stream answer nobody reads."""
    if future.cancelled() or future.exception() is not None:
        return
    response, stream = future.result()
    if stream is None:
        response.close()
