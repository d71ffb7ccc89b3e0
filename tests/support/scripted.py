"""A scripted upstream: an aiohttp server whose handlers each test sets, recording requests."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from mcp_sse_gateway.web.authz import PROBE_ID_PREFIX

DEADLINE_S = 10

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ScriptedUpstream:
    """An aiohttp upstream whose handlers the test sets; records every request it receives.

    Like every MCP server it answers the gateway's authorization probes (a JSON-RPC ``ping``
    whose id starts with ``PROBE_ID_PREFIX``) with an empty result, unless ``answer_pings`` is
    False; they are recorded in ``pings`` (their headers), not in ``requests``. Other pings go
    to the routes like any request.
    """

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.pings: list[list[tuple[str, str]]] = []
        self.answer_pings = True
        self.routes: dict[str, Handler] = {}
        self.server: TestServer | None = None

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        ping = _ping_id(body) if request.method == "POST" and self.answer_pings else None
        if ping is not None:
            self.pings.append(list(request.headers.items()))
            return web.json_response({"jsonrpc": "2.0", "id": ping, "result": {}})
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


def _ping_id(body: bytes) -> Any:
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if (
        isinstance(message, dict)
        # A session's probe is a ping; a 2026-07-28 request's, a server/discover.
        and message.get("method") in {"ping", "server/discover"}
        and str(message.get("id", "")).startswith(PROBE_ID_PREFIX)
    ):
        return message["id"]
    return None


async def start_scripted() -> tuple[ScriptedUpstream, TestServer]:
    """Start a scripted upstream on a free loopback port."""
    scripted = ScriptedUpstream()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", scripted._dispatch)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    scripted.server = server
    return scripted, server
