"""The resume authorization probe (DESIGN D8): one ``ping`` to the upstream, and its answer.

:func:`send_probe` sends the upstream one JSON-RPC ``ping`` in the session, with the request's
own headers (its credentials), and reads what it answers into a :class:`ProbeAnswer`: a 2xx
body until the ping's response (:func:`answers`), a refusal's body to relay it
(:func:`refusal_response`), each at most :data:`PROBE_MAX_BODY_BYTES` and never stored.
:func:`probe_outcome` names the answer for metrics; what the client gets for each is decided by
:class:`~mcp_sse_gateway.web.authz.Authorizer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from dataclasses import dataclass, field
from http import HTTPStatus

import structlog
from aiohttp import web

from mcp_sse_gateway import jsonrpc
from mcp_sse_gateway.errors import SSEError, UpstreamBroken, UpstreamError
from mcp_sse_gateway.headers import client_response_headers
from mcp_sse_gateway.metrics import Metrics
from mcp_sse_gateway.sse import SSEDecoder
from mcp_sse_gateway.web.upstream import HttpResponse, HttpUpstream

log = structlog.get_logger("mcp_sse_gateway.auth")

#: At most this much of a probe's answer is read (never stored; relayed only with a refusal).
PROBE_MAX_BODY_BYTES = 64 * 1024
#: Upstream answers to a probe that are relayed to the client as they are.
RELAYED_REFUSALS = frozenset({401, 403, 404, 429})
#: The JSON-RPC id of every probe starts with this (the rest is random): reserved for the
#: gateway, so upstream logs and metering can tell probes apart.
PROBE_ID_PREFIX = "mcp-sse-gateway/auth-probe/"
#: JSON-RPC errors that show the ping was dispatched, so past the upstream's authentication:
#: invalid request, method not found, invalid params. Other errors (an in-dispatcher
#: "unauthorized", a server error) authorize nothing.
DISPATCHED_ERRORS = frozenset({-32600, -32601, -32602})
#: Request headers a probe does not take from the request (it sets its own).
_NOT_FORWARDED = frozenset(
    {"content-type", "accept", "last-event-id", "content-length", "mcp-method", "mcp-name"}
)
#: Where a request of the 2026-07-28 era names its protocol version (SEP-2575).
MODERN_VERSION_META = "io.modelcontextprotocol/protocolVersion"


@dataclass(frozen=True, slots=True)
class ProbeAnswer:
    """What the upstream answered one probe.

    Attributes:
        status: the HTTP status, or None when there was no answer (timeout, unreachable).
        headers: its headers (end-to-end only), in order.
        body: up to :data:`PROBE_MAX_BODY_BYTES` of its body.
        complete: *body* is the whole body.
        answered: a 2xx carried the JSON-RPC response to the probe's ping.
    """

    status: int | None
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    complete: bool = True
    answered: bool = False


def probe_request(
    session_id: str | None, protocol_version: str | None
) -> tuple[str, bytes, dict[str, str]]:
    """The JSON-RPC id, body and gateway-set headers of one probe: a ``ping`` in the session.

    Without a session (the 2026-07-28 era: a task's check, DESIGN D11) the era has no ``ping``:
    the probe is a ``server/discover``, a self-contained request of *protocol_version* with the
    era's ``_meta`` envelope and ``Mcp-Method`` header (SEP-2575, SEP-2243).
    """
    probe_id = PROBE_ID_PREFIX + secrets.token_hex(8)
    message: dict[str, object] = {"jsonrpc": "2.0", "id": probe_id, "method": "ping"}
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
    }
    if session_id is not None:
        headers["Mcp-Session-Id"] = session_id
    else:
        # The era's envelope (SEP-2575): servers refuse a request without it.
        message["method"] = "server/discover"
        message["params"] = {
            "_meta": {
                MODERN_VERSION_META: protocol_version,
                "io.modelcontextprotocol/clientInfo": {"name": "mcp-sse-gateway", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {},
            }
        }
        headers["Mcp-Method"] = "server/discover"
    if protocol_version:
        headers["MCP-Protocol-Version"] = protocol_version
    return probe_id, json.dumps(message).encode(), headers


def token_only_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Of a request's upstream headers, those a token-only probe keeps.

    See :func:`mcp_sse_gateway.auth.probe_token_only`.
    """
    keep = {"authorization", "mcp-protocol-version", "traceparent", "tracestate"}
    return [(n, v) for n, v in headers if n.lower() in keep]


async def send_probe(
    upstream: HttpUpstream,
    session_id: str | None,
    url: object,
    headers: list[tuple[str, str]],
    protocol_version: str | None,
    *,
    timeout_s: float,
    metrics: Metrics,
) -> ProbeAnswer:
    """Send one probe to *url* with the request's upstream *headers*, and read its answer.

    Args:
        upstream: the upstream client.
        session_id: the session the ping is sent in (None: a self-contained request).
        url: the upstream URL.
        headers: the request's upstream headers (its credentials go with the probe).
        protocol_version: the session's recorded version, sent when *headers* carry none.
        timeout_s: bound on the whole probe (``auth.probe_timeout_s``), seconds.
        metrics: the probe's duration is observed in ``auth_probe_seconds``.

    Returns:
        The answer: no status when there was none in time (timeout, unreachable).
    """
    probe_id, body, own = probe_request(session_id, None if session_id else protocol_version)
    forwarded = [(n, v) for n, v in headers if n.lower() not in _NOT_FORWARDED]
    if protocol_version and not any(n.lower() == "mcp-protocol-version" for n, _ in forwarded):
        own["MCP-Protocol-Version"] = protocol_version
    if session_id is None:
        forwarded = [(n, v) for n, v in forwarded if n.lower() != "mcp-protocol-version"]
    forwarded = [(n, v) for n, v in forwarded if n.lower() != "mcp-session-id"]
    started = time.perf_counter()
    answer: ProbeAnswer | None = None
    try:
        async with asyncio.timeout(timeout_s):
            try:
                response = await upstream.open(
                    "POST",
                    url,  # type: ignore[arg-type]
                    [*forwarded, *own.items()],
                    body,
                    headers_timeout_s=timeout_s,
                )
            except UpstreamError as exc:
                log.warning("auth.probe_failed", error=type(exc).__name__)
                return ProbeAnswer(None)
            async with response:
                if 200 <= response.status < 300:  # noqa: PLR2004
                    # A 2xx counts only with the JSON-RPC answer to this ping in it (a
                    # result or an error): a sign-in page served with 200 is no consent.
                    try:
                        answered = await answers(response, probe_id)
                    except UpstreamBroken as exc:
                        # No answer either way: the upstream could not be asked (503).
                        log.warning("auth.probe_failed", error=type(exc).__name__)
                        return ProbeAnswer(None)
                    return ProbeAnswer(response.status, answered=answered)
                relayed = client_response_headers(list(response.headers), keep_length=False)
                answer = ProbeAnswer(response.status, relayed, b"", complete=False)
                with contextlib.suppress(UpstreamBroken):
                    read, complete = await read_bounded(response, PROBE_MAX_BODY_BYTES)
                    answer = ProbeAnswer(response.status, relayed, read, complete)
                return answer
    except TimeoutError:
        if answer is not None:
            # The status came in time; only the body did not (it is not needed to decide).
            return answer
        log.warning("auth.probe_timed_out", timeout_s=timeout_s)
        return ProbeAnswer(None)
    finally:
        metrics.auth_probe_seconds.observe(time.perf_counter() - started)


async def read_bounded(response: HttpResponse, limit: int) -> tuple[bytes, bool]:
    """Up to *limit* bytes of *response*'s body, and whether that is all of it."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.chunks():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(chunks)[:limit], False
    return b"".join(chunks), True


def probe_outcome(answer: ProbeAnswer) -> str:
    """The probe outcome label: ``ok``, ``401`` … (relayed refusals), ``unavailable``, ``other``."""
    status = answer.status
    if status is None or status >= HTTPStatus.INTERNAL_SERVER_ERROR:
        return "unavailable"
    if 200 <= status < 300 and answer.answered:  # noqa: PLR2004
        return "ok"
    if status in RELAYED_REFUSALS:
        return str(status)
    return "other"


def _is_answer(data: bytes | str, probe_id: str) -> bool:
    """Whether *data* is JSON holding a JSON-RPC result (or dispatched error) for *probe_id*."""
    try:
        message = json.loads(data)
    except (ValueError, RecursionError):
        return False
    messages = message if isinstance(message, list) else [message]
    return any(
        isinstance(m, dict)
        and m.get("id") == probe_id
        and (
            "result" in m
            or (isinstance(m.get("error"), dict) and m["error"].get("code") in DISPATCHED_ERRORS)
        )
        for m in messages
    )


async def answers(response: HttpResponse, probe_id: str) -> bool:
    """Whether *response* (a 2xx) carries the JSON-RPC response to the ping *probe_id*.

    JSON is read whole (at most :data:`PROBE_MAX_BODY_BYTES`); an event stream is read until
    that response (the same bound), so an upstream that keeps it open costs nothing more.
    """
    if response.content_type == "application/json":
        body, complete = await read_bounded(response, PROBE_MAX_BODY_BYTES)
        return complete and _is_answer(body, probe_id)
    if response.content_type != "text/event-stream":
        return False
    decoder = SSEDecoder(max_event_bytes=PROBE_MAX_BODY_BYTES)
    size = 0
    async for chunk in response.chunks():
        size += len(chunk)
        try:
            events = [] if size > PROBE_MAX_BODY_BYTES else decoder.feed(chunk)
        except SSEError:
            return False
        if size > PROBE_MAX_BODY_BYTES:
            return False
        if any(e.data and probe_id in e.data and _is_answer(e.data, probe_id) for e in events):
            return True
    return False


def refusal_response(answer: ProbeAnswer) -> web.Response:
    """The upstream's refusal as the client gets it: status, headers and body as they were.

    A body longer than :data:`PROBE_MAX_BODY_BYTES` is replaced by a JSON-RPC error.
    """
    assert answer.status is not None
    out = web.Response(status=answer.status)
    headers = answer.headers
    body = answer.body
    if not answer.complete:
        headers = [
            (n, v) for n, v in headers if n.lower() not in {"content-type", "content-encoding"}
        ]
        headers.append(("Content-Type", "application/json"))
        body = json.dumps(
            jsonrpc.error_response(None, -32600, HTTPStatus(answer.status).phrase)
        ).encode()
    for name, value in headers:
        out.headers.add(name, value)
    out.body = body
    return out
