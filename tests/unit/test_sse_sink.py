"""The SSE response sink: the closing ``retry`` and the end of the response in one write."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from mcp_sse_gateway.errors import SlowReader
from mcp_sse_gateway.sse import SSEDecoder
from mcp_sse_gateway.streams.sink import close_with_retry
from mcp_sse_gateway.web.sse_sink import SSEResponseSink, open_sse


async def test_retry_and_the_end_of_the_response_leave_in_one_write():
    writes: list[bytes] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        response, sink = await open_sse(request, None, cut_s=5.0)
        await sink.write(b"id: a-1\ndata: x\n\n")
        transport: Any = request.transport
        write, writelines = transport.write, transport.writelines
        # Every write from here on, as the socket transport gets it.
        transport.write = lambda data: (writes.append(bytes(data)), write(data))[1]
        transport.writelines = lambda parts: (
            writes.append(b"".join(parts)),
            writelines(parts),
        )[1]
        await close_with_retry(sink, 1500)
        return response

    app = web.Application()
    app.router.add_get("/", handler)
    async with TestClient(TestServer(app)) as client:
        response = await client.get("/")
        body = await response.read()
    events = SSEDecoder().feed(body)
    assert [(e.data, e.retry) for e in events] == [("x", None), (None, 1500)]
    assert len(writes) == 1, writes
    assert writes[0].endswith(b"retry: 1500\n\n\r\n0\r\n\r\n")


class _PausedTransport:
    def __init__(self) -> None:
        self.aborted = False

    def is_closing(self) -> bool:
        return False

    def abort(self) -> None:
        self.aborted = True


class _Blocked:
    """A response whose end never drains (a client that stopped reading)."""

    async def write_eof(self, _data: bytes = b"") -> None:
        await asyncio.Event().wait()


async def test_an_end_that_stays_blocked_is_a_slow_reader_and_cuts_the_connection():
    transport = _PausedTransport()
    request: Any = type("Request", (), {})()
    request.transport = transport
    request.protocol = type("Protocol", (), {"writing_paused": True})()
    sink = SSEResponseSink(request, _Blocked(), cut_s=0.01)  # type: ignore[arg-type]
    with pytest.raises(SlowReader):
        await sink.end(b"retry: 1000\n\n")
    assert transport.aborted


async def test_an_end_to_a_client_gone_is_no_error():
    async def handler(request: web.Request) -> web.StreamResponse:
        response, sink = await open_sse(request, None, cut_s=5.0)
        assert request.transport is not None
        request.transport.close()
        await sink.end(b"retry: 1000\n\n")  # must not raise
        return response

    app = web.Application()
    app.router.add_get("/", handler)
    async with TestClient(TestServer(app)) as client:
        with pytest.raises(aiohttp.ClientError):
            await (await client.get("/")).read()
