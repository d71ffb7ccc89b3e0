"""Build and serve the example MCP server (official ``mcp`` SDK, Streamable HTTP, no event store).

:func:`build_server` makes the ``MCPServer``, :func:`build_app` its ASGI app, :func:`serve`
runs it with uvicorn and announces the URL, :func:`main` is the command line
(``python -m mcp_sse_gateway.example``).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import signal
import socket
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPDeprecationWarning
from starlette.applications import Starlette

from mcp_sse_gateway import __version__
from mcp_sse_gateway.example.auth import BearerAuth, TokenFile
from mcp_sse_gateway.example.conformance import conformance_tools, register_conformance
from mcp_sse_gateway.example.gateway_tools import register_gateway_tools
from mcp_sse_gateway.example.protocol import ServerState
from mcp_sse_gateway.example.skills import SkillsExtension
from mcp_sse_gateway.example.task_tools import register_task_fixtures

SERVER_NAME = "mcp-sse-gateway-example"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PATH = "/mcp"
#: Same as the gateway's default request body limit, so a body the gateway accepts is accepted.
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
#: After SIGTERM/SIGINT, open streams get this long to finish before they are cut.
DEFAULT_GRACEFUL_SHUTDOWN_S = 3.0
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
ANNOUNCEMENT = "LISTENING"

_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def build_server() -> MCPServer[Any]:
    """The example MCP server: the conformance surface plus the gateway test tools.

    Returns:
        A new server with its own state (subscriptions, log levels).
    """
    state = ServerState()
    server: MCPServer[Any] = MCPServer(
        SERVER_NAME,
        version=__version__,
        instructions=(
            "Example MCP server bundled with mcp-sse-gateway: the MCP conformance suite's "
            "test surface and tools for testing resumable streams. It keeps no event store."
        ),
        tools=conformance_tools(),
        extensions=[SkillsExtension()],
        log_level="WARNING",
    )
    register_conformance(server, state)
    register_gateway_tools(server, state)
    register_task_fixtures(server)
    return server


def _host_header(host: str) -> str:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    return f"[{host}]" if address.version == 6 else host  # noqa: PLR2004 - IPv6


def transport_security(
    host: str, *, allowed_hosts: Sequence[str] = (), allowed_origins: Sequence[str] = ()
) -> TransportSecuritySettings:
    """DNS-rebinding protection: which ``Host`` and ``Origin`` headers are accepted.

    Always accepted: ``127.0.0.1``, ``localhost`` and ``[::1]`` with or without a port, the
    address the server listens on (any port), and whatever is passed in; ``Origin`` the same
    names over ``http``/``https``, or no ``Origin`` at all. Anything else gets 421 (Host) or 403
    (Origin).

    Args:
        host: the listen address.
        allowed_hosts: further ``Host`` values (``name`` or ``name:port``, ``name:*``).
        allowed_origins: further ``Origin`` values (``scheme://name[:port]``, ``...:*``).

    Returns:
        The SDK's settings.
    """
    names = list(dict.fromkeys([*_LOOPBACK_NAMES, _host_header(host)]))
    hosts = [pattern for name in names for pattern in (name, f"{name}:*")]
    origins = [
        pattern
        for name in names
        for scheme in ("http", "https")
        for pattern in (f"{scheme}://{name}", f"{scheme}://{name}:*")
    ]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[*hosts, *allowed_hosts],
        allowed_origins=[*origins, *allowed_origins],
    )


def build_app(
    *,
    host: str = DEFAULT_HOST,
    path: str = DEFAULT_PATH,
    stateless: bool = False,
    json_response: bool = False,
    allowed_hosts: Sequence[str] = (),
    allowed_origins: Sequence[str] = (),
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    server: MCPServer[Any] | None = None,
    auth_file: Path | None = None,
    bind_sessions: bool = False,
) -> Starlette | BearerAuth:
    """The ASGI app serving the example server over Streamable HTTP, without an event store.

    Args:
        host: the listen address (accepted as ``Host`` besides the loopback names).
        path: the MCP endpoint.
        stateless: no sessions (no ``Mcp-Session-Id``); a fresh transport per request.
        json_response: answer POSTs with JSON bodies instead of SSE streams.
        allowed_hosts: further accepted ``Host`` values, see :func:`transport_security`.
        allowed_origins: further accepted ``Origin`` values.
        max_body_bytes: request body limit (413 above it).
        server: the server to serve (default: a new :func:`build_server`).
        auth_file: require bearer tokens from this token file (see
            :mod:`mcp_sse_gateway.example.auth`).
        bind_sessions: with *auth_file*: a session belongs to the user who initialized it.

    Returns:
        A Starlette app whose lifespan runs the SDK's session manager (wrapped in
        :class:`~mcp_sse_gateway.example.auth.BearerAuth` with *auth_file*).
    """
    mcp_server = server if server is not None else build_server()
    app = mcp_server.streamable_http_app(
        streamable_http_path=path,
        stateless_http=stateless,
        json_response=json_response,
        event_store=None,  # on purpose: resumability is the gateway's job
        max_request_body_size=max_body_bytes,
        transport_security=transport_security(
            host, allowed_hosts=allowed_hosts, allowed_origins=allowed_origins
        ),
        host=host,
    )
    if auth_file is None:
        return app
    return BearerAuth(app, TokenFile(auth_file), path=path, bind_sessions=bind_sessions)


def endpoint_url(host: str, port: int, path: str) -> str:
    """The URL clients use: ``http://<host>:<port><path>`` (IPv6 hosts in brackets)."""
    return f"http://{_host_header(host)}:{port}{path}"


class _AnnouncingServer(uvicorn.Server):
    """A uvicorn server that prints ``LISTENING <url>`` on stdout once it accepts connections."""

    def __init__(self, config: uvicorn.Config, *, url: str) -> None:
        super().__init__(config)
        self.url = url

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            sys.stdout.write(f"{ANNOUNCEMENT} {self.url}\n")
            sys.stdout.flush()


def _bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on *host*:*port* (port 0: a free one, chosen by the kernel)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock


async def serve(
    *,
    host: str = DEFAULT_HOST,
    port: int = 0,
    path: str = DEFAULT_PATH,
    log_level: str = "warning",
    graceful_shutdown_s: float = DEFAULT_GRACEFUL_SHUTDOWN_S,
    **app_options: Any,
) -> None:
    """Serve the example server until SIGTERM or SIGINT, announcing its URL on stdout.

    Args:
        host: listen address.
        port: listen port; 0 picks a free one.
        path: MCP endpoint path.
        log_level: uvicorn's log level (logs go to stderr).
        graceful_shutdown_s: how long open streams may run on after the signal.
        **app_options: passed to :func:`build_app`.
    """
    sock = _bind(host, port)
    bound_port = sock.getsockname()[1]
    app = build_app(host=host, path=path, **app_options)
    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=log_level in ("debug", "trace"),
        # Annotated int in uvicorn, but only ever handed to asyncio.wait_for (a float timeout).
        timeout_graceful_shutdown=graceful_shutdown_s,  # type: ignore[arg-type]
        lifespan="on",
    )
    server = _AnnouncingServer(config, url=endpoint_url(host, bound_port, path))
    try:
        await server.serve(sockets=[sock])
    finally:
        sock.close()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mcp_sse_gateway.example",
        description=(
            "The example MCP server bundled with mcp-sse-gateway (official mcp SDK, Streamable "
            f"HTTP, no event store). Prints '{ANNOUNCEMENT} <url>' on stdout once it listens."
        ),
    )
    parser.add_argument("--host", default=DEFAULT_HOST, help="listen address (default %(default)s)")
    parser.add_argument(
        "--port", type=int, default=0, help="listen port; 0 picks a free one (default)"
    )
    parser.add_argument("--path", default=DEFAULT_PATH, help="MCP endpoint (default %(default)s)")
    parser.add_argument(
        "--stateless", action="store_true", help="no sessions: a fresh transport per request"
    )
    parser.add_argument(
        "--json-response", action="store_true", help="answer POSTs with JSON instead of SSE"
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="HOST",
        help="also accept this Host header (repeatable; 'name:*' for any port)",
    )
    parser.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="also accept this Origin header (repeatable; 'scheme://name:*' for any port)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="request body limit (default %(default)s)",
    )
    parser.add_argument(
        "--auth",
        type=Path,
        metavar="FILE",
        help="require bearer tokens listed in this JSON file (re-read when it changes; see "
        "mcp_sse_gateway/example/auth.py)",
    )
    parser.add_argument(
        "--bind-sessions",
        action="store_true",
        help="with --auth: a session belongs to the user who created it (others get 404)",
    )
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=LOG_LEVELS,
        help="uvicorn and SDK log level, on stderr (default %(default)s)",
    )
    return parser


def _exit_cleanly(signum: int, frame: object) -> None:
    """SIGTERM/SIGINT outside uvicorn's own handling (which re-raises them once shut down)."""
    del signum, frame
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 after a signal, 1 if it cannot listen)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.bind_sessions and args.auth is None:
        parser.error("--bind-sessions needs --auth FILE")
    if args.auth is not None and not args.auth.is_file():
        parser.error(f"--auth: no such file: {args.auth}")
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_cleanly)
    level = "debug" if args.log_level == "trace" else args.log_level
    logging.basicConfig(level=level.upper(), stream=sys.stderr)
    logging.getLogger("mcp").setLevel(level.upper())
    # The server exercises capabilities the 2026 revision deprecates, on purpose.
    warnings.filterwarnings("ignore", category=MCPDeprecationWarning)
    try:
        asyncio.run(
            serve(
                host=args.host,
                port=args.port,
                path=args.path,
                log_level=args.log_level,
                stateless=args.stateless,
                json_response=args.json_response,
                allowed_hosts=args.allow_host,
                allowed_origins=args.allow_origin,
                max_body_bytes=args.max_body_bytes,
                auth_file=args.auth,
                bind_sessions=args.bind_sessions,
            )
        )
    except OSError as exc:
        sys.stderr.write(f"cannot listen on {args.host}:{args.port}: {exc}\n")
        return 1
    return 0
