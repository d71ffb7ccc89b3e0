"""A fast synthetic MCP Streamable HTTP server for the benchmarks (raw asyncio, HTTP/1.1).

``python -m bench.upstream --port 0 [--workers N] [--sse-initialize]`` prints
``PIDS <pid> ...`` then ``LISTENING http://127.0.0.1:<port>/mcp`` on stdout once it accepts
connections. It speaks just enough MCP for the benchmark clients and for proxies in front of it:

* ``POST /mcp`` ``initialize`` → an InitializeResult with ``protocolVersion: "2025-11-25"`` and
  an ``Mcp-Session-Id`` header (JSON, or one SSE event with ``--sse-initialize``);
* ``POST /mcp`` notifications and responses → 202;
* ``POST /mcp`` ``tools/call`` (any tool name; arguments ``count``, ``interval_ms``,
  ``payload_bytes``) → ``text/event-stream`` (chunked): ``count`` ``notifications/message``
  events, ONE event per write, then the JSON-RPC result, then the end of the body. Notification
  ``i`` carries ``params.data = {"i": i, "n": count, "t": <time.time_ns() at send>, "p": pad}``;
  with ``interval_ms`` they are paced on an absolute schedule (no drift); with ``"json":
  true`` the result at once as ``application/json`` instead (a JSON-only server's answer);
* ``tools/list``, ``ping`` → JSON results; other methods → JSON-RPC error -32601;
* ``GET /mcp`` → 405 (no standalone stream); with ``--standalone-get``, an empty SSE stream
  (a ``: keepalive`` comment every 15 s) that stays open until the client closes it, like a
  real server's standalone stream (mcp-persist opens one on every resume); ``DELETE /mcp`` → 200;
* ``GET /bench/finished`` → ``{"started": s, "finished": f, "aborted": a, "events": e}``:
  tool calls started, written to the end, cut by the peer, and notifications written (summed
  over the worker processes), so a benchmark can wait until a call is complete upstream.

It never parses JSON on the hot path of a stream: events are formatted bytes. Writes respect
the transport's flow control (a paused transport suspends the stream until drained), and the
stream yields to the event loop after every event, like a real server's task.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import Sequence
from multiprocessing.sharedctypes import RawArray
from typing import Any

PROTOCOL_VERSION = "2025-11-25"
MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_COUNT = 1_000_000
#: Counter slots per worker in the shared array: started, finished, aborted, events.
SLOTS = 4
STARTED, FINISHED, ABORTED, EVENTS = range(SLOTS)
KEEPALIVE_S = 15.0

_NOTIFICATION = (
    b'{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info",'
    b'"logger":"bench","data":{"i":%d,"n":%d,"t":%d,"p":"%s"}}}'
)
_TOOLS = {
    "tools": [
        {
            "name": "stream_notifications",
            "description": "count notifications/message events, interval_ms apart, then a result",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "count": {"type": "integer"},
                    "interval_ms": {"type": "number"},
                    "payload_bytes": {"type": "integer"},
                },
                "required": ["count"],
            },
        }
    ]
}


class Counters:
    """Counters in shared memory: one row per worker process, summed when read."""

    def __init__(self, workers: int) -> None:
        self._array = RawArray(ctypes.c_longlong, workers * SLOTS)
        self.row = 0

    def add(self, slot: int, value: int = 1) -> None:
        self._array[self.row * SLOTS + slot] += value

    def totals(self) -> dict[str, int]:
        sums = [0] * SLOTS
        for index, value in enumerate(self._array):
            sums[index % SLOTS] += value
        return dict(zip(("started", "finished", "aborted", "events"), sums, strict=True))


def _response(
    status: str, body: bytes, content_type: str = "application/json", extra: str = ""
) -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        f"{extra}\r\n"
    ).encode() + body


def _json_response(payload: Any, extra: str = "") -> bytes:
    return _response("200 OK", json.dumps(payload, separators=(",", ":")).encode(), extra=extra)


def _sse_head(extra: str = "") -> bytes:
    return (
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        f"Transfer-Encoding: chunked\r\n{extra}\r\n"
    ).encode()


def _chunk(event: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(event), event)


def _event(data: bytes) -> bytes:
    return b"event: message\ndata: " + data + b"\n\n"


class UpstreamProtocol(asyncio.Protocol):
    """One client connection: requests one at a time, keep-alive, streams with flow control."""

    def __init__(
        self, counters: Counters, *, sse_initialize: bool, standalone_get: bool, path: str
    ) -> None:
        self.counters = counters
        self.sse_initialize = sse_initialize
        self.standalone_get = standalone_get
        self.path = path
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.busy = False
        self.closed = False
        self.writable: asyncio.Future[None] | None = None
        self.closing: asyncio.Future[None] | None = None

    # asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        with contextlib.suppress(OSError):
            transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self._process()

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: ARG002
        self.closed = True
        if self.closing is not None and not self.closing.done():
            self.closing.set_result(None)
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def pause_writing(self) -> None:
        if self.writable is None or self.writable.done():
            self.writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    # requests ----------------------------------------------------------------------------------

    def _process(self) -> None:
        assert self.transport is not None
        while not self.busy and not self.closed:
            request = self._next_request()
            if request is None:
                return
            method, target, headers, body = request
            keep_alive = headers.get("connection", "").lower() != "close"
            self._handle(method, target.split("?", 1)[0], headers, body)
            if not keep_alive and not self.busy:
                self.transport.close()
                return

    def _next_request(self) -> tuple[str, str, dict[str, str], bytes] | None:
        assert self.transport is not None
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_HEAD_BYTES:
                self.transport.close()
            return None
        lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
        method, target, _version = lines[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        start = end + 4
        if "chunked" in headers.get("transfer-encoding", "").lower():
            parsed = self._chunked_body(start)
            if parsed is None:
                return None
            body, consumed = parsed
        else:
            length = int(headers.get("content-length", "0") or 0)
            if length > MAX_BODY_BYTES:
                self.transport.close()
                return None
            if len(self.buffer) < start + length:
                return None
            body, consumed = bytes(self.buffer[start : start + length]), start + length
        del self.buffer[:consumed]
        return method, target, headers, body

    def _chunked_body(self, pos: int) -> tuple[bytes, int] | None:
        body = bytearray()
        while True:
            line_end = self.buffer.find(b"\r\n", pos)
            if line_end < 0:
                return None
            size = int(bytes(self.buffer[pos:line_end]).split(b";")[0], 16)
            if size == 0:
                trailer_end = self.buffer.find(b"\r\n\r\n", line_end)
                if self.buffer[line_end : line_end + 4] == b"\r\n\r\n":
                    return bytes(body), line_end + 4
                if trailer_end < 0:
                    return None
                return bytes(body), trailer_end + 4
            if len(self.buffer) < line_end + 2 + size + 2:
                return None
            body += self.buffer[line_end + 2 : line_end + 2 + size]
            pos = line_end + 2 + size + 2

    def _handle(  # noqa: PLR0911 - one return per route
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> None:
        assert self.transport is not None
        write = self.transport.write
        if path == "/bench/finished" and method == "GET":
            write(_json_response(self.counters.totals()))
            return
        if path != self.path:
            write(_response("404 Not Found", b"not found", "text/plain"))
            return
        if method == "GET" and self.standalone_get and "mcp-session-id" in headers:
            session = headers["mcp-session-id"]
            self.busy = True
            task = asyncio.get_running_loop().create_task(self._standalone(session))
            task.add_done_callback(self._stream_done)
            return
        if method == "GET":
            write(_response("405 Method Not Allowed", b"", "text/plain", "Allow: POST, DELETE\r\n"))
            return
        if method == "DELETE":
            write(_response("200 OK", b"", "text/plain"))
            return
        if method != "POST":
            write(_response("405 Method Not Allowed", b"", "text/plain", "Allow: POST, DELETE\r\n"))
            return
        try:
            message = json.loads(body)
        except ValueError:
            write(_response("400 Bad Request", b'{"error":"invalid JSON"}'))
            return
        if isinstance(message, list):
            message = message[0] if message else {}
        if not isinstance(message, dict) or "method" not in message or "id" not in message:
            write(_response("202 Accepted", b"", "text/plain"))
            return
        self._request(message, headers)

    def _request(self, message: dict[str, Any], headers: dict[str, str]) -> None:
        assert self.transport is not None
        rpc_method, request_id = message["method"], message["id"]
        params = message.get("params") or {}
        if rpc_method == "initialize":
            session = uuid.uuid4().hex
            result = {
                "jsonrpc": "2.0",
                "id": request_id,
                "result": {
                    "protocolVersion": PROTOCOL_VERSION,
                    "capabilities": {"tools": {}, "logging": {}},
                    "serverInfo": {"name": "bench-upstream", "version": "1"},
                },
            }
            extra = f"Mcp-Session-Id: {session}\r\n"
            if self.sse_initialize:
                data = json.dumps(result, separators=(",", ":")).encode()
                self.transport.write(_sse_head(extra) + _chunk(_event(data)) + b"0\r\n\r\n")
            else:
                self.transport.write(_json_response(result, extra))
            return
        if rpc_method == "tools/call":
            arguments = params.get("arguments") or {}
            if arguments.get("json"):
                # A JSON-only server's answer: the result at once, as application/json.
                session = headers.get("mcp-session-id")
                extra = f"Mcp-Session-Id: {session}\r\n" if session else ""
                result = {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "result": {"content": [{"type": "text", "text": "done"}], "isError": False},
                }
                self.transport.write(_json_response(result, extra))
                return
            count = min(max(int(arguments.get("count", 0)), 0), MAX_COUNT)
            interval_s = max(float(arguments.get("interval_ms", 0)), 0.0) / 1000
            payload = b"x" * max(int(arguments.get("payload_bytes", 0)), 0)
            session = headers.get("mcp-session-id")
            extra = f"Mcp-Session-Id: {session}\r\n" if session else ""
            self.busy = True
            task = asyncio.get_running_loop().create_task(
                self._stream(request_id, count, interval_s, payload, extra)
            )
            task.add_done_callback(self._stream_done)
            return
        if rpc_method == "tools/list":
            self.transport.write(
                _json_response({"jsonrpc": "2.0", "id": request_id, "result": _TOOLS})
            )
            return
        if rpc_method == "ping":
            self.transport.write(_json_response({"jsonrpc": "2.0", "id": request_id, "result": {}}))
            return
        error = {"code": -32601, "message": f"method not found: {rpc_method}"}
        self.transport.write(_json_response({"jsonrpc": "2.0", "id": request_id, "error": error}))

    async def _stream(
        self, request_id: Any, count: int, interval_s: float, payload: bytes, extra: str
    ) -> None:
        assert self.transport is not None
        counters, transport = self.counters, self.transport
        counters.add(STARTED)
        transport.write(_sse_head(extra))
        loop = asyncio.get_running_loop()
        start = loop.time()
        sent = 0
        for index in range(count):
            if self.closed:
                break
            if interval_s and index:
                delay = start + index * interval_s - loop.time()
                await asyncio.sleep(max(delay, 0))
            else:
                await asyncio.sleep(0)
            if self.writable is not None and not self.writable.done():
                await self.writable
            if self.closed:
                break
            data = _NOTIFICATION % (index, count, time.time_ns(), payload)
            transport.write(_chunk(_event(data)))
            sent += 1
        counters.add(EVENTS, sent)
        if self.closed:
            counters.add(ABORTED)
            return
        result = {
            "jsonrpc": "2.0",
            "id": request_id,
            "result": {
                "content": [{"type": "text", "text": f"sent {count} notifications"}],
                "isError": False,
            },
        }
        data = json.dumps(result, separators=(",", ":")).encode()
        transport.write(_chunk(_event(data)) + b"0\r\n\r\n")
        counters.add(FINISHED)

    async def _standalone(self, session: str) -> None:
        """An idle standalone stream: headers, then a keepalive comment now and then."""
        assert self.transport is not None
        self.transport.write(_sse_head(f"Mcp-Session-Id: {session}\r\n"))
        while not self.closed:
            self.transport.write(_chunk(b": keepalive\n\n"))
            self.closing = asyncio.get_running_loop().create_future()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(KEEPALIVE_S):
                    await self.closing

    def _stream_done(self, task: asyncio.Task[None]) -> None:
        self.busy = False
        if not task.cancelled() and task.exception() is not None and self.transport is not None:
            self.transport.close()
            return
        if self.buffer and not self.closed:
            self._process()


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _serve(sock: socket.socket, counters: Counters, args: argparse.Namespace) -> None:
    loop = _new_loop()
    asyncio.set_event_loop(loop)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    async def main() -> None:
        server = await loop.create_server(
            lambda: UpstreamProtocol(
                counters,
                sse_initialize=args.sse_initialize,
                standalone_get=args.standalone_get,
                path=args.path,
            ),
            sock=sock,
            backlog=4096,
        )
        async with server:
            await stop.wait()

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.upstream", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--path", default="/mcp")
    parser.add_argument("--workers", type=int, default=1, help="processes sharing the socket")
    parser.add_argument(
        "--sse-initialize", action="store_true", help="answer initialize as an SSE stream"
    )
    parser.add_argument(
        "--standalone-get",
        action="store_true",
        help="answer GET with an idle SSE stream (a standalone stream) instead of 405",
    )
    args = parser.parse_args(argv)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(4096)
    sock.setblocking(False)
    counters = Counters(max(args.workers, 1))
    children: list[int] = []
    for row in range(1, max(args.workers, 1)):
        pid = os.fork()
        if pid == 0:
            _die_with_parent()
            counters.row = row
            _serve(sock, counters, args)
            os._exit(0)
        children.append(pid)
    port = sock.getsockname()[1]
    print("PIDS", os.getpid(), *children, flush=True)
    print(f"LISTENING http://{args.host}:{port}{args.path}", flush=True)
    try:
        _serve(sock, counters, args)
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
