"""Run the gateway: an async context manager shared by the CLI, the demo and the tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import structlog
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from mcp_sse_gateway.config import Settings, redact_url
from mcp_sse_gateway.web.app import create_app
from mcp_sse_gateway.web.keys import SETTINGS

log = structlog.get_logger("mcp_sse_gateway.server")


class _QuietRequestHandler(RequestHandler):
    """aiohttp's connection handler, minus the echo of unparseable input.

    On a malformed request aiohttp answers 400 with the parser's message in the body, and that
    message quotes the offending bytes (an attacker-controlled header line). The gateway answers
    with the bare status phrase instead; the detail still goes to the log.
    """

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status != HTTPStatus.INTERNAL_SERVER_ERROR:
            message = f"{status} {HTTPStatus(status).phrase}"
        return super().handle_error(request, status, exc, message)


class _QuietServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _QuietRequestHandler(self, loop=self._loop, **self._kwargs)


class _GatewayRunner(web.AppRunner):
    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # aiohttp builds its Server inside Application; only the handler factory differs.
        server.__class__ = _QuietServer
        return server


@dataclass(frozen=True, slots=True)
class RunningGateway:
    """A gateway listening on a socket.

    Attributes:
        app: the application (its ``AppKey`` state is reachable for tests).
        host: the address listened on.
        port: the port listened on (the real one when 0 was asked for).
    """

    app: web.Application
    host: str
    port: int

    @property
    def base_url(self) -> str:
        """``http://host:port`` (IPv6 hosts bracketed)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def mcp_url(self) -> str:
        """The MCP endpoint URL clients use."""
        return self.base_url + self.app[SETTINGS].server.path


@contextlib.asynccontextmanager
async def run_gateway(settings: Settings, **app_kwargs: Any) -> AsyncIterator[RunningGateway]:
    """Start the gateway on ``server.host:server.port`` and stop it on exit.

    Client disconnects cancel their request handler, which closes a pass-through upstream
    request with it. On exit, the app's shutdown sequence runs (readiness false, open streams
    closed), waiting at most ``server.drain_timeout_s`` seconds.

    Args:
        settings: validated settings.
        **app_kwargs: passed to :func:`~mcp_sse_gateway.web.app.create_app` (tests inject a
            store or metrics).

    Yields:
        The running gateway with its real port.

    Raises:
        ConfigError: from ``create_app``.
        OSError: the address cannot be bound.
    """
    app = create_app(settings, **app_kwargs)
    runner = _GatewayRunner(
        app,
        handler_cancellation=True,
        shutdown_timeout=settings.server.drain_timeout_s,
        access_log=None,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.server.host, settings.server.port, reuse_address=True)
        await site.start()
        port = runner.addresses[0][1]
        running = RunningGateway(app=app, host=settings.server.host, port=port)
        log.info(
            "gateway.listening",
            url=running.mcp_url,
            upstream=redact_url(str(settings.upstream.url)),
            store=settings.store.backend,
        )
        yield running
    finally:
        await runner.cleanup()
