"""Pass-through relay of one upstream response: status, headers and body as they are (D3).

Used for every answer that is not a managed stream: JSON, 202, 3xx, 4xx/5xx, any other path, and
event streams of requests without a session (initialize, stateless servers), which are relayed
chunk by chunk as they arrive, never buffered, and read on the side only to record an
InitializeResult.
"""

from __future__ import annotations

import contextlib
import re
from http import HTTPStatus

import structlog
from aiohttp import web

from mcp_sse_gateway import jsonrpc
from mcp_sse_gateway.config import Settings
from mcp_sse_gateway.errors import SSEError, StoreError, UpstreamBroken
from mcp_sse_gateway.headers import client_response_headers
from mcp_sse_gateway.sse import SSEDecoder
from mcp_sse_gateway.store.base import session_digest
from mcp_sse_gateway.streams.upstream import UpstreamResponse
from mcp_sse_gateway.web.keys import AUTHORIZER, METRICS, SETTINGS, STORE

log = structlog.get_logger("mcp_sse_gateway.relay")

#: Response headers every relayed event stream carries: no caching or transformation by
#: intermediaries, no buffering by nginx-style proxies (aiohttp-sse, mercure).
SSE_HEADERS = {"Cache-Control": "no-cache, no-transform", "X-Accel-Buffering": "no"}
_VERSION_LABEL = re.compile(r"\A\d{4}-\d{2}-\d{2}\Z")
_BODYLESS_STATUS = frozenset({HTTPStatus.NO_CONTENT, HTTPStatus.NOT_MODIFIED})


def _is_event_stream(response: UpstreamResponse) -> bool:
    return response.content_type == "text/event-stream"


async def relay_response(
    request: web.Request, response: UpstreamResponse, *, record_initialize: bool = False
) -> web.StreamResponse:
    """Relay an upstream response as it is, status and headers included.

    An event stream goes chunk by chunk as it arrives; any other body is streamed through.
    """
    if _is_event_stream(response):
        return await _relay_event_stream(request, response, record_initialize=record_initialize)
    return await _relay_body(request, response)


async def _record_initialize(
    request: web.Request, response: UpstreamResponse, messages: list[dict[str, object]] | None
) -> None:
    """Record the session's protocol version from an InitializeResult, if one is present."""
    version = jsonrpc.initialize_version(messages)
    session_id = response.header("Mcp-Session-Id")
    if version is None or not session_id:
        return
    try:
        await request.app[STORE].record_session(
            session_id, version, auth=request.app[AUTHORIZER].binding(request)[0]
        )
    except StoreError:
        # The session still works; it is treated as one the gateway has no record of (D2).
        log.warning("session.record_failed", protocol_version=version)
        return
    label = version if _VERSION_LABEL.match(version) else "other"
    request.app[METRICS].sessions_recorded.labels(label).inc()
    # The request had no session yet (its context's is null): the line names the new one.
    log.info("session.recorded", protocol_version=version, session=session_digest(session_id)[:12])


def _client_response(response: UpstreamResponse, *, keep_length: bool) -> web.StreamResponse:
    out = web.StreamResponse(status=response.status, reason=response.reason)
    for name, value in client_response_headers(list(response.headers), keep_length=keep_length):
        out.headers.add(name, value)
    return out


async def _relay_body(request: web.Request, response: UpstreamResponse) -> web.StreamResponse:
    """Relay status, headers and body as they are, streaming the body chunk by chunk."""
    bodyless = request.method == "HEAD" or response.status in _BODYLESS_STATUS
    out = _client_response(response, keep_length=True)
    await out.prepare(request)
    if bodyless:
        await out.write_eof()
    else:
        await _copy_body(request, out, response)
    return out


async def _copy_body(
    request: web.Request, out: web.StreamResponse, response: UpstreamResponse, head: bytes = b""
) -> None:
    """Write *head*, then the rest of *response*'s body, then end *out*.

    A body that breaks off upstream is cut at the client too (the connection is aborted), so
    the client sees a truncated body, never one that looks complete.
    """
    try:
        if head:
            await out.write(head)
        async for chunk in response.chunks():
            await out.write(chunk)
    except UpstreamBroken:
        log.warning("upstream.body_broken")
        if request.transport is not None:
            request.transport.abort()
        return
    await out.write_eof()


async def relay_initialize_json(
    request: web.Request, response: UpstreamResponse, settings: Settings
) -> web.StreamResponse:
    """Relay a JSON answer to initialize, recording the session's version from it.

    The body is read whole (at most ``store.max_event_bytes``; a bigger one is relayed unparsed).
    """
    limit = settings.store.max_event_bytes
    body = bytearray()
    async for chunk in response.chunks():
        body += chunk
        if len(body) > limit:
            # Too big to be an InitializeResult worth parsing: relay the rest unparsed.
            out = _client_response(response, keep_length=True)
            await out.prepare(request)
            await _copy_body(request, out, response, bytes(body))
            return out
    await _record_initialize(request, response, jsonrpc.parse_messages(bytes(body)))
    out = _client_response(response, keep_length=True)
    await out.prepare(request)
    await out.write(bytes(body))
    await out.write_eof()
    return out


async def _relay_event_stream(
    request: web.Request, response: UpstreamResponse, *, record_initialize: bool
) -> web.StreamResponse:
    """Relay an SSE response chunk by chunk as it arrives, never compressed or buffered.

    When the client goes away the handler is cancelled and the upstream request is closed with
    it (pass-through: the client's disconnect is mirrored upstream).
    """
    metrics = request.app[METRICS]
    out = _client_response(response, keep_length=False)
    out.headers.update(SSE_HEADERS)
    decoder = SSEDecoder(max_event_bytes=request.app[SETTINGS].store.max_event_bytes)
    watching = record_initialize
    await out.prepare(request)
    metrics.streams_active.inc()
    try:
        async for chunk in response.chunks():
            try:
                await out.write(chunk)
            except ConnectionResetError:
                log.info("client.disconnected")
                return out
            if watching:
                watching = await _watch_initialize(request, response, decoder, chunk)
    except UpstreamBroken:
        # The upstream broke mid-stream; the client sees the stream end (it may retry).
        log.warning("upstream.stream_broken")
    finally:
        metrics.streams_active.dec()
    with contextlib.suppress(ConnectionResetError):
        await out.write_eof()
    return out


async def _watch_initialize(
    request: web.Request, response: UpstreamResponse, decoder: SSEDecoder, chunk: bytes
) -> bool:
    """Feed the decoder; record the InitializeResult when it passes. False once done."""
    try:
        events = decoder.feed(chunk)
    except SSEError:
        return False
    for event in events:
        if event.data:
            messages = jsonrpc.parse_messages(event.data)
            if jsonrpc.initialize_version(messages) is not None:
                await _record_initialize(request, response, messages)
                return False
    return True
