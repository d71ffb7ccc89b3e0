"""An HTTP relay on loopback that cuts idle connections, as load balancers and CDNs do.

A request whose response sends nothing for ``idle_s`` (no headers yet, or no body bytes since
the last ones) is cut: the client's connection is aborted, like an AWS ALB's or Cloudflare's
idle timeout. Requests are routed by method (``POST`` to one target, ``GET`` to another, say),
so a client's reconnection deterministically lands on another replica than its tool call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping

import aiohttp
from aiohttp import web
from yarl import URL

from tests.support.ports import free_port

_HOP = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive"})


class IdleCutRelay:
    """The relay; ``url`` is its MCP endpoint once started.

    Args:
        targets: MCP endpoint URL by request method; ``"*"`` for the others.
        idle_s: the idle timeout, seconds.

    Attributes:
        cuts: responses cut for idling.
        served: requests relayed per target URL.
    """

    def __init__(self, targets: Mapping[str, str], idle_s: float) -> None:
        self._targets = dict(targets)
        self.idle_s = idle_s
        self.cuts = 0
        self.served: dict[str, int] = dict.fromkeys(self._targets.values(), 0)
        self.url = ""

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[IdleCutRelay]:
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
            self.url = f"http://127.0.0.1:{port}{URL(next(iter(self._targets.values()))).path}"
            try:
                yield self
            finally:
                await runner.cleanup()

    def _cut(self, request: web.Request) -> web.StreamResponse:
        self.cuts += 1
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=504)  # never reaches the client: its connection is gone

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        target = self._targets.get(request.method, self._targets.get("*"))
        assert target is not None, f"no target for {request.method}"
        self.served[target] += 1
        url = URL(target).with_query(request.query)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        body = await request.read() if request.can_read_body else None
        opening = self._client.request(
            request.method, url, headers=headers, data=body, allow_redirects=False
        )
        try:
            upstream = await asyncio.wait_for(opening.__aenter__(), self.idle_s)
        except TimeoutError:
            return self._cut(request)
        try:
            out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in _HOP:
                    out.headers.add(name, value)
            await out.prepare(request)
            while True:
                try:
                    chunk = await asyncio.wait_for(upstream.content.readany(), self.idle_s)
                except TimeoutError:
                    return self._cut(request)
                if not chunk:
                    break
                await out.write(chunk)
            await out.write_eof()
            return out
        except (ConnectionResetError, aiohttp.ClientError):
            return out
        finally:
            upstream.close()
