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
    ShuttingDown,
    StoreError,
    StreamError,
    UpstreamError,
)
from mcp_sse_gateway.event_ids import new_life
from mcp_sse_gateway.store.base import session_digest
from mcp_sse_gateway.streams.context import StreamContext
from mcp_sse_gateway.streams.life import StreamLife
from mcp_sse_gateway.streams.openings import Openings
from mcp_sse_gateway.streams.pump import Chunks, PumpResult, pending_errors, run_pump
from mcp_sse_gateway.streams.upgrade import (
    EVENT_FRAMING_BYTES,
    Upgrade,
    json_as_events,
    late_body,
    no_body,
    upgradable,
)
from mcp_sse_gateway.streams.upstream import (
    UpstreamCall,
    UpstreamResponse,
    body_chunks,
    is_event_stream,
)
from mcp_sse_gateway.tracing import Attribute

log = structlog.get_logger("mcp_sse_gateway.managed")

#: Store calls retried in the background (retiring a lost life, a missed end marker): the
#: first and the longest delay between tries, seconds (doubling, jittered).
RETIRE_BACKOFF_S = (0.25, 5.0)
#: A retired life's feed is kept this long for its reader to drain it, seconds.
FEED_GRACE_S = 60.0

#: What opening a POST gives: the upstream's response, and the stream life it feeds (None when
#: the answer is not an event stream: it is relayed as it is).
Opened = tuple[UpstreamResponse | None, StreamLife | None]


class RequestStreams:
    """Managed POST streams and resumes of one app.

    Args:
        ctx: the app's stream layer.
    """

    def __init__(self, ctx: StreamContext) -> None:
        self._ctx = ctx
        self._openings = Openings(ctx.settings.server.max_opening_streams)
        #: POSTs past the pump bound whose pump is not spawned yet (they count toward it).
        self._reserved_pumps = 0

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
        upgrade_wait_s: float | None = None,
    ) -> Opened:
        """Forward a POST of a resumable session; an SSE answer becomes a managed stream.

        A POST carrying JSON-RPC requests gets its stream life stored before anything is
        forwarded, so the store's bounds refuse it (503) before the upstream runs anything.
        Cancelling (the client left) cancels only the wait: the upstream request goes on, and
        an answer that is not a stream is closed unread. *method* (the JSON-RPC method, for
        the stream's span) is reported when tracing is on.

        With *upgrade_wait_s* (``sse.upgrade_json``, a POST of requests), a 2xx JSON answer
        becomes the stream's one event too (:mod:`.upgrade`), and an upstream that has not
        answered within *upgrade_wait_s* seconds is not waited for: the stream is returned at
        once, without a response, and whatever the upstream answers later reaches the client
        through it.

        Returns:
            The upstream's response (None when the stream was returned before it) and, for an
            event stream or an upgraded answer, its stream life (being pumped).

        Raises:
            GatewayBusy: this replica pumps ``server.max_pumps`` streams already (503).
            StoreLimitExceeded: the session holds ``max_streams_per_session`` open streams.
            UpstreamError: the upstream failed before its response headers (502).
        """
        if not request_ids:
            return await self._open_post(session_id, call, body, request_ids, method=method)
        # Only a request starts a pump; notifications and answers to the server's requests
        # (which running calls wait for) always go through, and never wait for an opening.
        self._ctx.check_pump_capacity(standalone=False)
        release = await self._openings.enter()
        reserved = False
        try:
            # Again, with what opened while this one waited, and the openings whose pump is not
            # running yet: each holds a reservation until its pump is spawned.
            self._ctx.check_pump_capacity(standalone=False, reserved=self._reserved_pumps)
            self._reserved_pumps += 1
            reserved = True

            def spawned() -> None:
                nonlocal reserved
                if reserved:
                    reserved = False
                    self._reserved_pumps -= 1

            return await self._open_post(
                session_id,
                call,
                body,
                request_ids,
                method=method,
                upgrade_wait_s=upgrade_wait_s,
                spawned=spawned,
            )
        finally:
            if reserved:
                self._reserved_pumps -= 1
            release()

    async def _open_post(
        self,
        session_id: str,
        call: UpstreamCall,
        body: bytes | None,
        request_ids: list[jsonrpc.JSONRPCId],
        *,
        method: str | None,
        upgrade_wait_s: float | None = None,
        spawned: Callable[[], None] | None = None,
    ) -> Opened:
        # The request's span: the stream's span and its resumes link to it.
        origin = _Origin(self._ctx.tracing.origin(), time.time_ns(), method)
        life = (
            await self._new_request_stream(session_id, request_ids, call, origin.trace)
            if request_ids
            else None
        )
        upgrade = Upgrade() if upgrade_wait_s is not None and life is not None else None
        post = _Post(session_id, call, body, request_ids, life, origin, upgrade)
        opened: asyncio.Future[Opened] = asyncio.get_running_loop().create_future()
        self._ctx.registry.spawn(self._start_post(post, opened), name="post.open")
        if spawned is not None:
            spawned()  # the registry counts this pump from now on
        try:
            # Waiting on the future, not the task: a client that leaves cancels only the wait.
            await asyncio.wait({opened}, timeout=upgrade_wait_s if upgrade else None)
            if upgrade is not None and life is not None and not upgrade.answered:
                # The upstream is slow to answer: the client gets its stream now (keepalives
                # cross idle timeouts), and the answer will come through it.
                upgrade.committed = True
                self._ctx.metrics.json_upgrades.labels("late").inc()
                return None, self._new_feed(session_id, life)
            if not opened.done():
                # Answered as the wait ended: the task settles the future without awaiting.
                await asyncio.wait({opened})
        except asyncio.CancelledError:
            opened.add_done_callback(_close_unclaimed)
            raise
        return opened.result()

    def _new_feed(self, session_id: str, life: str) -> StreamLife:
        """The stream life, with a feed its first reader takes the live tail from (memory)."""
        stream = self.stream(session_id, life)
        stream.start_feed(max_lost_events=self._ctx.settings.store.max_events_per_stream)
        return stream

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

    async def _start_post(self, post: _Post, opened: asyncio.Future[Opened]) -> None:
        """The task of one POST: the upstream request, then its pump when there is a stream.

        A call that stays silent longer than the session's idle TTL keeps its keys meanwhile.
        """
        if not post.request_ids:
            await self._forward_post(post, opened)
            return
        keeper = _SessionKeeper(self._ctx, post.session_id)
        try:
            await self._forward_post(post, opened)
        finally:
            keeper.stop()

    async def _forward_post(self, post: _Post, opened: asyncio.Future[Opened]) -> None:
        upgrade = post.upgrade
        # An upgraded call's headers come with its answer, when the tool is done: the headers
        # and a JSON body must both have come within sse.upgrade_answer_timeout_s.
        settings = self._ctx.settings
        timeout_s = settings.sse.upgrade_answer_timeout_s if upgrade is not None else None
        if timeout_s is not None:
            post.deadline = asyncio.get_running_loop().time() + timeout_s
        try:
            response = await self._ctx.upstream.open(
                "POST", post.call.url, post.call.headers, post.body, headers_timeout_s=timeout_s
            )
        except BaseException as exc:
            await self._open_failed(post, opened, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        if upgrade is not None:
            upgrade.answered = True  # before any await: the client's wait sees it at once
            if upgrade.committed and post.life is not None:
                self._ctx.metrics.json_upgrade_late_answers.labels(_late_answer(response)).inc()
                stream = self.stream(post.session_id, post.life)
                max_bytes = settings.store.max_event_bytes
                late = late_body(
                    response, post.request_ids, max_bytes=max_bytes, deadline=post.deadline
                )
                await self._run_pump(stream, response, late, post, is_event_stream(response))
                return
        chunks = await self._chunks_to_pump(post, response, opened)
        if chunks is None or post.life is None:
            return
        stream = self._new_feed(post.session_id, post.life)
        opened.set_result((response, stream))
        await self._run_pump(stream, response, chunks, post, is_event_stream(response))

    async def _open_failed(
        self, post: _Post, opened: asyncio.Future[Opened], exc: BaseException
    ) -> None:
        """The upstream request failed before its headers: 502, or errors on a committed stream."""
        upgrade = post.upgrade
        if upgrade is not None:
            upgrade.answered = True
            if upgrade.committed and post.life is not None:
                # The client has its stream: the pending requests get their errors there (on a
                # drain too: the cancellation stops the wait, the errors are still stored).
                kind = "cancelled" if isinstance(exc, asyncio.CancelledError) else "failed"
                self._ctx.metrics.json_upgrade_late_answers.labels(kind).inc()
                if isinstance(exc, UpstreamError):
                    self._ctx.metrics.upstream_errors.labels(type(exc).__name__).inc()
                stream = self.stream(post.session_id, post.life)
                await self._run_pump(stream, None, no_body(), post, reopens=False)
                return
        # The client's wait sees the failure first (a drain's cancellation as a 503, so the
        # client retries elsewhere); the stream life is dropped after.
        if not opened.done():
            opened.set_exception(ShuttingDown() if isinstance(exc, asyncio.CancelledError) else exc)
        if post.life is not None:
            with contextlib.suppress(StoreError, StreamError):
                await self._ctx.store.drop_stream(post.session_id, post.life)

    async def _chunks_to_pump(
        self, post: _Post, response: UpstreamResponse, opened: asyncio.Future[Opened]
    ) -> Chunks | None:
        """What the pump reads of *response*; None when it is relayed as it is instead."""
        if is_event_stream(response):
            if post.life is None:
                # An event stream answering only notifications or responses: unusual, kept.
                try:
                    post.life = await self._new_request_stream(
                        post.session_id, post.request_ids, post.call, post.origin.trace
                    )
                except BaseException as exc:
                    response.close()
                    opened.set_exception(exc)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    return None
            return response.chunks()
        if post.upgrade is not None and upgradable(response):
            self._ctx.metrics.json_upgrades.labels("in_time").inc()
            max_bytes = self._ctx.settings.store.max_event_bytes
            return json_as_events(response, max_bytes=max_bytes, deadline=post.deadline)
        opened.set_result((response, None))
        if post.life is not None:
            # Best effort: the answer reaches the client anyway (the life expires).
            with contextlib.suppress(StoreError, StreamError):
                await self._ctx.store.drop_stream(post.session_id, post.life)
        return None

    async def _run_pump(
        self,
        stream: StreamLife,
        response: UpstreamResponse | None,
        chunks: Chunks,
        post: _Post,
        reopens: bool,
    ) -> None:
        """Pump *chunks* into *stream* to the end, in the stream's span; log the canonical line.

        With *reopens*, an SSE upstream that closes on purpose is re-opened (SEP-1699).
        """
        attributes: dict[str, Attribute] = {
            tracing.SESSION: session_digest(stream.session_id)[:12],
            tracing.LIFE: stream.life,
            tracing.KIND: "request",
            "mcp.stream.requests": len(post.request_ids),
        }
        if post.origin.method is not None:
            attributes[tracing.METHOD] = post.origin.method
        # A root of its own, linked to the request: the pump outlives it. It starts when the
        # upstream request did.
        with self._ctx.tracing.span(
            "mcp.stream",
            attributes=attributes,
            links=(post.origin.trace,),
            detached=True,
            start_ns=post.origin.started_ns,
        ) as span:
            try:
                result = await run_pump(
                    self._ctx.store,
                    stream.session_id,
                    stream.life,
                    chunks,
                    request_ids=post.request_ids,
                    # An upgraded event is the body plus its framing: the bound is the body's.
                    max_event_bytes=self._ctx.settings.store.max_event_bytes
                    + (EVENT_FRAMING_BYTES if post.upgrade is not None else 0),
                    reopen=self._reopener(post.call) if reopens else None,
                    stream=stream,
                    on_store_lost=lambda: self._store_lost(stream),
                    on_dropped=lambda: self._dropped(stream),
                )
            finally:
                if response is not None:
                    response.close()
                self._ctx.registry.release(stream)
            if result.unfinished:
                self._ctx.registry.spawn(
                    self._finish_later(stream), name="stream.finish", retry=True
                )
            span.set("mcp.stream.events_stored", result.events)
            span.set("mcp.stream.end", _end_of(result))
            if result.broken:
                span.fail("upstream ended before every response")
            metrics = self._ctx.metrics
            metrics.events_stored.inc(result.events)
            if result.broken:
                metrics.pumps_broken.inc()
            # In the span: the line carries the stream's trace id, not the creating request's.
            log.info(
                "stream.finished",
                life=stream.life[:8],
                events=result.events,
                broken=result.broken,
                pending=len(result.pending),
            )

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
        self._ctx.registry.spawn(self._retire(stream), name="stream.retire", retry=True)

    def _dropped(self, stream: StreamLife) -> None:
        """The stream was dropped under its pump: the feed carries it on; retire the life."""
        self._ctx.registry.spawn(self._retire_dropped(stream), name="stream.retire", retry=True)

    async def _retire_dropped(self, stream: StreamLife) -> None:
        """Retire a stream dropped under its pump; count it lost if the store lost it.

        A session deleted (tombstoned) or expired drops its streams on purpose. One whose
        session still lives lost it to the store (Redis restarted empty, evicted keys): that is
        an outage of the store, counted in ``streams_store_lost`` like one.
        """
        with contextlib.suppress(StoreError):
            record = await self._ctx.store.get_session(stream.session_id, refresh=False)
            if record is not None and not record.deleted:
                log.warning("store.lost_stream", life=stream.life[:8])
                self._ctx.metrics.streams_store_lost.inc()
        await self._retire(stream)

    async def _until_stored(self, call: Callable[[], Awaitable[object]]) -> bool:
        """Make store *call* until it succeeds; whether it did.

        Retries while the store fails, backing off (:data:`RETIRE_BACKOFF_S`, jittered), for
        at most ``session_idle_ttl_s``: by then the stream's keys expired anyway.
        """
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self._ctx.settings.store.session_idle_ttl_s
        delay_s = RETIRE_BACKOFF_S[0]
        while True:
            try:
                await call()
            except StoreError:
                if loop.time() >= give_up_at:
                    return False
            else:
                return True
            await asyncio.sleep(delay_s * random.uniform(0.5, 1.0))  # noqa: S311 - jitter
            delay_s = min(delay_s * 2, RETIRE_BACKOFF_S[1])

    async def _finish_later(self, stream: StreamLife) -> None:
        """Store the terminal marker the pump could not (the store failed at the very end).

        Every event is stored: once the store is back, the stream ends for its readers
        (a resume gets the rest and the end, then 204) rather than waiting for ever.
        """
        store = self._ctx.store
        if await self._until_stored(lambda: store.finish(stream.session_id, stream.life)):
            log.info("stream.finished_late", life=stream.life[:8])

    async def _retire(self, stream: StreamLife) -> None:
        """Drop a stream life that has a gap from the store (so resumes get 400), then the feed.

        Retries while the store is down (:meth:`_until_stored`).
        """
        store = self._ctx.store
        try:
            if await self._until_stored(lambda: store.drop_stream(stream.session_id, stream.life)):
                log.info("stream.retired", life=stream.life[:8])
            # Keep the feed until the pump closed it, then while its reader drains it (bounded).
            feed = stream.feed
            while feed is not None and not feed.done:
                await feed.wait(feed.end, FEED_GRACE_S)
            if stream.reader is not None:
                await asyncio.sleep(FEED_GRACE_S)
        finally:
            stream.retire()
            self._ctx.registry.release(stream)


class _SessionKeeper:
    """While a pump runs: use the session every third of its idle TTL (D7, expiry).

    A silent call (an upgraded JSON call, a tool that reports no progress) appends nothing for
    as long as it runs, and its client reads the local feed: without this, the session and its
    open streams would expire in the store under a running call. A timer, not a task per call:
    most calls end long before it is due, and cost then only the timer.
    """

    __slots__ = ("_ctx", "_handle", "_period_s", "_refresh", "_session_id")

    def __init__(self, ctx: StreamContext, session_id: str) -> None:
        self._ctx, self._session_id = ctx, session_id
        self._period_s = ctx.settings.store.session_idle_ttl_s / 3
        self._refresh: asyncio.Task[None] | None = None
        self._handle: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(
            self._period_s, self._due
        )

    def _due(self) -> None:
        if self._refresh is None or self._refresh.done():
            self._refresh = self._ctx.registry.spawn(
                self._use_session(), name="post.keep_session", background=True
            )
        self._handle = asyncio.get_running_loop().call_later(self._period_s, self._due)

    async def _use_session(self) -> None:
        with contextlib.suppress(StoreError):
            await self._ctx.store.get_session(self._session_id, refresh=True)

    def stop(self) -> None:
        """The pump is done: no more uses (one under way is cancelled)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._refresh is not None:
            self._refresh.cancel()


@dataclass(slots=True)
class _Post:
    """One POST being forwarded: what the task of :meth:`RequestStreams.open_post` needs."""

    session_id: str
    call: UpstreamCall
    body: bytes | None
    request_ids: list[jsonrpc.JSONRPCId]
    life: str | None
    origin: _Origin
    upgrade: Upgrade | None
    #: When an upgraded call's answer must have come (event loop time), else None.
    deadline: float | None = None


@dataclass(frozen=True, slots=True)
class _Origin:
    """The request that starts a stream: its ``traceparent``, start (ns) and JSON-RPC method."""

    trace: str
    started_ns: int
    method: str | None


def _late_answer(response: UpstreamResponse) -> str:
    """What a committed upgrade's upstream answered: ``event_stream``, ``json`` or ``status``."""
    if is_event_stream(response):
        return "event_stream"
    return "json" if upgradable(response) else "status"


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
    if stream is None and response is not None:
        response.close()
