"""A scripted upstream: an aiohttp server whose handlers each test sets, recording requests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

DEADLINE_S = 10

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ScriptedUpstream:
    """An aiohttp upstream whose handlers the test sets; records every request it receives."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.routes: dict[str, Handler] = {}
        self.server: TestServer | None = None

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(
            {
                "method": request.method,
                "path": request.path,
                "query": request.rel_url.raw_query_string,
                "headers": list(request.headers.items()),
                "body": body,
            }
        )
        handler = self.routes.get(request.path)
        if handler is None:
            return web.json_response({"path": request.path}, status=200)
        return await handler(request)

    def header(self, index: int, name: str) -> list[str]:
        return [v for n, v in self.requests[index]["headers"] if n.lower() == name.lower()]

    @property
    def url(self) -> str:
        assert self.server is not None
        return str(self.server.make_url("/mcp"))


async def start_scripted() -> tuple[ScriptedUpstream, TestServer]:
    """Start a scripted upstream on a free loopback port."""
    scripted = ScriptedUpstream()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", scripted._dispatch)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    scripted.server = server
    return scripted, server
