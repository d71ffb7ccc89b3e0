"""A lean MCP load client: raw asyncio HTTP/1.1 (keep-alive, chunked) with an SSE parser.

One :class:`Connection` per simulated client: a :class:`~asyncio.Protocol` whose
``data_received`` decodes the HTTP framing and the SSE events inline and hands each event to
a :class:`StreamSink` (no task switch, no await per event). Receipt times are taken once per
socket read with ``time.time_ns()``, the clock the upstream stamps its notifications with
(``params.data.t``), so ``receipt - t`` is the delivery latency of one event.

:class:`McpClient` adds the MCP steps: ``initialize``, ``notifications/initialized``, a
``tools/call`` streamed into a sink, a resume (``GET`` + ``Last-Event-ID``), ``DELETE``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

PROTOCOL_VERSION = "2025-11-25"
MAX_HEAD_BYTES = 64 * 1024
#: How long a finished call's body may take to end before the next request gets a new
#: connection, seconds.
IDLE_WAIT_S = 5.0
_TIMESTAMP = re.compile(rb'"t":(\d+)')
_METHOD = b'"method"'
#: What only a JSON-RPC response of the synthetic upstream holds (see parse_after_end), the
#: longest first.
_RESPONSE_MARKERS = (b'"result"', b'"error"')
#: A block of an optional ``event`` line, an optional ``id`` line and one ``data`` line (what
#: the targets send), fields written after ": ": group 1 the id (None without), 2 the data.
_COMMON_BLOCK = re.compile(rb"(?:event: [^\n]*\n)?(?:id: ([^\n]*)\n)?data: ([^\n]*)\n\n")


class ClientError(Exception):
    """The server answered something the benchmark cannot go on with, or closed early."""


@dataclass(slots=True)
class StreamSink:
    """Collects one SSE stream: counts, ids, the final JSON-RPC response, latencies.

    Attributes:
        record_latency: keep ``receipt - t`` of every notification carrying a timestamp.
        stop_after_priming: close the connection at the first event with an id (priming).
        parse_after_end: parse the body once it ended (see the field).
        notifications: events whose data is a JSON-RPC message with a ``method``.
        events: events with non-empty data (notifications and responses).
        first_id: the first event id seen (the priming id on a primed stream).
        last_id: the last event id seen.
        response: the data of the first JSON-RPC response (no ``method``), or None yet.
        response_ns: ``time.time_ns()`` when it arrived.
        latencies_ns: per-notification latency, when recorded.
        late: notifications that arrived more than ``late_after_ns`` after their timestamp.
        max_lag_ns: the largest latency seen.
    """

    record_latency: bool = False
    #: Look for the send timestamp of each notification (late/max lag); off for replays, where
    #: only the time to the final response counts.
    track_lag: bool = True
    stop_after_priming: bool = False
    #: Keep each socket read with its receipt time, unparsed, until one may hold the JSON-RPC
    #: response (the raw bytes hold ``"result"`` or ``"error"``, which the synthetic
    #: upstream's notifications never do) or the body ends; then parse them all, each at its
    #: time, and parse inline from there. The client's parse then does not delay the reads it
    #: times, and every event is still checked (a replay's timing).
    parse_after_end: bool = False
    late_after_ns: int = 1_000_000_000
    notifications: int = 0
    events: int = 0
    first_id: bytes | None = None
    last_id: bytes | None = None
    response: bytes | None = None
    response_ns: int = 0
    first_event_ns: int = 0
    latencies_ns: list[int] = field(default_factory=list)
    late: int = 0
    max_lag_ns: int = 0
    done: asyncio.Future[None] | None = None
    on_response: Callable[[], None] | None = None
    connection: Connection | None = None

    def on_event(self, event_id: bytes | None, data: bytes | None, now_ns: int) -> None:  # noqa: C901 - the hot path, inline on purpose
        if event_id is not None:
            if self.first_id is None:
                self.first_id = event_id
                if self.stop_after_priming and self.connection is not None:
                    # A stream without a priming event: its first id is a real event's.
                    self.events += bool(data)
                    self.connection.abort()
                    self._finish()
                    return
            self.last_id = event_id
        if not data:
            return
        if not self.events:
            self.first_event_ns = now_ns
        self.events += 1
        if _METHOD in data:
            self.notifications += 1
            if not self.track_lag:
                return
            match = _TIMESTAMP.search(data)
            if match is not None:
                lag = now_ns - int(match.group(1))
                self.max_lag_ns = max(self.max_lag_ns, lag)
                if lag > self.late_after_ns:
                    self.late += 1
                if self.record_latency:
                    self.latencies_ns.append(lag)
        elif self.response is None:
            self.response = data
            self.response_ns = now_ns
            self._finish()

    def _finish(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(None)
        if self.on_response is not None:
            self.on_response()


@dataclass(slots=True)
class Response:
    """A response's status and headers; ``body`` once complete (non-SSE answers)."""

    status: int
    headers: dict[str, str]
    body: bytes = b""

    @property
    def is_sse(self) -> bool:
        return self.headers.get("content-type", "").startswith("text/event-stream")


class Connection(asyncio.Protocol):
    """One HTTP/1.1 keep-alive connection, one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._reset()

    def _reset(self) -> None:
        self.state = "idle"
        self.headers_future: asyncio.Future[Response] | None = None
        self.body_future: asyncio.Future[Response] | None = None
        self.response: Response | None = None
        self.sink: StreamSink | None = None
        self.json_sink: StreamSink | None = None
        self.body = bytearray()
        self.remaining = 0  # content-length left, or bytes left in the current chunk
        self.chunked = False
        self.until_close = False
        self.sse = bytearray()
        self.head_only = False
        #: Socket reads of the body kept for later (a sink with ``parse_after_end``); None once
        #: they were parsed.
        self.reads: list[tuple[int, bytes]] | None = []
        self.tail = b""

    @classmethod
    async def open(cls, host: str, port: int, timeout_s: float = 10.0) -> Connection:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout_s):
            _transport, protocol = await loop.create_connection(cls, host, port)
        return protocol

    # asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        with contextlib.suppress(OSError):
            transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.until_close and self.response is not None:
            self._complete()
        self._parse_kept()
        error = ClientError(f"connection closed ({exc or 'EOF'}) in state {self.state}")
        sink = self.sink or self.json_sink
        for future in (self.headers_future, self.body_future, sink.done if sink else None):
            if future is not None and not future.done():
                _fail(future, error)
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        now_ns = time.time_ns()
        if self.state == "head":
            self.buffer += data
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD_BYTES:
                    self.abort()
                return
            self._parse_head(bytes(self.buffer[:end]))
            data = bytes(self.buffer[end + 4 :])
            self.buffer.clear()
            if self.state == "idle" or not data:
                return
        if self.state == "body":
            self._body(data, now_ns)

    # framing --------------------------------------------------------------------------------

    def _parse_head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        response = Response(status, headers)
        self.response = response
        if self.sink is not None and not response.is_sse:
            # A JSON (or error) answer to a streamed request: the whole body is its one message.
            self.json_sink, self.sink = self.sink, None
        if self.headers_future is not None and not self.headers_future.done():
            self.headers_future.set_result(response)
        if self.head_only or status in (204, 304) or 100 <= status < 200:
            self._complete()
            return
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.chunked = True
            self.remaining = -1  # waiting for a size line
        elif "content-length" in headers:
            self.remaining = int(headers["content-length"])
            if self.remaining == 0:
                self._complete()
                return
        else:
            self.until_close = True
        self.state = "body"

    def _body(self, data: bytes, now_ns: int) -> None:  # noqa: C901 - one framing state machine
        if not self.chunked:
            if self.until_close:
                self._payload(data, now_ns)
                return
            piece = data[: self.remaining]
            self.remaining -= len(piece)
            self._payload(piece, now_ns)
            if self.remaining == 0:
                self._complete()
            return
        buffer = self.buffer
        buffer += data
        pos = 0
        size = len(buffer)
        pieces: list[bytes] = []
        finished = False
        while pos < size:
            if self.remaining > 0:
                take = min(self.remaining, size - pos)
                pieces.append(bytes(buffer[pos : pos + take]))
                pos += take
                self.remaining -= take
                if self.remaining == 0:
                    self.remaining = -2  # the CRLF after the chunk
                continue
            line_end = buffer.find(b"\r\n", pos)
            if line_end < 0:
                break
            if self.remaining == -2:
                pos = line_end + 2
                self.remaining = -1
                continue
            chunk_size = int(bytes(buffer[pos:line_end]).split(b";", 1)[0], 16)
            pos = line_end + 2
            if chunk_size == 0:
                finished = True
                break
            self.remaining = chunk_size
        del buffer[:pos]
        if pieces:
            self._payload(pieces[0] if len(pieces) == 1 else b"".join(pieces), now_ns)
        if finished:
            buffer.clear()
            self._complete()

    def _payload(self, data: bytes, now_ns: int) -> None:
        if self.sink is None:
            self.body += data
        elif self.sink.parse_after_end and self.reads is not None:
            # A marker may straddle reads: look at what the last ones ended with too.
            seen = self.tail + data
            self.tail = seen[-len(_RESPONSE_MARKERS[0]) + 1 :]
            self.reads.append((now_ns, data))
            if any(marker in seen for marker in _RESPONSE_MARKERS):
                self._parse_kept()
        else:
            self._parse(data, now_ns)

    def _parse_kept(self) -> None:
        """Parse the socket reads kept for a ``parse_after_end`` sink, each at its time; later
        reads are parsed as they come."""
        reads, self.reads = self.reads, None
        for now_ns, data in reads or ():
            self._parse(data, now_ns, kept=True)

    def _parse(self, data: bytes, now_ns: int, *, kept: bool = False) -> None:  # noqa: C901, PLR0912 - the SSE parser, inline
        sse = self.sse
        sse += data
        held = b""
        if b"\r" in data:
            # CRLF or CR line ends (e.g. sse-starlette): normalise, holding back a final CR
            # whose LF may come with the next read.
            if sse.endswith(b"\r"):
                held = b"\r"
                del sse[-1:]
            sse[:] = bytes(sse).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        end = sse.rfind(b"\n\n")
        if end < 0:
            sse += held
            return
        chunk = bytes(sse[: end + 2])  # whole blocks, each ending with its empty line
        del sse[: end + 2]
        sse += held
        sink = self.sink
        # A sink may close the connection (stop_after_priming): parse no further then. Kept
        # reads are parsed whatever became of the connection since.
        transport = None if kept else self.transport
        assert sink is not None
        # Block by block: the common shapes with one regex match each (the parse must cost
        # well below what the proxy it measures spends per event), any other line by line.
        pos, size = 0, len(chunk)
        while pos < size:
            common = _COMMON_BLOCK.match(chunk, pos)
            if common is not None:
                pos = common.end()
                sink.on_event(common.group(1), common.group(2), now_ns)
                if transport is not None and transport.is_closing():
                    return
                continue
            stop = chunk.find(b"\n\n", pos)
            if stop < 0:
                break  # line ends left over from a run of blank lines
            block, pos = chunk[pos:stop], stop + 2
            if not block or (block[0] == 58 and b"\n" not in block):  # a lone comment
                continue
            event_id = None
            data_value = None
            for line in block.split(b"\n"):
                if line.startswith(b"data:"):
                    value = line[6:] if line[5:6] == b" " else line[5:]
                    data_value = value if data_value is None else data_value + b"\n" + value
                elif line.startswith(b"id:"):
                    event_id = line[4:] if line[3:4] == b" " else line[3:]
            if event_id is None and data_value is None:
                continue
            sink.on_event(event_id, data_value, now_ns)
            if transport is not None and transport.is_closing():
                return

    def _complete(self) -> None:
        self._parse_kept()
        response = self.response
        assert response is not None
        response.body = bytes(self.body)
        body_future = self.body_future
        sink = self.sink or self.json_sink
        json_answer = self.json_sink is not None
        self._reset()
        if body_future is not None and not body_future.done():
            body_future.set_result(response)
        if sink is None:
            return
        if json_answer and response.body:
            sink.on_event(None, response.body, time.time_ns())
        if sink.done is not None and not sink.done.done():
            _fail(sink.done, ClientError("stream ended without a JSON-RPC response"))

    # API ------------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        headers: list[tuple[str, str]],
        body: bytes | None = None,
        *,
        sink: StreamSink | None = None,
    ) -> tuple[asyncio.Future[Response], asyncio.Future[Response]]:
        """Send a request; futures for its headers and for its complete body."""
        if self.transport is None or self.transport.is_closing():
            raise ClientError("connection is closed")
        if self.state != "idle":
            raise ClientError("a request is already in flight on this connection")
        loop = asyncio.get_running_loop()
        self.state = "head"
        self.headers_future = loop.create_future()
        self.body_future = loop.create_future()
        self.sink = sink
        self.head_only = method == "HEAD"
        if sink is not None:
            sink.connection = self
            if sink.done is None:
                sink.done = loop.create_future()
        lines = [f"{method} {path} HTTP/1.1"]
        lines.extend(f"{name}: {value}" for name, value in headers)
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.transport.write(head + body if body else head)
        return self.headers_future, self.body_future

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


@dataclass
class Endpoint:
    """Where an MCP endpoint is: host, port, path, and the Host header to send."""

    host: str
    port: int
    path: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        assert parts.hostname is not None
        return cls(parts.hostname, parts.port or 80, parts.path or "/")

    @property
    def authority(self) -> str:
        return f"{self.host}:{self.port}"


class McpClient:
    """One MCP client session over one keep-alive connection (reopened when needed)."""

    _next_id = 0

    def __init__(self, endpoint: Endpoint, *, timeout_s: float = 30.0) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.connection: Connection | None = None
        self.session_id: str | None = None
        self.protocol_version = PROTOCOL_VERSION
        self._body_future: asyncio.Future[Response] | None = None

    def _headers(
        self, *, accept: str = "application/json, text/event-stream"
    ) -> list[tuple[str, str]]:
        headers = [("Host", self.endpoint.authority), ("Accept", accept)]
        if self.session_id is not None:
            headers.append(("Mcp-Session-Id", self.session_id))
            headers.append(("MCP-Protocol-Version", self.protocol_version))
        return headers

    async def _connection(self) -> Connection:
        if (
            self.connection is None
            or self.connection.transport is None
            or self.connection.transport.is_closing()
        ):
            self.connection = await Connection.open(self.endpoint.host, self.endpoint.port)
        if self.connection.state != "idle":
            # A stream is still open on it (a call whose response arrived before the body
            # ended): give the next request a connection of its own.
            self.connection.close()
            self.connection = await Connection.open(self.endpoint.host, self.endpoint.port)
        return self.connection

    def _rpc(
        self, method: str, params: dict[str, Any] | None = None, *, notify: bool = False
    ) -> bytes:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        if not notify:
            McpClient._next_id += 1
            message["id"] = McpClient._next_id
        return json.dumps(message, separators=(",", ":")).encode()

    async def _post(self, body: bytes, sink: StreamSink | None = None) -> Response:
        """POST *body*; with a *sink*, returns at the response headers (the body streams on)."""
        connection = await self._connection()
        headers = [*self._headers(), ("Content-Type", "application/json")]
        headers_future, body_future = connection.request(
            "POST", self.endpoint.path, headers, body, sink=sink
        )
        self._body_future = body_future
        async with asyncio.timeout(self.timeout_s):
            if sink is not None:
                return await headers_future
            return await body_future

    async def initialize(self) -> str | None:
        """``initialize`` then ``notifications/initialized``; the session id (None: stateless)."""
        body = self._rpc(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "mcp-sse-gateway-bench", "version": "1"},
            },
        )
        sink = StreamSink()
        response = await self._post(body, sink)
        if response.status != 200:
            raise ClientError(f"initialize answered {response.status}")
        self.session_id = response.headers.get("mcp-session-id")
        assert sink.done is not None
        async with asyncio.timeout(self.timeout_s):
            await sink.done
        if not sink.response:
            raise ClientError("initialize got no result")
        message = json.loads(sink.response)
        self.protocol_version = message.get("result", {}).get("protocolVersion", PROTOCOL_VERSION)
        await self._wait_idle()
        response = await self._post(self._rpc("notifications/initialized", notify=True))
        if response.status not in (200, 202):
            raise ClientError(f"notifications/initialized answered {response.status}")
        return self.session_id

    async def _wait_idle(self) -> None:
        """Let the last response's body end, so the connection can carry the next request."""
        future = self._body_future
        if future is None or future.done():
            return
        with contextlib.suppress(ClientError, TimeoutError):
            async with asyncio.timeout(IDLE_WAIT_S):
                await future

    async def ensure_connection(self) -> None:
        """An idle, open connection for the next request (reopened if the server closed it)."""
        await self._wait_idle()
        await self._connection()

    def start_call(
        self,
        sink: StreamSink,
        arguments: dict[str, Any],
        name: str = "stream_notifications",
    ) -> asyncio.Future[Response]:
        """Send a ``tools/call`` streamed into *sink*; a future for its response headers.

        The connection must be open and idle (after :meth:`initialize`). ``sink.done``
        resolves with the JSON-RPC response (or fails if the stream ends without one).
        """
        connection = self.connection
        if connection is None or connection.state != "idle":
            raise ClientError("no idle connection for the call")
        headers = [*self._headers(), ("Content-Type", "application/json")]
        body = self._rpc("tools/call", {"name": name, "arguments": arguments})
        headers_future, self._body_future = connection.request(
            "POST", self.endpoint.path, headers, body, sink=sink
        )
        return headers_future

    async def call(
        self, sink: StreamSink, arguments: dict[str, Any], name: str = "stream_notifications"
    ) -> None:
        """A ``tools/call`` streamed into *sink*, until its response (or the priming event)."""
        await self._wait_idle()
        await self._connection()
        headers = await asyncio.wait_for(self.start_call(sink, arguments, name), self.timeout_s)
        if headers.status != 200:
            raise ClientError(f"tools/call answered {headers.status}")
        assert sink.done is not None
        await sink.done

    async def resume(
        self, sink: StreamSink, last_event_id: bytes | str, *, connection: Connection | None = None
    ) -> Response:
        """``GET`` + ``Last-Event-ID`` streamed into *sink*; returns the response headers.

        Pass an already open *connection* to time the request alone (no connect).
        """
        if connection is None:
            connection = await Connection.open(self.endpoint.host, self.endpoint.port)
        value = last_event_id.decode() if isinstance(last_event_id, bytes) else last_event_id
        headers = [*self._headers(accept="text/event-stream"), ("Last-Event-ID", value)]
        headers_future, _ = connection.request("GET", self.endpoint.path, headers, sink=sink)
        async with asyncio.timeout(self.timeout_s):
            return await headers_future

    async def delete(self) -> None:
        with contextlib.suppress(ClientError, OSError, TimeoutError):
            await self._wait_idle()
            connection = await self._connection()
            _, body_future = connection.request("DELETE", self.endpoint.path, self._headers())
            async with asyncio.timeout(self.timeout_s):
                await body_future

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def _fail(future: asyncio.Future[Any], error: Exception) -> None:
    """Fail *future*, marking the exception retrieved (nobody may be waiting any more)."""
    future.set_exception(error)
    future.exception()


def percentile(values: list[float] | list[int], q: float) -> float:
    """The *q*-th percentile (0-100) by nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return float(ordered[rank])
