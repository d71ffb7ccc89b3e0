"""Run the gateway: an async context manager shared by the CLI, the demo and the tests."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import traceback
from collections.abc import AsyncIterator
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, cast

import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler, RequestPayloadError
from aiohttp.web_request import BaseRequest

from mcp_sse_gateway.config import Settings, redact_url
from mcp_sse_gateway.web.app import create_app
from mcp_sse_gateway.web.keys import SETTINGS

log = structlog.get_logger("mcp_sse_gateway.server")


class _QuietRequestHandler(RequestHandler):
    """aiohttp's connection handler, minus the echo of unparseable input, plus a header deadline.

    On a malformed request aiohttp answers 400 with the parser's message in the body, and that
    message quotes the offending bytes (an attacker-controlled header line). The gateway answers
    with the bare status phrase instead; the detail still goes to the log.

    aiohttp bounds neither how long a request's headers may take to arrive nor how long a new
    connection may stay silent, so a client trickling headers (slowloris) would hold a
    connection forever. Here the headers must be complete within ``header_timeout_s`` of a new
    connection, or of the first byte of a later request on a kept-alive one (an idle kept-alive
    connection is aiohttp's ``keepalive_timeout``'s business); else the connection is closed.
    """

    def __init__(self, *args: Any, header_timeout_s: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timeout_s = header_timeout_s
        self._header_deadline: asyncio.TimerHandle | None = None
        self._in_request = False

    def _arm(self) -> None:
        if self._header_timeout_s is not None and self._header_deadline is None:
            self._header_deadline = asyncio.get_running_loop().call_later(
                self._header_timeout_s, self._headers_too_slow
            )

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        log.info("client.header_timeout", timeout_s=self._header_timeout_s)
        # force_close() closes the transport and forgets it (aiohttp 3.x); should a version keep
        # it, it is closed here.
        self.force_close()
        transport = self.transport
        if transport is not None:
            transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if not self._in_request:
            self._arm()
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    async def _handle_request(self, request: BaseRequest, *args: Any, **kwargs: Any) -> Any:
        self._in_request = True
        self._disarm()
        try:
            return await super()._handle_request(request, *args, **kwargs)
        finally:
            self._in_request = False

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status == HTTPStatus.INTERNAL_SERVER_ERROR:
            return super().handle_error(request, status, exc, message)
        if status >= HTTPStatus.INTERNAL_SERVER_ERROR:
            # The gateway's failure (a handler timed out: 504), not the client's: an error line.
            _log_failure(None, exc if exc is not None else sys.exc_info()[1], status=status)
        else:
            # A request the parser refused: the client's doing, logged as one line without the
            # parser's message (it quotes the offending line: a cookie, a token, the query).
            log.info("client.bad_request", status=status, error=type(exc).__name__ if exc else None)
        if request.writer.output_size > 0:
            raise ConnectionError("the response has started: no error response can follow")
        response = web.Response(status=status, text=f"{status} {HTTPStatus(status).phrase}")
        response.force_close()
        return response

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        """Log what aiohttp reports, without exception messages (they may quote request data).

        A client's malformed input (an undecodable body read after the handler, say) is one
        info line; anything else an error line with the exception's type and its frames.
        """
        exc_info = kwargs.get("exc_info")
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        if isinstance(exc, (HttpProcessingError, RequestPayloadError)):
            log.info("client.bad_request", error=type(exc).__name__)
            return
        _log_failure(args[0] if args and isinstance(args[0], str) else None, exc)


def _log_failure(what: str | None, exc: BaseException | None, status: int | None = None) -> None:
    """Log one ``server.request_failed`` error line.

    It carries the exception's type and frames, never its message (it may quote request data).
    """
    log.error(
        "server.request_failed",
        what=what,
        status=status,
        error=type(exc).__name__ if exc is not None else None,
        stack="".join(traceback.format_tb(exc.__traceback__)) if exc is not None else None,
    )


class _QuietServer(web.Server):
    header_timeout_s: float | None

    def __call__(self) -> RequestHandler:
        return _QuietRequestHandler(
            self, loop=self._loop, header_timeout_s=self.header_timeout_s, **self._kwargs
        )


class _GatewayRunner(web.AppRunner):
    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # aiohttp builds its Server inside Application; only the handler factory differs.
        server.__class__ = _QuietServer
        cast("_QuietServer", server).header_timeout_s = self._app[SETTINGS].server.header_timeout_s
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
    server = settings.server
    runner = _GatewayRunner(
        app,
        handler_cancellation=True,
        shutdown_timeout=server.drain_timeout_s,
        access_log=None,
        keepalive_timeout=server.keepalive_timeout_s,
        max_headers=server.max_headers,
        max_line_size=server.max_header_bytes,
        max_field_size=server.max_header_bytes,
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
