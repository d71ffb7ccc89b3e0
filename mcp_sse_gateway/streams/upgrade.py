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

import asyncio
import json
import zlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from mcp_sse_gateway import jsonrpc
from mcp_sse_gateway.errors import UpstreamBroken, UpstreamTimeout
from mcp_sse_gateway.streams.upstream import UpstreamResponse, is_event_stream

__all__ = [
    "EVENT_FRAMING_BYTES",
    "ContentDecoder",
    "Upgrade",
    "accepts_event_stream",
    "content_coding",
    "decodable",
    "json_as_events",
    "late_body",
    "no_body",
    "status_error_events",
    "until",
    "upgradable",
]

#: Content codings the gateway decodes to read a JSON answer (``wbits``: zlib, gzip or both).
_DECODERS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_DATA = b"data: "
_LINE_BREAKS_TO_SPACES = bytes.maketrans(b"\r\n", b"  ")
_UTF8_BOM = b"\xef\xbb\xbf"
#: What an upgraded event adds to the body on the wire: ``data: `` and the line end; the pump's
#: bound is ``store.max_event_bytes`` plus this, so the bound is the body's.
EVENT_FRAMING_BYTES = len(_DATA) + 1
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


def content_coding(response: UpstreamResponse) -> str:
    """The response's ``Content-Encoding``, lower case (``identity`` when none)."""
    return (response.header("Content-Encoding") or "identity").strip().lower()


def decodable(response: UpstreamResponse) -> bool:
    """Whether the gateway reads *response*'s content coding (none, gzip, deflate)."""
    coding = content_coding(response)
    return coding == "identity" or coding in _DECODERS


def upgradable(response: UpstreamResponse) -> bool:
    """A 2xx ``application/json`` answer in a coding the gateway reads (none, gzip, deflate)."""
    coding = content_coding(response)
    return (
        _OK_MIN <= response.status < _OK_END
        and response.content_type == "application/json"
        and (coding == "identity" or coding in _DECODERS)
    )


async def json_as_events(
    response: UpstreamResponse, *, max_bytes: int, deadline: float | None = None
) -> AsyncIterator[bytes]:
    """The JSON body of *response* (see :func:`upgradable`) as one SSE event, then its end.

    The event is one ``data`` line: CR and LF (only whitespace, in JSON) become spaces, so the
    data is the same JSON value, one byte per byte (a UTF-8 byte order mark is left out).
    Decoding stops once the body passed *max_bytes* (``store.max_event_bytes``): the pump then
    refuses the event as too large, and a small compressed body that expands without end costs
    no more than that (a gzip bomb). Concatenated gzip members are all decoded (RFC 1952 2.2);
    ``deflate`` is read zlib-wrapped or raw, as HTTP clients do. The whole body must have come
    by *deadline* (the event loop's clock), if given.

    Raises:
        UpstreamBroken: the body broke off, or its coding does not decode.
        UpstreamTimeout: the body was still coming at *deadline*.
    """
    decoder = ContentDecoder(content_coding(response), max_bytes)
    yield _DATA
    first = True
    async for chunk in until(response.chunks(), deadline):
        piece = decoder.feed(chunk)
        if first and piece:
            piece, first = piece.removeprefix(_UTF8_BOM), False
        if piece:
            yield _one_line(piece)
        if decoder.full:
            break  # the event is too large: the pump stops at what it has
    else:
        rest = decoder.flush()
        if rest:
            yield _one_line(rest)
    yield b"\n\n"


async def until(chunks: AsyncIterator[bytes], deadline: float | None) -> AsyncIterator[bytes]:
    """*chunks* as they come, as long as they come before *deadline* (event loop time).

    Raises:
        UpstreamTimeout: the next chunk had not come at *deadline*.
    """
    if deadline is None:
        async for chunk in chunks:
            yield chunk
        return
    loop = asyncio.get_running_loop()
    while True:
        try:
            chunk = await asyncio.wait_for(anext(chunks), max(0.0, deadline - loop.time()))
        except StopAsyncIteration:
            return
        except TimeoutError as exc:
            raise UpstreamTimeout("the upstream's answer was still coming at its deadline") from exc
        yield chunk


class ContentDecoder:
    """A body's content coding undone (identity, gzip, deflate), at most *max_bytes* + 1 bytes.

    Raises (from :meth:`feed`, :meth:`flush`):
        UpstreamBroken: the body does not decode, or is truncated.
    """

    __slots__ = ("_left", "_raw_possible", "_wbits", "_zlib")

    def __init__(self, coding: str, max_bytes: int) -> None:
        self._wbits = _DECODERS.get(coding)
        self._zlib = zlib.decompressobj(self._wbits) if self._wbits is not None else None
        self._left = max_bytes + 1  # one byte past the bound is enough to refuse the event
        # "deflate" is zlib-wrapped by the RFC, raw from some servers: the first bytes tell.
        self._raw_possible = coding == "deflate"

    def _first_deflate(self, chunk: bytes) -> bytes:
        self._raw_possible = False
        try:
            return self.feed(chunk)
        except UpstreamBroken:
            self._wbits = -zlib.MAX_WBITS
            self._zlib = zlib.decompressobj(self._wbits)
            return self.feed(chunk)

    @property
    def full(self) -> bool:
        """The bound is passed: nothing more is decoded."""
        return self._left <= 0

    def feed(self, chunk: bytes) -> bytes:
        """The decoded bytes of *chunk* (raw ones for ``identity``), bounded."""
        if self._zlib is None:
            piece = chunk[: self._left]
            self._left -= len(piece)
            return piece
        out = bytearray()
        data = chunk
        if self._raw_possible:
            return self._first_deflate(chunk)
        try:
            while data and self._left > 0:
                piece = self._zlib.decompress(data, self._left)
                out += piece
                self._left -= len(piece)
                if self._zlib.eof and self._zlib.unused_data and self._wbits is not None:
                    # Another gzip member follows the one that ended.
                    data = self._zlib.unused_data
                    self._zlib = zlib.decompressobj(self._wbits)
                else:
                    data = self._zlib.unconsumed_tail
        except zlib.error as exc:
            raise UpstreamBroken("the upstream's compressed JSON answer does not decode") from exc
        return bytes(out)

    def flush(self) -> bytes:
        """What the decoder still holds once the body ended."""
        if self._zlib is None or self.full:
            return b""
        if not self._zlib.eof:
            raise UpstreamBroken("the upstream's compressed JSON answer is truncated")
        return b""


def _one_line(piece: bytes) -> bytes:
    return piece.translate(_LINE_BREAKS_TO_SPACES)


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
    response: UpstreamResponse,
    request_ids: Sequence[jsonrpc.JSONRPCId],
    *,
    max_bytes: int,
    deadline: float | None = None,
) -> AsyncIterator[bytes]:
    """What a committed stream carries of an answer that came after the client got its 200."""
    if is_event_stream(response):
        return response.chunks()
    if upgradable(response):
        return json_as_events(response, max_bytes=max_bytes, deadline=deadline)
    return status_error_events(request_ids, response.status)
