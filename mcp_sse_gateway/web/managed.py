"""Managed streams of resumable sessions: POST (D4), standalone GET (D5), resume (D6).

The upstream request of a managed POST runs in an app-owned task from the start, so a client
that disconnects (even before the response headers) never aborts the tool call upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import aiohttp
import structlog
from aiohttp import web

from mcp_sse_gateway import jsonrpc
from mcp_sse_gateway.config import Settings
from mcp_sse_gateway.eras import Era
from mcp_sse_gateway.errors import (
    CursorGone,
    GatewayBusy,
    InvalidEventId,
    StoreError,
    StreamError,
    UnknownStream,
    UpstreamError,
)
from mcp_sse_gateway.event_ids import new_life, parse_event_id
from mcp_sse_gateway.feed import LocalFeed
from mcp_sse_gateway.headers import client_response_headers
from mcp_sse_gateway.pump import Chunks, pending_errors, run_pump
from mcp_sse_gateway.registry import Registry
from mcp_sse_gateway.store.base import EventStore, SessionRecord, StreamInfo, session_digest
from mcp_sse_gateway.web.delivery import SSE_RESPONSE_HEADERS, deliver
from mcp_sse_gateway.web.keys import (
    AUTHORIZER,
    METRICS,
    REGISTRY,
    REPLICA_ID,
    SETTINGS,
    STORE,
    UPSTREAM_CLIENT,
)
from mcp_sse_gateway.web.passthrough import relay_response
from mcp_sse_gateway.web.upstream import open_upstream

log = structlog.get_logger("mcp_sse_gateway.managed")

#: Response headers of the upstream that describe its body, replaced by the gateway's own.
_BODY_HEADERS = frozenset(
    {"content-type", "cache-control", "content-encoding", "x-accel-buffering"}
)
#: Longest interval between two checks that a standalone stream's session still lives, seconds.
STANDALONE_CHECK_MAX_S = 60.0
#: Bounds of the delay between two re-opens of a standalone stream's upstream GET, seconds.
STANDALONE_BACKOFF_MIN_S = 0.1
STANDALONE_BACKOFF_MAX_S = 30.0
#: Retiring a stream life the store lost events of: retry delays, seconds (doubling, jittered).
RETIRE_BACKOFF_S = (0.25, 5.0)
#: A finished local feed is kept this long for its reader to drain it, seconds.
FEED_GRACE_S = 60.0
#: Replicas whose liveness is remembered at once (each entry lives a fraction of a second).
MAX_KNOWN_OWNERS = 4096
#: Upstream statuses after which the standalone stream is not re-opened (D5).
_STANDALONE_STOP = frozenset({400, 401, 403, 404, 405})


@dataclass(frozen=True, slots=True)
class UpstreamCall:
    """Everything needed to send (and re-send as a GET) one request upstream.

    Attributes:
        url: the upstream URL.
        headers: the headers to send (the client's credentials among them).
        auth: the encoded binding of those credentials, kept on the records the request
            creates (``""`` when authorization is off).
        creator: their keyed digest: a stream the request creates evicts only finished
            streams of the same creator (``""``: any).
    """

    url: Any
    headers: list[tuple[str, str]]
    auth: str = ""
    creator: str = ""


def standalone_life(session_id: str) -> str:
    """The one stream life of a session's standalone GET stream (D5): stable for the session.

    Derived with a different hash key than :func:`session_digest`, so the digests in logs
    reveal nothing of it; it is only meaningful together with the session id anyway.
    """
    return hashlib.blake2b(
        session_id.encode("utf-8", "surrogatepass"), key=b"standalone-stream", digest_size=16
    ).hexdigest()


async def _chunks(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.content.iter_any():
            yield chunk
    finally:
        response.close()


def _is_event_stream(response: aiohttp.ClientResponse) -> bool:
    return response.status == HTTPStatus.OK and response.content_type == "text/event-stream"


def _relayed_headers(response: aiohttp.ClientResponse) -> dict[str, str]:
    return {
        name: value
        for name, value in client_response_headers(
            list(response.headers.items()), keep_length=False
        )
        if name.lower() not in _BODY_HEADERS
    }


def _reopen_headers(call: UpstreamCall, last_event_id: str) -> list[tuple[str, str]]:
    keep = [
        (n, v)
        for n, v in call.headers
        if n.lower() not in {"content-type", "accept", "last-event-id"}
    ]
    return [*keep, ("Accept", "text/event-stream"), ("Last-Event-ID", last_event_id)]


class ManagedStreams:
    """The handlers' side of managed streams, bound to one app's shared objects."""

    def __init__(self, app: web.Application) -> None:
        self._app = app

    @property
    def store(self) -> EventStore:
        """The app's event store."""
        return self._app[STORE]

    @property
    def registry(self) -> Registry:
        """The app's task and attachment registry."""
        return self._app[REGISTRY]

    @property
    def settings(self) -> Settings:
        """The app's settings."""
        return self._app[SETTINGS]

    async def _open(
        self, method: str, call: UpstreamCall, body: bytes | None
    ) -> aiohttp.ClientResponse:
        response, waited_s = await open_upstream(
            self._app[UPSTREAM_CLIENT],
            method,
            call.url,
            call.headers,
            body,
            headers_timeout_s=self.settings.upstream.headers_timeout_s,
        )
        self._app[METRICS].upstream_headers_seconds.observe(waited_s)
        return response

    def _reopener(self, call: UpstreamCall) -> Any:
        async def reopen(last_event_id: str) -> Chunks | None:
            try:
                response = await self._open(
                    "GET", UpstreamCall(call.url, _reopen_headers(call, last_event_id)), None
                )
            except UpstreamError:
                return None
            if not _is_event_stream(response):
                response.close()
                return None
            return _chunks(response)

        return reopen

    # POST ---------------------------------------------------------------------------------

    async def post(
        self,
        request: web.Request,
        *,
        session_id: str,
        era: Era,
        call: UpstreamCall,
        body: bytes | None,
        request_ids: list[jsonrpc.JSONRPCId],
    ) -> web.StreamResponse:
        """Forward a POST of a resumable session; an SSE answer becomes a managed stream.

        A POST carrying JSON-RPC requests gets its stream life stored before anything is
        forwarded, so the store's bounds refuse it (503) before the upstream runs anything.

        Raises:
            GatewayBusy: this replica pumps ``server.max_pumps`` streams already (503).
            StoreLimitExceeded: the session holds ``max_streams_per_session`` open streams.
            UpstreamError: the upstream failed before its response headers (502).
        """
        if request_ids:
            # Only a request starts a pump; notifications and answers to the server's requests
            # (which running calls wait for) always go through.
            self._check_pump_capacity(standalone=False)
        life = (
            await self._new_request_stream(session_id, request_ids, call) if request_ids else None
        )
        opened: asyncio.Future[tuple[aiohttp.ClientResponse, str | None]] = (
            asyncio.get_running_loop().create_future()
        )
        self.registry.spawn(
            self._start_post(
                session_id=session_id,
                call=call,
                body=body,
                request_ids=request_ids,
                life=life,
                opened=opened,
            ),
            name="post.open",
        )
        try:
            # Waiting on the future, not the task: a client that leaves cancels only the wait.
            await asyncio.wait({opened})
        except asyncio.CancelledError:
            opened.add_done_callback(_close_unclaimed)
            raise
        response, life = opened.result()
        if life is None:
            async with response:
                return await relay_response(request, response)
        response_headers = _relayed_headers(response)
        out, delivery = await deliver(
            request,
            store=self.store,
            registry=self.registry,
            settings=self.settings,
            session_id=session_id,
            session_key=session_digest(session_id),
            life=life,
            cursor=0,
            primes=era.primes,
            headers=response_headers,
        )
        log.info("stream.delivered", life=life[:8], events=delivery.events, ended=delivery.ended)
        return out

    def _check_pump_capacity(self, *, standalone: bool) -> None:
        """Refuse a new upstream stream beyond ``server.max_pumps`` (running ones go on).

        Request pumps and standalone pumps are bounded separately, so standalone GETs (which
        run on while the session lives) can never use up what tool calls need.

        Raises:
            GatewayBusy: the bound is reached.
        """
        limit = self.settings.server.max_pumps
        standalone_pumps = len(self.registry.standalone)
        running = standalone_pumps if standalone else self.registry.tasks - standalone_pumps
        if running >= limit:
            kind = "standalone" if standalone else "request"
            self._app[METRICS].rejected.labels("pumps").inc()
            log.warning("stream.refused_capacity", kind=kind, pumps=running, limit=limit)
            raise GatewayBusy

    async def _new_request_stream(
        self, session_id: str, request_ids: list[jsonrpc.JSONRPCId], call: UpstreamCall
    ) -> str:
        """Create a request stream life owned by this replica and return it.

        Its pending errors are those of *request_ids* (see ``EventStore.end_orphaned``); it is
        bound to the credentials of the POST (*call*) that creates it (DESIGN D8).

        Raises:
            StoreLimitExceeded: the session holds ``max_streams_per_session`` open streams.
        """
        life = new_life()
        await self.store.create_stream(
            session_id,
            life,
            kind="request",
            owner=self._app[REPLICA_ID],
            pending=pending_errors(request_ids),
            auth=call.auth,
            creator=call.creator,
        )
        return life

    async def _start_post(
        self,
        *,
        session_id: str,
        call: UpstreamCall,
        body: bytes | None,
        request_ids: list[jsonrpc.JSONRPCId],
        life: str | None,
        opened: asyncio.Future[tuple[aiohttp.ClientResponse, str | None]],
    ) -> None:
        try:
            response = await self._open("POST", call, body)
            if not _is_event_stream(response):
                if life is not None:
                    await self.store.drop_stream(session_id, life)
                opened.set_result((response, None))
                return
            if life is None:
                # An event stream answering only notifications or responses: unusual, kept.
                life = await self._new_request_stream(session_id, request_ids, call)
        except BaseException as exc:
            if life is not None:
                with contextlib.suppress(StoreError, StreamError):
                    await self.store.drop_stream(session_id, life)
            if not opened.done():
                opened.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        # The feed exists before the client's connection attaches: it reads the live tail
        # from memory from its first event on.
        key = (session_digest(session_id), life)
        feed = self.registry.feeds[key] = LocalFeed(
            max_lost_events=self.settings.store.max_events_per_stream
        )
        opened.set_result((response, life))
        try:
            result = await run_pump(
                self.store,
                session_id,
                life,
                _chunks(response),
                request_ids=request_ids,
                max_event_bytes=self.settings.store.max_event_bytes,
                reopen=self._reopener(call),
                feed=feed,
                on_store_lost=lambda: self._store_lost(session_id, life, feed),
            )
        finally:
            if not feed.lost and self.registry.feeds.get(key) is feed:
                del self.registry.feeds[key]
        metrics = self._app[METRICS]
        metrics.events_stored.inc(result.events)
        if result.broken:
            metrics.pumps_broken.inc()
        log.info(
            "stream.finished",
            life=life[:8],
            events=result.events,
            broken=result.broken,
            pending=len(result.pending),
        )

    def _store_lost(self, session_id: str, life: str, feed: LocalFeed) -> None:
        """The pump could not store an event: the feed carries the stream on; retire the life."""
        self._app[METRICS].streams_store_lost.inc()
        self.registry.spawn(self._retire(session_id, life, feed), name="stream.retire")

    async def _retire(self, session_id: str, life: str, feed: LocalFeed) -> None:
        """Drop a stream life that has a gap from the store (so resumes get 400), then the feed.

        Retries while the store is down, for at most ``session_idle_ttl_s`` (by then the
        stream's keys expired anyway).
        """
        key = (session_digest(session_id), life)
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.settings.store.session_idle_ttl_s
        delay_s = RETIRE_BACKOFF_S[0]
        try:
            while True:
                try:
                    await self.store.drop_stream(session_id, life)
                    log.info("stream.retired", life=life[:8])
                    break
                except StoreError:
                    if loop.time() >= give_up_at:
                        break
                await asyncio.sleep(delay_s * random.uniform(0.5, 1.0))  # noqa: S311 - jitter
                delay_s = min(delay_s * 2, RETIRE_BACKOFF_S[1])
            # Keep the feed until the pump closed it, then while its reader drains it (bounded).
            while not feed.done:
                await feed.wait(feed.end, FEED_GRACE_S)
            if self.registry.attached(key):
                await asyncio.sleep(FEED_GRACE_S)
        finally:
            if self.registry.feeds.get(key) is feed:
                del self.registry.feeds[key]

    # GET ----------------------------------------------------------------------------------

    async def resume(
        self,
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
        cursor = parse_event_id(last_event_id)
        if cursor is None:
            raise InvalidEventId
        info = await self.store.stream_info(session_id, cursor.life)
        if info is None:
            raise UnknownStream
        if cursor.offset > info.last_offset:
            raise InvalidEventId
        if cursor.offset + 1 < info.first_offset:
            raise CursorGone
        refused = await self._authorize(request, session_id, info, call, record)
        if refused is not None:
            return refused
        if info.finished and cursor.offset >= info.last_offset:
            # 204 makes EventSource and the SDK clients stop reconnecting: nothing will follow.
            return web.Response(status=204, headers={"Content-Type": "text/event-stream"})
        if info.kind == "standalone":
            await self._ensure_standalone(request, session_id, None)
        check_owner = self._owner_check(session_id, info)
        if check_owner is not None and not info.finished:
            await check_owner()
        out, delivery = await deliver(
            request,
            store=self.store,
            registry=self.registry,
            settings=self.settings,
            session_id=session_id,
            session_key=session_digest(session_id),
            life=cursor.life,
            cursor=cursor.offset,
            primes=era.primes,
            resuming=True,
            check_owner=check_owner,
        )
        log.info(
            "stream.resumed",
            life=cursor.life[:8],
            from_offset=cursor.offset,
            events=delivery.events,
            ended=delivery.ended,
        )
        return out

    async def _authorize(
        self,
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
        return await self._app[AUTHORIZER].authorize(
            request,
            session_id=session_id,
            binding=binding,
            url=call.url,
            headers=call.headers,
            protocol_version=record.protocol_version if record else None,
        )

    def _owner_check(
        self, session_id: str, info: StreamInfo
    ) -> Callable[[], Awaitable[bool]] | None:
        """For a request stream another replica writes: end it if that replica died (D7).

        It runs when a resume starts and then every ``store.heartbeat_s`` while the stream is
        idle. An owner seen alive is taken as alive for a quarter of ``heartbeat_s`` by every
        reader on this replica: one store command per owner and period, however many clients
        wait. The stream is ended with the JSON-RPC errors its writer left pending, exactly
        once whichever replicas check at the same time.
        """
        if info.kind != "request" or info.owner == self._app[REPLICA_ID]:
            return None
        alive_until = self.registry.owners_alive_until
        cache_s = self.settings.store.heartbeat_s / 4

        async def check() -> bool:
            now = time.monotonic()
            if alive_until.get(info.owner, 0.0) > now:
                return False
            if await self.store.replica_alive(info.owner):
                if len(alive_until) >= MAX_KNOWN_OWNERS:
                    alive_until.clear()
                alive_until[info.owner] = now + cache_s
                return False
            alive_until.pop(info.owner, None)
            ended = await self.store.end_orphaned(session_id, info.life)
            if ended:
                self._app[METRICS].streams_orphaned.inc()
                log.warning("stream.orphan_ended", life=info.life[:8])
            return ended

        return check

    async def standalone(
        self,
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
        life = standalone_life(session_id)
        refused = await self._ensure_standalone(request, session_id, call, record)
        if refused is not None:
            return refused
        info = await self.store.stream_info(session_id, life)
        cursor = info.last_offset if info is not None else 0
        out, _ = await deliver(
            request,
            store=self.store,
            registry=self.registry,
            settings=self.settings,
            session_id=session_id,
            session_key=session_digest(session_id),
            life=life,
            cursor=cursor,
            primes=era.primes,
        )
        return out

    async def _ensure_standalone(
        self,
        request: web.Request,
        session_id: str,
        call: UpstreamCall | None,
        record: SessionRecord | None = None,
    ) -> web.StreamResponse | None:
        """Keep one upstream GET open for the session; relay the upstream's refusal if any.

        Serialised per session, so concurrent client GETs never open two upstream GETs. A
        client GET joining the open one is authorized (D8) before its headers become the ones
        that re-open the upstream GET.
        """
        if call is None:
            return None
        key = session_digest(session_id)
        life = standalone_life(session_id)
        authorized = False
        if self._standalone_running(key):
            # Authorized before the session's lock: a flood of refused GETs must not queue the
            # creator's own behind their probes.
            refused = await self._authorize_join(request, session_id, life, call, record)
            if refused is not None:
                return refused
            authorized = True
        async with self.registry.standalone_lock(key):
            if self._standalone_running(key):
                if not authorized:  # it started while this request waited for the lock
                    refused = await self._authorize_join(request, session_id, life, call, record)
                    if refused is not None:
                        return refused
                self.registry.standalone_calls[key] = call
                return None
            return await self._open_standalone(request, session_id, life, call)

    def _standalone_running(self, key: str) -> bool:
        running = self.registry.standalone.get(key)
        return running is not None and not running.done()

    async def _authorize_join(
        self,
        request: web.Request,
        session_id: str,
        life: str,
        call: UpstreamCall,
        record: SessionRecord | None,
    ) -> web.StreamResponse | None:
        info = await self.store.stream_info(session_id, life)
        return await self._authorize(request, session_id, info, call, record)

    async def _open_standalone(
        self, request: web.Request, session_id: str, life: str, call: UpstreamCall
    ) -> web.StreamResponse | None:
        """Open the session's upstream GET with *call* and start its pump (under the lock)."""
        key = session_digest(session_id)
        self._check_pump_capacity(standalone=True)
        response = await self._open("GET", call, None)
        if not _is_event_stream(response):
            async with response:
                return await relay_response(request, response)
        self.registry.standalone_calls[key] = call
        if await self.store.get_session(session_id, refresh=False) is None:
            # A session the gateway has no record of (it predates this gateway, or its
            # record expired) but the upstream accepts: keep a record of unknown version, so
            # the stream's idle timeout applies to it like to any other session (D2, D5).
            await self.store.record_session(session_id, "", auth=call.auth)
        info = await self.store.stream_info(session_id, life)
        if info is None:
            await self._create_standalone(session_id, life, call.auth)
        self.registry.standalone[key] = self.registry.spawn(
            self._standalone_pump(session_id, life, call, response), name="standalone.pump"
        )
        return None

    async def _standalone_pump(
        self, session_id: str, life: str, call: UpstreamCall, response: aiohttp.ClientResponse
    ) -> None:
        """Keep the session's upstream GET read into the store while the session lives (D5).

        Re-opens it (with the newest client GET's headers, after ``retry_ms`` growing
        exponentially with jitter up to :data:`STANDALONE_BACKOFF_MAX_S` while it fails) when
        the upstream closes it. Stops on DELETE (tombstone), when the session's record expires
        (idle timeout), when the upstream refuses the GET (400/401/403/404/405: the next client
        GET tries again with its own headers and gets the refusal relayed), and on shutdown.
        """
        key = session_digest(session_id)
        base_s = max(self.settings.sse.retry_ms / 1000, STANDALONE_BACKOFF_MIN_S)
        try:
            while True:
                ended = await self._run_standalone_body(session_id, life, response)
                if ended == "gone":
                    return
                failures = 0
                while True:
                    delay_s = min(base_s * 2**failures, STANDALONE_BACKOFF_MAX_S)
                    await asyncio.sleep(delay_s * random.uniform(0.5, 1.0))  # noqa: S311
                    latest = self.registry.standalone_calls.get(key, call)
                    try:
                        if not await self._session_alive(session_id):
                            return
                        await self._restart_if_lost(
                            session_id, life, lost=ended == "store_lost", auth=latest.auth
                        )
                        ended = "ended"
                    except StoreError:
                        failures += 1
                        continue
                    try:
                        reopened = await self._open("GET", latest, None)
                    except UpstreamError:
                        failures += 1
                        continue
                    if _is_event_stream(reopened):
                        response = reopened
                        break
                    reopened.close()
                    if reopened.status in _STANDALONE_STOP:
                        log.info("standalone.refused", status=reopened.status)
                        return
                    failures += 1
        finally:
            if self.registry.standalone.get(key) is asyncio.current_task():
                del self.registry.standalone[key]
                self.registry.forget_standalone(key)

    async def _restart_if_lost(self, session_id: str, life: str, *, lost: bool, auth: str) -> None:
        """Start the standalone life again if events were lost (outage, Redis restarted empty).

        It starts after every offset it used, so the cursors clients hold get 400, not a gap.
        *auth* binds it to the credentials that re-open its upstream GET.
        """
        if lost or await self.store.stream_info(session_id, life) is None:
            await self.store.drop_stream(session_id, life)
            await self._create_standalone(session_id, life, auth)

    async def _create_standalone(self, session_id: str, life: str, auth: str) -> None:
        """Create (again) the session's standalone stream life (D5).

        Its offsets start after the current time in microseconds: larger than any offset an
        earlier incarnation of this life (same id) used, unless it stored more than a million
        events per second.
        """
        await self.store.create_stream(
            session_id,
            life,
            kind="standalone",
            owner=self._app[REPLICA_ID],
            start_after=time.time_ns() // 1000,
            auth=auth,
        )

    async def _session_alive(self, session_id: str) -> bool:
        if self.registry.closing:
            return False
        record = await self.store.get_session(session_id, refresh=False)
        return record is not None and not record.deleted

    async def _run_standalone_body(
        self, session_id: str, life: str, response: aiohttp.ClientResponse
    ) -> str:
        """Pump one upstream GET body.

        Returns:
            ``gone`` when the session is gone (stop for good), ``store_lost`` when events could
            not be stored (the life must start again), else ``ended``.

        A watchdog checks the session every ``session_idle_ttl_s / 4`` seconds (at most a
        minute): an upstream GET that never ends must not keep an idle session's pump alive.
        """
        check_s = min(self.settings.store.session_idle_ttl_s / 4, STANDALONE_CHECK_MAX_S)
        pump = asyncio.ensure_future(
            run_pump(
                self.store,
                session_id,
                life,
                _chunks(response),
                request_ids=[],
                max_event_bytes=self.settings.store.max_event_bytes,
                finish=False,
            )
        )
        try:
            while not pump.done():
                await asyncio.wait({pump}, timeout=check_s)
                if not pump.done() and not await self._session_alive(session_id):
                    return "gone"
        finally:
            if not pump.done():
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pump
        if not pump.cancelled() and pump.result().store_lost:
            self._app[METRICS].streams_store_lost.inc()
            return "store_lost"
        try:
            return "ended" if await self._session_alive(session_id) else "gone"
        except StoreError:
            return "store_lost"


def _close_unclaimed(future: asyncio.Future[tuple[aiohttp.ClientResponse, str | None]]) -> None:
    """The client left before the upstream answered: close a non-stream answer nobody reads."""
    if future.cancelled() or future.exception() is not None:
        return
    response, life = future.result()
    if life is None:
        response.close()


__all__ = ["SSE_RESPONSE_HEADERS", "ManagedStreams", "UpstreamCall", "standalone_life"]
