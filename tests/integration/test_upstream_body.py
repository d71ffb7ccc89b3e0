"""The upstream's response body through aiohttp's client (``web/upstream.py``), against a raw
HTTP/1.1 server on loopback: every way a body ends is seen, and none is mistaken for another."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from yarl import URL

from mcp_sse_gateway.config import UpstreamSettings
from mcp_sse_gateway.errors import UpstreamBroken
from mcp_sse_gateway.web import upstream as web_upstream
from mcp_sse_gateway.web.upstream import HttpUpstream

DEADLINE_S = 10
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def _server(answer: Answer) -> AsyncIterator[URL]:
    """A raw server answering every request on a connection with *answer*, in turn."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.lower().split(b"\r\n")
                        if line.startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                await answer(reader, writer)
                if writer.is_closing():
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield URL(f"http://127.0.0.1:{port}/mcp")


@contextlib.asynccontextmanager
async def _upstream() -> AsyncIterator[HttpUpstream]:
    upstream = HttpUpstream(UpstreamSettings(url="http://127.0.0.1:1/mcp"), lambda _: None)
    upstream.start()
    try:
        yield upstream
    finally:
        await upstream.close()


async def _body(upstream: HttpUpstream, url: URL) -> bytes:
    async with await upstream.open("POST", url, [], b"{}") as response:
        chunks = [chunk async for chunk in response.chunks()]
    return b"".join(chunks)


async def test_a_malformed_chunk_size_breaks_the_body_rather_than_hanging_it():
    # aiohttp's C parser closes the connection on the bad line without ending the body.
    first_read = asyncio.Event()

    async def answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        await asyncio.wait_for(first_read.wait(), DEADLINE_S)
        writer.write(b"zz\r\nnot a chunk\r\n")
        await writer.drain()

    async with (
        _server(answer) as url,
        _upstream() as upstream,
        await upstream.open("POST", url, [], b"{}") as response,
    ):
        chunks = response.chunks()
        assert await anext(chunks) == b"hello"
        first_read.set()
        with pytest.raises(UpstreamBroken):
            await asyncio.wait_for(anext(chunks), DEADLINE_S)


@pytest.mark.parametrize(
    ("head", "rest"),
    [
        (b"Transfer-Encoding: chunked\r\n\r\n2\r\nhe\r\n", b"3\r\nllo\r\n0\r\n\r\n"),
        (b"Content-Length: 5\r\n\r\nhe", b"llo"),
    ],
)
async def test_bodies_on_one_kept_alive_connection_end_cleanly_and_share_one_watch(head, rest):
    # Each body is still arriving when read: its connection is watched while it is.
    go: asyncio.Queue[None] = asyncio.Queue()

    async def answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD + head)
        await writer.drain()
        await asyncio.wait_for(go.get(), DEADLINE_S)
        writer.write(rest)
        await writer.drain()

    before = set(web_upstream._WATCHES.values())
    bodies, guarded = [], []
    async with _server(answer) as url, _upstream() as upstream:
        for _ in range(200):
            async with await upstream.open("POST", url, [], b"{}") as response:
                chunks = response.chunks()
                body = await anext(chunks)
                guarded.append([w.body for w in web_upstream._WATCHES.values() if w not in before])
                go.put_nowait(None)
                bodies.append(body + b"".join([chunk async for chunk in chunks]))
        added = [w for w in web_upstream._WATCHES.values() if w not in before]
        # One connection, one watch (one callback on its closed future), guarding nothing
        # between bodies.
        assert [w.body for w in added] == [None]
    assert bodies == [b"hello"] * 200
    assert all(len(g) == 1 and g[0] is not None for g in guarded)


def _then_close(rest: bytes) -> Answer:
    """An answer: the head and *rest*, then the connection closed."""

    async def answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD + rest)
        await writer.drain()
        writer.close()

    return answer


async def test_a_body_ended_by_the_servers_close_ends_cleanly():
    async with (
        _server(_then_close(b"Connection: close\r\n\r\nhello")) as url,
        _upstream() as upstream,
    ):
        assert await _body(upstream, url) == b"hello"


async def test_a_truncated_chunked_body_is_broken():
    truncated = _then_close(b"Transfer-Encoding: chunked\r\n\r\n5\r\nhel")
    async with _server(truncated) as url, _upstream() as upstream:
        with pytest.raises(UpstreamBroken):
            await asyncio.wait_for(_body(upstream, url), DEADLINE_S)


async def test_a_body_left_unread_is_not_kept_by_its_connections_watch():
    go: asyncio.Queue[None] = asyncio.Queue()

    async def answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD + b"Content-Length: 100002\r\n\r\nhe")
        await writer.drain()
        await asyncio.wait_for(go.get(), DEADLINE_S)
        writer.write(b"x" * 100_000)
        await writer.drain()

    before = set(web_upstream._WATCHES.values())
    async with _server(answer) as url, _upstream() as upstream:
        async with await upstream.open("POST", url, [], b"{}") as response:
            assert await anext(response.chunks()) == b"he"
            go.put_nowait(None)
            await asyncio.wait_for(response._response.content.wait_eof(), DEADLINE_S)
        # The caller stopped before the end: its connection went back to the pool, the body
        # with its 100 kB unread is no longer held.
        added = [w for w in web_upstream._WATCHES.values() if w not in before]
        assert [w.body for w in added] == [None]


async def test_a_read_refused_for_a_closed_connection_is_a_broken_body():
    class Closed:
        async def readany(self) -> bytes:
            raise RuntimeError("Connection closed.")  # aiohttp's, before the body ended

    with pytest.raises(UpstreamBroken):
        await anext(web_upstream._Body(Closed(), None))  # type: ignore[arg-type]


async def test_a_body_says_it_ended_only_once_its_end_came():
    go: asyncio.Queue[None] = asyncio.Queue()

    async def answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await asyncio.wait_for(go.get(), DEADLINE_S)
        writer.write(b"4\r\nlast\r\n0\r\n\r\n")  # the last chunk and the end, in one write
        await writer.drain()

    async with (
        _server(answer) as url,
        _upstream() as upstream,
        await upstream.open("POST", url, [], b"{}") as response,
    ):
        body = response.chunks()
        assert await anext(body) == b"first"
        assert not body.ended  # type: ignore[attr-defined]
        go.put_nowait(None)
        assert await asyncio.wait_for(anext(body), DEADLINE_S) == b"last"
        assert body.ended  # type: ignore[attr-defined]
        assert [chunk async for chunk in body] == []
