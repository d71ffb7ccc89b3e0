"""The JSON upgrade (``sse.upgrade_json``): an upstream's JSON answer as a managed stream's body.

A JSON-only MCP server answers a tool call with one ``application/json`` body when the call ends.
With the upgrade, the client gets an SSE stream from the gateway instead (priming, keepalives,
polling closes, resumes: DESIGN D4 and D6), and the upstream's answer becomes that stream's one
event. Each function here turns what the upstream answered into the SSE bytes a pump reads
(:func:`~mcp_sse_gateway.streams.pump.run_pump`), so storing, settling pending request ids and
finishing are the pump's, exactly as for an SSE upstream:

* a 2xx JSON body: one event whose data is the body (:func:`json_as_events`);
* anything else, once the client already has its 200 (after ``sse.upgrade_wait_ms``): one
  JSON-RPC error event per pending request, carrying the upstream's HTTP status and no part of
  its body (:func:`status_error_events`).

Sources: MCP 2025-11-25 transports ("Sending Messages to the Server": a POST's answer is JSON or
an SSE stream, at the server's choice); WHATWG HTML, server-sent events (``data`` lines).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from mcp_sse_gateway import jsonrpc
from mcp_sse_gateway.errors import UpstreamBroken
from mcp_sse_gateway.streams.upstream import UpstreamResponse, is_event_stream

__all__ = [
    "Upgrade",
    "accepts_event_stream",
    "json_as_events",
    "late_body",
    "no_body",
    "status_error_events",
    "upgradable",
]

#: Content codings the gateway decodes to read a JSON answer (``wbits``: zlib, gzip or both).
_DECODERS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_DATA = b"data: "
_OK_MIN, _OK_END = 200, 300


def accepts_event_stream(accept: str | None) -> bool:
    """Whether an ``Accept`` header value admits ``text/event-stream`` (explicitly, ``q`` > 0).

    Wildcards do not count: MCP clients list both types (2025-11-25 transports), and a client
    that did not name SSE keeps getting JSON.
    """
    for item in (accept or "").split(","):
        media, *params = (part.strip() for part in item.split(";"))
        if media.lower() != "text/event-stream":
            continue
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    return float(value) > 0
                except ValueError:
                    return False
        return True
    return False


def _coding(response: UpstreamResponse) -> str:
    return (response.header("Content-Encoding") or "identity").strip().lower()


def upgradable(response: UpstreamResponse) -> bool:
    """A 2xx ``application/json`` answer in a coding the gateway reads (none, gzip, deflate)."""
    coding = _coding(response)
    return (
        _OK_MIN <= response.status < _OK_END
        and response.content_type == "application/json"
        and (coding == "identity" or coding in _DECODERS)
    )


async def json_as_events(response: UpstreamResponse) -> AsyncIterator[bytes]:
    """The JSON body of *response* (see :func:`upgradable`) as one SSE event, then its end.

    Line breaks (only whitespace, in JSON) start new ``data`` lines; the event's data is then the
    body with its line breaks as LF. The pump bounds the event (``store.max_event_bytes``).

    Raises:
        UpstreamBroken: the body broke off, or its coding does not decode.
    """
    coding = _coding(response)
    decoder = zlib.decompressobj(_DECODERS[coding]) if coding in _DECODERS else None
    yield _DATA
    async for chunk in response.chunks():
        piece = _decode(decoder, chunk)
        if piece:
            yield _lines(piece)
    if decoder is not None:
        yield _lines(_flush(decoder))
    yield b"\n\n"


def _decode(decoder: zlib._Decompress | None, chunk: bytes) -> bytes:
    if decoder is None:
        return chunk
    try:
        return decoder.decompress(chunk)
    except zlib.error as exc:
        raise UpstreamBroken("the upstream's compressed JSON answer does not decode") from exc


def _flush(decoder: zlib._Decompress) -> bytes:
    try:
        return decoder.flush()
    except zlib.error as exc:
        raise UpstreamBroken("the upstream's compressed JSON answer does not decode") from exc


def _lines(piece: bytes) -> bytes:
    # A CR LF split across two chunks gives one more (empty) data line: JSON whitespace.
    return piece.replace(b"\r\n", b"\n").replace(b"\r", b"\n").replace(b"\n", b"\n" + _DATA)


async def status_error_events(
    request_ids: Sequence[jsonrpc.JSONRPCId], status: int
) -> AsyncIterator[bytes]:
    """One JSON-RPC error event per request id: the upstream answered *status*, not JSON-RPC.

    The error carries ``data: {"status": <status>}`` and nothing of the upstream's body (it may
    be a sign-in page, or echo the request).
    """
    message = f"Upstream answered HTTP {status}, not a JSON-RPC response"
    for rid in request_ids:
        error = jsonrpc.error_response(rid, jsonrpc.UPSTREAM_HTTP_ERROR, message)
        error["error"]["data"] = {"status": status}
        yield _DATA + json.dumps(error).encode() + b"\n\n"


@dataclass(slots=True)
class Upgrade:
    """One upgraded POST: whether the upstream answered, whether the client has its stream.

    Both flags change only between awaits, so the POST's task and the client's wait never
    disagree on who decides: an answer before the commit is the answer's to relay, one after it
    goes through the stream.
    """

    answered: bool = False
    committed: bool = False


async def no_body() -> AsyncIterator[bytes]:
    """An upstream that never answered: the pump appends the pending requests' errors."""
    empty: tuple[bytes, ...] = ()
    for chunk in empty:
        yield chunk


def late_body(
    response: UpstreamResponse, request_ids: Sequence[jsonrpc.JSONRPCId]
) -> AsyncIterator[bytes]:
    """What a committed stream carries of an answer that came after the client got its 200."""
    if is_event_stream(response):
        return response.chunks()
    if upgradable(response):
        return json_as_events(response)
    return status_error_events(request_ids, response.status)
