"""The transparent relay (DESIGN D3): every request goes to the one configured upstream.

On the MCP endpoint the gateway also reads what it must know: the request's JSON-RPC messages
and, for an initialize, the ``protocolVersion`` of the InitializeResult (JSON body or SSE event)
together with the ``Mcp-Session-Id`` response header, which it records in the store (D2).
Every other path (OAuth discovery under ``/.well-known/``, anything the server serves) is
relayed untouched.

Bodies and streams are relayed as they arrive, chunk by chunk: nothing is buffered except a
JSON answer to an initialize, which must be parsed (bounded by ``store.max_event_bytes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from http import HTTPStatus
from typing import Any

import structlog
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError
from yarl import URL

from mcp_sse_gateway import jsonrpc
from mcp_sse_gateway.config import Settings
from mcp_sse_gateway.eras import Era, era_for
from mcp_sse_gateway.errors import (
    AmbiguousPath,
    BadBody,
    BodyTimeout,
    BodyTooLarge,
    GatewayBusy,
    HostNotAllowed,
    InvalidEventId,
    OriginNotAllowed,
    RepeatedHeader,
    SessionGone,
    StoreBusy,
    StoreError,
    StoreUnavailable,
)
from mcp_sse_gateway.headers import (
    host_allowed,
    origin_allowed,
    peer_trusted,
    upstream_request_headers,
)
from mcp_sse_gateway.metrics import CONTENT_TYPE_LATEST
from mcp_sse_gateway.paths import PathRole, path_role
from mcp_sse_gateway.store.base import SessionRecord
from mcp_sse_gateway.streams.upstream import UpstreamCall
from mcp_sse_gateway.tracing import METHOD
from mcp_sse_gateway.web import managed, tasks
from mcp_sse_gateway.web.keys import (
    AUTHORIZER,
    BUFFERED_BYTES,
    JSONRPC_REQUEST_ID,
    METRICS,
    SETTINGS,
    STATE,
    STORE,
    TRACING,
    UPSTREAM,
)
from mcp_sse_gateway.web.passthrough import relay_initialize_json, relay_response

log = structlog.get_logger("mcp_sse_gateway.relay")

#: How long ``/readyz`` waits for the store's answer before reporting it unavailable, seconds.
READY_STORE_PING_S = 0.5


def check_request_allowed(request: web.Request, settings: Settings) -> None:
    """Refuse requests whose ``Host`` or ``Origin`` is not allowed (DNS rebinding).

    Raises:
        HostNotAllowed: the Host header is missing or not in ``server.allowed_hosts``.
        OriginNotAllowed: an Origin header is present and not in ``server.allowed_origins``.
    """
    metrics = request.app[METRICS]
    if not host_allowed(request.headers.get("Host"), settings.server.allowed_hosts):
        metrics.rejected.labels("host").inc()
        raise HostNotAllowed
    if not origin_allowed(request.headers.get("Origin"), settings.server.allowed_origins):
        metrics.rejected.labels("origin").inc()
        raise OriginNotAllowed


async def read_body(
    request: web.Request, limit_bytes: int, timeout_s: float | None = None
) -> bytes | None:
    """The whole request body, or None when the request has none.

    Raises:
        BodyTooLarge: the declared or actual length exceeds *limit_bytes* (read stops there).
        BodyTimeout: the body did not arrive whole within *timeout_s* seconds.
        GatewayBusy: the bodies held by all requests would exceed
            ``server.max_buffered_body_bytes``.
    """
    if request.content_length is not None and request.content_length > limit_bytes:
        raise BodyTooLarge
    if not request.body_exists:
        return None
    content = request.content
    if content.is_eof() and content.exception() is None:
        # The whole body came with the headers (a JSON-RPC message commonly does): taken
        # without a wait, so without the iterator and the timer.
        whole = content.read_nowait()
        _hold_body(request, len(whole), len(whole), limit_bytes)
        return whole
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in content.iter_any():
                size += len(chunk)
                _hold_body(request, size, len(chunk), limit_bytes)
                chunks.append(chunk)
    except TimeoutError:
        request.app[METRICS].rejected.labels("body_timeout").inc()
        raise BodyTimeout from None
    except RequestPayloadError:
        raise BadBody from None  # a broken content coding (the connection is reset otherwise)
    return b"".join(chunks)


def _hold_body(request: web.Request, size: int, added: int, limit_bytes: int) -> None:
    """Count *added* bytes of a body read *size* bytes far, or refuse it (see read_body)."""
    if size > limit_bytes:
        raise BodyTooLarge
    state = request.app[STATE]
    if state.buffered_bytes + added > request.app[SETTINGS].server.max_buffered_body_bytes:
        request.app[METRICS].rejected.labels("buffered_bodies").inc()
        raise GatewayBusy
    # Released when the request ends (web.middleware.request_limit).
    state.buffered_bytes += added
    request[BUFFERED_BYTES] = request.get(BUFFERED_BYTES, 0) + added


def _forward_headers(
    request: web.Request, settings: Settings, *, mcp: bool
) -> list[tuple[str, str]]:
    peer = request.remote
    trusted = peer_trusted(peer, settings.server.trusted_proxies)
    principal_header = request.app[AUTHORIZER].reader.principal_header
    return upstream_request_headers(
        list(request.headers.items()),
        mcp_endpoint=mcp,
        peer=peer,
        scheme=request.scheme,
        host=request.headers.get("Host"),
        trusted_peer=trusted,
        # Only a trusted proxy may assert who the client is; anyone else's claim is dropped.
        drop_names=frozenset({principal_header, principal_header.replace("_", "-")})
        if principal_header and not trusted
        else frozenset(),
    )


@functools.lru_cache(maxsize=8)
def _configured_url(url: str) -> URL:
    """The configured upstream URL, parsed once per value (settings do not change)."""
    return URL(url)


def upstream_url_for(request: web.Request, settings: Settings, *, mcp: bool) -> URL:
    """The upstream URL of a request: always the configured origin, never one from the request.

    The MCP endpoint maps to the configured upstream path; any other path keeps its own path
    and query, relative to the upstream's origin.
    """
    configured = _configured_url(str(settings.upstream.url))
    rel = request.rel_url
    if mcp:
        path = configured.raw_path
        query = rel.raw_query_string or configured.raw_query_string
    else:
        path, query = rel.raw_path, rel.raw_query_string
    return URL.build(
        scheme=configured.scheme,
        user=configured.raw_user,
        password=configured.raw_password,
        host=configured.raw_host or "",
        port=configured.explicit_port,
        path=path,
        query_string=query,
        encoded=True,
    )


def _session_id(request: web.Request) -> str | None:
    """The request's ``Mcp-Session-Id``, or None.

    Raises:
        RepeatedHeader: it was sent more than once (the gateway would act on one, an upstream
            might read the other).
    """
    if len(request.headers.getall("Mcp-Session-Id", ())) > 1:
        raise RepeatedHeader
    return request.headers.get("Mcp-Session-Id") or None


async def relay_mcp(request: web.Request) -> web.StreamResponse:
    """Serve one request on the MCP endpoint, by era (D2) and method (D3).

    * no ``Mcp-Session-Id``: relayed as is (initialize answers are read to record the session),
      but for the task surface of the 2026-07-28 era with ``[tasks]`` on (D11: :mod:`.tasks`);
    * GET + ``Last-Event-ID``: resumed from the store, never forwarded (D6);
    * GET on a resumable session: the session's standalone stream (D5);
    * POST on a resumable session: an SSE answer becomes a managed stream (D4);
    * anything else (DELETE, OPTIONS …): relayed as is; a DELETE also purges the session.

    Raises:
        SessionGone: the session was deleted (404, as the upstream said).
        StreamError: a ``Last-Event-ID`` that cannot be resumed (400).
    """
    settings = request.app[SETTINGS]
    check_request_allowed(request, settings)
    session_id = _session_id(request)
    last_event_id = request.headers.get("Last-Event-ID")
    if request.method == "GET" and last_event_id is not None and session_id is None:
        raise InvalidEventId
    era = Era.PASS_THROUGH
    record = None
    if session_id is not None:
        try:
            record = await request.app[STORE].get_session(session_id)
        except StoreUnavailable as refusal:
            await _note_id_before_refusal(request, settings, refusal)
            raise
        if record is not None and record.deleted:
            raise SessionGone
        era = era_for(session_id, record.protocol_version if record else None)
    body = await read_body(request, settings.server.max_body_bytes, settings.server.body_timeout_s)
    authorizer = request.app[AUTHORIZER]
    binding, creator = authorizer.binding(request) if session_id is not None else ("", "")
    messages = jsonrpc.parse_messages(body) if request.method == "POST" and body else None
    _annotate_method(request, messages)
    _note_request_id(request, body, messages)
    call = UpstreamCall(
        upstream_url_for(request, settings, mcp=True),
        _forward_headers(request, settings, mcp=True),
        auth=binding,
        creator=creator,
    )
    if session_id is not None and era.resumable and request.method in {"GET", "POST"}:
        return await _serve_managed(
            request, session_id, era, call, record, body, messages, last_event_id
        )
    answered = await tasks.serve(request, session_id, body, messages, call)
    if answered is not None:
        return answered
    initialize = request.method == "POST" and jsonrpc.is_initialize(messages)
    response = await request.app[UPSTREAM].open(request.method, call.url, call.headers, body)
    async with response:
        # A 404 for a session the gateway never saw is not remembered: random DELETEs must not
        # fill the store with tombstones. Nor is one answered to another user than the session's
        # creator: an upstream that binds sessions to users answers them 404 too (D8).
        if (
            request.method == "DELETE"
            and session_id
            and (
                # 2xx only: aiohttp's ``ok`` is any status below 400, and a front that redirects
                # unauthenticated requests (SSO) answers a stranger's DELETE with 302.
                HTTPStatus.OK <= response.status < HTTPStatus.MULTIPLE_CHOICES
                or (
                    response.status == HTTPStatus.NOT_FOUND
                    and record is not None
                    and authorizer.may_end_session(record.auth, request)
                )
            )
        ):
            with contextlib.suppress(StoreError):
                await request.app[STORE].tombstone_session(session_id)
        if initialize and response.content_type == "application/json":
            return await relay_initialize_json(request, response, settings)
        return await relay_response(request, response, record_initialize=initialize)


async def _serve_managed(  # noqa: PLR0917 - one request's parts
    request: web.Request,
    session_id: str,
    era: Era,
    call: UpstreamCall,
    record: SessionRecord | None,
    body: bytes | None,
    messages: list[dict[str, Any]] | None,
    last_event_id: str | None,
) -> web.StreamResponse:
    """A GET or POST of a resumable session: a resume, the standalone stream, or a POST."""
    if request.method == "GET" and last_event_id is not None:
        return await managed.resume(
            request,
            session_id=session_id,
            era=era,
            last_event_id=last_event_id,
            call=call,
            record=record,
        )
    if request.method == "GET":
        return await managed.standalone(
            request, session_id=session_id, era=era, call=call, record=record
        )
    return await managed.post(
        request,
        session_id=session_id,
        era=era,
        call=call,
        body=body,
        request_ids=jsonrpc.request_ids(messages or []),
        method=jsonrpc.method_name(messages),
        upgrade=managed.upgrades(request, body, messages),
    )


async def _note_id_before_refusal(
    request: web.Request, settings: Settings, refusal: StoreUnavailable
) -> None:
    """Read a POST's body for the id its 503 carries (the store is unreachable).

    The body is read as it would have been with the store up, bounded the same way: a body
    that cannot be read gets that answer instead (413, 408, 400, or 503 for no room), as it
    would have. A refusal for load (:class:`~mcp_sse_gateway.errors.StoreBusy`: the store's
    queue is full) answers at once, its id ``null``: shedding load reads no body.
    """
    if request.method != "POST" or isinstance(refusal, StoreBusy):
        return
    body = await read_body(request, settings.server.max_body_bytes, settings.server.body_timeout_s)
    if body:
        _note_request_id(request, body, jsonrpc.parse_messages(body))


def _note_request_id(
    request: web.Request, body: bytes | None, messages: list[dict[str, Any]] | None
) -> None:
    """Keep the id of a body's lone JSON-RPC request for the gateway's errors to carry."""
    message = jsonrpc.lone_message(body, messages)
    ids = jsonrpc.request_ids([message]) if message is not None else []
    if ids:
        request[JSONRPC_REQUEST_ID] = ids[0]


def _annotate_method(request: web.Request, messages: list[dict[str, Any]] | None) -> None:
    """The JSON-RPC method on the request's span (tracing on)."""
    tracing = request.app[TRACING]
    if tracing.enabled and (method := jsonrpc.method_name(messages)) is not None:
        tracing.annotate(METHOD, method)


async def relay_other(request: web.Request) -> web.StreamResponse:
    """Relay a request on any path other than the MCP endpoint and the gateway's own.

    A path that normalizes to the MCP endpoint (``/a/../mcp``, ``/%6Dcp``) is served as it;
    a variant of it (``/MCP``, ``/mcp/``, ``/mcp;x``, ``/mcp%2F``, ``//mcp``) is refused
    (see :mod:`mcp_sse_gateway.paths`).

    Raises:
        AmbiguousPath: a variant of the MCP endpoint's path (400).
    """
    settings = request.app[SETTINGS]
    # The path of the target, also for an absolute-form one (POST http://host/MCP HTTP/1.1).
    role = path_role(request.rel_url.raw_path, settings.server.path)
    if role is PathRole.MCP:
        return await relay_mcp(request)
    check_request_allowed(request, settings)
    if role is PathRole.AMBIGUOUS:
        request.app[METRICS].rejected.labels("path").inc()
        log.info("request.ambiguous_path")
        raise AmbiguousPath
    body = await read_body(request, settings.server.max_body_bytes, settings.server.body_timeout_s)
    response = await request.app[UPSTREAM].open(
        request.method,
        upstream_url_for(request, settings, mcp=False),
        _forward_headers(request, settings, mcp=False),
        body,
    )
    async with response:
        return await relay_response(request, response)


async def health(request: web.Request) -> web.Response:  # noqa: ARG001 - aiohttp's handler shape
    """``/healthz``: 200 while the process serves requests (liveness)."""
    return web.json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    """``/readyz``: 503 while draining, else 200 with the store's state.

    A store outage does not make a replica unready: the store is shared, so every replica has
    the same outage, and taking them all out of the load balancer would also cut the clients
    that still receive their streams (from the pumps' local feeds). The body says
    ``{"status": "ready", "store": "ok" | "unavailable"}``; alert on the latter, or on
    ``mcp_sse_gateway_streams_store_lost_total``.
    """
    if request.app[STATE].draining:
        return web.json_response({"status": "draining"}, status=503)
    try:
        # Bounded well below any probe's timeout: a stalled store must not make every replica
        # look unready at once (it is shared), only be reported.
        async with asyncio.timeout(READY_STORE_PING_S):
            await request.app[STORE].ping()
    except (StoreError, TimeoutError):
        return web.json_response({"status": "ready", "store": "unavailable"})
    return web.json_response({"status": "ready", "store": "ok"})


async def metrics(request: web.Request) -> web.Response:
    """``/metrics``: Prometheus exposition text."""
    return web.Response(
        body=request.app[METRICS].render(), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )
