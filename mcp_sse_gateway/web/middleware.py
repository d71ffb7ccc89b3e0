"""Request middleware: the one table from errors to HTTP status, and the canonical log line.

Every error the gateway answers itself carries a JSON-RPC error body (MCP clients parse one)
and never a stack trace or a value taken from the request.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from http import HTTPStatus

import structlog
from aiohttp import web

from mcp_sse_gateway import jsonrpc
from mcp_sse_gateway.errors import (
    AmbiguousPath,
    AuthUnavailable,
    BadBody,
    BodyTimeout,
    BodyTooLarge,
    GatewayBusy,
    GatewayError,
    HostNotAllowed,
    MethodNotAllowed,
    OriginNotAllowed,
    RepeatedHeader,
    ResumeForbidden,
    SessionGone,
    ShuttingDown,
    StoreBusy,
    StoreLimitExceeded,
    StoreUnavailable,
    StreamError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeout,
)
from mcp_sse_gateway.store.base import session_digest
from mcp_sse_gateway.tracing import SESSION
from mcp_sse_gateway.web.keys import (
    BUFFERED_BYTES,
    JSONRPC_REQUEST_ID,
    METRICS,
    SETTINGS,
    STATE,
    TRACING,
)

log = structlog.get_logger("mcp_sse_gateway.request")

#: Error class → (HTTP status, JSON-RPC code, message). The first matching class in MRO order
#: wins. The gateway never answers 404 on its own: to MCP clients it means "session gone".
STATUS_BY_ERROR: dict[type[GatewayError], tuple[int, int, str]] = {
    HostNotAllowed: (403, -32600, "Forbidden: Host not allowed"),
    OriginNotAllowed: (403, -32600, "Forbidden: Origin not allowed"),
    BodyTooLarge: (413, -32600, "Request body too large"),
    BodyTimeout: (408, -32600, "Request body timed out"),
    BadBody: (400, -32600, "Bad Request: the body cannot be decoded"),
    ShuttingDown: (503, jsonrpc.UPSTREAM_UNAVAILABLE, "Gateway shutting down, retry"),
    GatewayBusy: (503, jsonrpc.UPSTREAM_UNAVAILABLE, "Gateway at capacity, retry later"),
    MethodNotAllowed: (405, -32600, "Method not allowed"),
    AmbiguousPath: (400, -32600, "Bad Request: ambiguous path"),
    RepeatedHeader: (400, -32600, "Bad Request: Mcp-Session-Id sent more than once"),
    ResumeForbidden: (403, -32600, "Forbidden: credentials may not resume this session"),
    AuthUnavailable: (503, jsonrpc.UPSTREAM_UNAVAILABLE, "Upstream authorization unavailable"),
    UpstreamConnectError: (502, jsonrpc.UPSTREAM_UNAVAILABLE, "Upstream unreachable"),
    UpstreamTimeout: (502, jsonrpc.UPSTREAM_UNAVAILABLE, "Upstream timed out"),
    UpstreamProtocolError: (502, jsonrpc.UPSTREAM_UNAVAILABLE, "Upstream failed"),
    UpstreamError: (502, jsonrpc.UPSTREAM_UNAVAILABLE, "Upstream failed"),
    StoreBusy: (503, jsonrpc.UPSTREAM_UNAVAILABLE, "Event store busy"),
    StoreUnavailable: (503, jsonrpc.UPSTREAM_UNAVAILABLE, "Event store unavailable"),
    StoreLimitExceeded: (503, jsonrpc.UPSTREAM_UNAVAILABLE, "Too many open streams"),
    StreamError: (400, -32600, "Bad Request: Last-Event-ID cannot be resumed"),
    SessionGone: (404, -32001, "Session not found"),
}
#: Store refusals counted in ``requests_rejected_total``, by reason.
_REFUSAL_REASONS: dict[type[GatewayError], str] = {
    StoreBusy: "store_busy",
    StoreLimitExceeded: "stream_limit",
    StoreUnavailable: "store_unavailable",
}
#: Logged (never sent) when the client went away before the answer: nginx's convention.
CLIENT_CLOSED_REQUEST = 499
#: Longer paths are cut in logs (they are client-controlled).
MAX_LOGGED_PATH = 256
#: Seconds a client is told to wait when the store is down.
STORE_RETRY_AFTER_S = 1
#: Paths never refused for capacity: probes must see a busy replica as alive and ready.
UNLIMITED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
#: Methods counted by name in metrics; any other is "OTHER" (labels stay bounded).
KNOWN_METHODS = frozenset({"GET", "POST", "DELETE", "HEAD", "OPTIONS", "PUT", "PATCH"})
#: A replica at capacity logs its refusals at most this often, seconds.
BUSY_LOG_INTERVAL_S = 1.0


def _status_for(exc: GatewayError) -> tuple[int, int, str]:
    for cls in type(exc).__mro__:
        if cls in STATUS_BY_ERROR:
            return STATUS_BY_ERROR[cls]
    return 500, -32603, "Internal error"


def error_response(exc: GatewayError, request_id: jsonrpc.JSONRPCId | None = None) -> web.Response:
    """The client-facing response for a gateway error: status from :data:`STATUS_BY_ERROR`.

    The JSON-RPC error carries *request_id*: the id of the lone request the body held, or None
    (``null``) when it cannot be determined (no body yet, a batch, a notification).
    """
    status, code, message = _status_for(exc)
    headers = (
        {"Retry-After": str(STORE_RETRY_AFTER_S)}
        if status == HTTPStatus.SERVICE_UNAVAILABLE
        else None
    )
    return web.Response(
        status=status,
        body=json.dumps(jsonrpc.error_response(request_id, code, message)).encode(),
        content_type="application/json",
        headers=headers,
    )


@web.middleware
async def request_context(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Bind per-request log context, map gateway errors, log one ``request.finished`` line."""
    structlog.contextvars.clear_contextvars()
    session_id = request.headers.get("Mcp-Session-Id")
    structlog.contextvars.bind_contextvars(
        request_id=os.urandom(8).hex(),  # 64 random bits, as 16 hex digits
        method=request.method,
        path=request.path[:MAX_LOGGED_PATH],
        session=session_digest(session_id)[:12] if session_id else None,
    )
    started = time.perf_counter()
    status = 500
    try:
        try:
            response = await handler(request)
        except GatewayError as exc:
            response = error_response(exc, request.get(JSONRPC_REQUEST_ID))
            if isinstance(exc, BodyTimeout):
                # The rest of the body may still trickle in: this connection cannot be reused.
                response.force_close()
            if (reason := _REFUSAL_REASONS.get(type(exc))) is not None:
                request.app[METRICS].rejected.labels(reason).inc()
            if isinstance(exc, UpstreamError):
                request.app[METRICS].upstream_errors.labels(type(exc).__name__).inc()
                log.warning("upstream.failed", error=type(exc).__name__, cause=repr(exc.__cause__))
        status = response.status
    except web.HTTPException as exc:
        status = exc.status
        raise
    except asyncio.CancelledError:
        status = CLIENT_CLOSED_REQUEST
        raise
    finally:
        method = request.method if request.method in KNOWN_METHODS else "OTHER"
        request.app[METRICS].count_request(method, f"{status // 100}xx")
        # Probes come every few seconds from every load balancer and kubelet: debug, unless
        # they failed.
        probe = request.path in UNLIMITED_PATHS and request.method in {"GET", "HEAD"}
        (log.debug if probe and status < HTTPStatus.BAD_REQUEST else log.info)(
            "request.finished",
            status=status,
            duration_ms=round((time.perf_counter() - started) * 1000, 2),
        )
    return response


@web.middleware
async def request_span(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """One server span per request (tracing on only), its parent from ``traceparent``.

    Probes are not traced (they come every few seconds). Attributes: method, path, status,
    the session digest; handlers add the JSON-RPC method. Never a header value or the query.
    """
    if request.path in UNLIMITED_PATHS and request.method in {"GET", "HEAD"}:
        return await handler(request)
    method = request.method if request.method in KNOWN_METHODS else "_OTHER"
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else ""
    session_id = request.headers.get("Mcp-Session-Id")
    attributes: dict[str, str | int] = {
        "http.request.method": method,
        "url.path": request.path[:MAX_LOGGED_PATH],
        "url.scheme": request.scheme,
    }
    if route:
        attributes["http.route"] = route
    if session_id:
        attributes[SESSION] = session_digest(session_id)[:12]
    with request.app[TRACING].span(
        f"{method} {route}" if route else method,
        kind="server",
        attributes=attributes,
        carrier=request.headers,
    ) as span:
        status = 500
        try:
            response = await handler(request)
            status = response.status
        except web.HTTPException as exc:
            status = exc.status
            raise
        except asyncio.CancelledError:
            status = CLIENT_CLOSED_REQUEST
            raise
        finally:
            span.set("http.response.status_code", status)
            if status >= HTTPStatus.INTERNAL_SERVER_ERROR:
                span.fail(str(status))
        return response


@web.middleware
async def request_limit(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Refuse requests beyond ``server.max_concurrent_requests`` (503 + ``Retry-After``).

    Open streams count for as long as they are open, so memory stays bounded under a flood.
    GETs of health, readiness and metrics are never refused (other methods there are relayed
    upstream like any path, and counted). A request let in starts when its loop turn has room
    (``server.max_requests_per_turn``, :mod:`.admission`), and counts while it waits.

    Raises:
        GatewayBusy: the replica serves as many requests as it may.
    """
    state = request.app[STATE]
    if request.path in UNLIMITED_PATHS and request.method in {"GET", "HEAD"}:
        try:
            return await handler(request)
        finally:
            # Relayed upstream when the gateway does not serve the path itself (metrics off).
            state.buffered_bytes -= request.get(BUFFERED_BYTES, 0)
    limit = request.app[SETTINGS].server.max_concurrent_requests
    if state.in_flight >= limit:
        request.app[METRICS].rejected.labels("capacity").inc()
        now = time.monotonic()
        if now - state.busy_logged_at >= BUSY_LOG_INTERVAL_S:
            state.busy_logged_at = now
            log.warning("request.refused_capacity", limit=limit)
        raise GatewayBusy
    state.in_flight += 1
    try:
        await state.admission.enter()
        return await handler(request)
    finally:
        state.in_flight -= 1
        state.buffered_bytes -= request.get(BUFFERED_BYTES, 0)
