"""An HTTP relay on loopback that counts the upstream GET streams open per MCP session.

Put between the gateways and a real upstream: every request is relayed as it is (bodies
streamed both ways), and each GET carrying ``Mcp-Session-Id`` is counted while open, with the
times it opened and closed. A GET's end is seen at once: the relay's handler is cancelled when
the gateway closes the connection (``handler_cancellation``), which closes the upstream request.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from yarl import URL

from tests.support.ports import free_port

_HOP = frozenset({"host", "content-length", "transfer-encoding", "connection"})


@dataclass
class SessionGets:
    """The upstream GETs of one session: how many are open, the most at once, and when."""

    open: int = 0
    most: int = 0
    opened_at: list[float] = field(default_factory=list)
    closed_at: list[float] = field(default_factory=list)


class CountingProxy:
    """The relay; ``url`` is its MCP endpoint once started.

    Args:
        upstream_url: the real upstream's MCP endpoint.
    """

    def __init__(self, upstream_url: str) -> None:
        self._upstream = upstream_url
        self.sessions: dict[str, SessionGets] = {}
        #: Every request relayed: its method and headers (names lower-cased), in order.
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.url = ""
        self._changed = asyncio.Event()

    def gets(self, session_id: str) -> SessionGets:
        """The counts of *session_id* (empty before its first GET)."""
        return self.sessions.setdefault(session_id, SessionGets())

    async def wait(self, condition: object, timeout_s: float) -> None:
        """Wait until *condition()* holds (checked on every GET opened or closed)."""
        async with asyncio.timeout(timeout_s):
            while not condition():  # type: ignore[operator]
                self._changed.clear()
                await self._changed.wait()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[CountingProxy]:
        """Serve on a free loopback port for the block."""
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._relay)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        port = free_port()
        site = web.TCPSite(runner, "127.0.0.1", port)
        async with aiohttp.ClientSession(auto_decompress=False) as client:
            self._client = client
            await site.start()
            self.url = f"http://127.0.0.1:{port}{URL(self._upstream).path}"
            try:
                yield self
            finally:
                await runner.cleanup()

    def _count(self, session_id: str, delta: int) -> None:
        gets = self.gets(session_id)
        gets.open += delta
        gets.most = max(gets.most, gets.open)
        (gets.opened_at if delta > 0 else gets.closed_at).append(time.monotonic())
        self._changed.set()

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        target = URL(self._upstream).with_path(request.path).with_query(request.query)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        self.requests.append((request.method, {k.lower(): v for k, v in headers}))
        body = await request.read() if request.can_read_body else None
        session_id = request.headers.get("Mcp-Session-Id")
        counted = request.method == "GET" and session_id is not None
        async with self._client.request(
            request.method, target, headers=headers, data=body, allow_redirects=False
        ) as upstream:
            out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in _HOP:
                    out.headers.add(name, value)
            streaming = counted and upstream.status == 200
            if streaming:
                assert session_id is not None
                self._count(session_id, +1)
            try:
                await out.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
            except (ConnectionResetError, aiohttp.ClientError):
                pass
            finally:
                if streaming:
                    assert session_id is not None
                    self._count(session_id, -1)
        return out
