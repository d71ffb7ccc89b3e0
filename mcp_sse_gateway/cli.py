"""Command line: ``mcp-sse-gateway [serve|check-config|healthcheck|demo]``.

``serve`` is the default command. Exit codes: 0 success, 1 failure at run time (e.g. the address
is in use, or ``healthcheck`` found the gateway not ready), 2 invalid configuration or usage.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

import structlog

from mcp_sse_gateway.config import Settings, load_settings, unknown_variables
from mcp_sse_gateway.errors import ConfigError
from mcp_sse_gateway.logs import configure_logging
from mcp_sse_gateway.tracing import NO_TRACING, Tracing

COMMANDS = ("serve", "check-config", "healthcheck", "demo")
EXIT_CONFIG = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mcp-sse-gateway",
        description="Resumable-streaming reverse proxy for MCP servers (Streamable HTTP).",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    def with_config(
        sub: argparse.ArgumentParser, *, upstream: bool = True
    ) -> argparse.ArgumentParser:
        sub.add_argument(
            "--config", metavar="PATH", help="TOML file (default: $MCP_SSE_GATEWAY_CONFIG)"
        )
        if upstream:
            sub.add_argument("--upstream", metavar="URL", help="upstream MCP endpoint URL")
        sub.add_argument("--host", help="listen address (server.host)")
        sub.add_argument("--port", type=int, help="listen port (server.port)")
        return sub

    with_config(commands.add_parser("serve", help="run the gateway (default)"))
    with_config(
        commands.add_parser(
            "check-config", help="validate the settings and print them, secrets redacted"
        )
    )
    healthcheck = with_config(
        commands.add_parser(
            "healthcheck",
            help="probe /healthz (liveness; with --ready: /readyz); exit 0 when it answers 200",
        )
    )
    healthcheck.add_argument(
        "--ready",
        action="store_true",
        help="probe /readyz instead: fails while the gateway drains (not for container "
        "health checks, which would kill a draining container)",
    )
    demo = with_config(
        commands.add_parser(
            "demo",
            help="start the bundled example MCP server and the gateway in front of it",
        ),
        upstream=False,
    )
    demo.add_argument(
        "--once", action="store_true", help="run the demo client once and exit (no server kept)"
    )
    return parser


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, dict[str, Any]] = {}
    if getattr(args, "upstream", None) is not None:
        overrides.setdefault("upstream", {})["url"] = args.upstream
    if args.host is not None:
        overrides.setdefault("server", {})["host"] = args.host
    if args.port is not None:
        overrides.setdefault("server", {})["port"] = args.port
    return overrides


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if not arguments or (arguments[0] not in COMMANDS and arguments[0] not in ("-h", "--help")):
        arguments.insert(0, "serve")
    args = _parser().parse_args(arguments)
    try:
        settings = load_settings(args.config, _overrides(args))
    except ConfigError as exc:
        print(f"mcp-sse-gateway: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    for name in unknown_variables(os.environ):
        print(
            f"mcp-sse-gateway: warning: {name} names no settings section and is ignored "
            f"(sections: {', '.join(Settings.model_fields)}; e.g. MCP_SSE_GATEWAY_SERVER__PORT)",
            file=sys.stderr,
        )
    if args.command in ("serve", "check-config") and settings.upstream.url is None:
        print(
            "mcp-sse-gateway: upstream.url is required (--upstream URL, [upstream] url, or "
            "env MCP_SSE_GATEWAY_UPSTREAM__URL)",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    if args.command == "check-config":
        return _print(json.dumps(settings.redacted(), indent=2))
    if args.command == "healthcheck":
        return _healthcheck(settings, ready=args.ready)
    if args.command == "demo":
        # The demo narrates on stdout; request logs would drown it unless asked for.
        quiet = "warning" if settings.logging.level == "info" else settings.logging.level
        configure_logging(quiet, settings.logging.format)
        run_demo = _demo_runner()
        return 1 if run_demo is None else asyncio.run(run_demo(settings, once=args.once))
    return _serve_traced(settings)


def _print(text: str) -> int:
    """Print *text* on stdout: 0, or 1 without a traceback when the reader left (``| head``)."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # Python would report the pipe again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


def _serve_traced(settings: Settings) -> int:
    """``serve``, with tracing as the ``OTEL_*`` variables configure it (off without them).

    ``mcp_sse_gateway.otel`` imports OpenTelemetry (an optional extra) only when they ask.
    """
    from mcp_sse_gateway.otel import tracing_from_environment

    try:
        tracing = tracing_from_environment()
    except ConfigError as exc:
        print(f"mcp-sse-gateway: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    configure_logging(settings.logging.level, settings.logging.format, tracing=tracing)
    try:
        return asyncio.run(_serve(settings, tracing))
    finally:
        tracing.shutdown()


def _demo_runner() -> Any:
    """The demo's entry point, or None (after saying why) without the ``example`` extra."""
    try:
        from mcp_sse_gateway.demo import run_demo
    except ImportError as exc:
        print(
            f"mcp-sse-gateway: demo needs the example server's extra ({exc.name} is missing): "
            "pip install 'mcp-sse-gateway[example]'",
            file=sys.stderr,
        )
        return None
    return run_demo


def _healthcheck(settings: Settings, *, ready: bool = False) -> int:
    """Probe the configured gateway's ``/healthz`` (``/readyz`` with *ready*): 0 on 200, else 1.

    A failure is told on stderr in one line: the URL probed and the status or the error.
    """
    host = settings.server.host
    if host in ("0.0.0.0", "::", ""):  # noqa: S104 - probing, not binding
        host = "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    url = f"http://{host}:{settings.server.port}/{'readyz' if ready else 'healthz'}"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            if response.status == HTTPStatus.OK:
                return 0
            why = f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        why = f"HTTP {exc.code}"
    except (OSError, urllib.error.URLError) as exc:
        why = str(getattr(exc, "reason", exc))
    print(f"healthcheck: {url}: {why}", file=sys.stderr)
    return 1


async def _serve(settings: Settings, tracing: Tracing = NO_TRACING) -> int:
    from mcp_sse_gateway.runtime import raise_open_files_limit, tune_gc
    from mcp_sse_gateway.server import run_gateway
    from mcp_sse_gateway.web.app import drain

    log = structlog.get_logger("mcp_sse_gateway.cli")
    stop = asyncio.Event()
    force = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        # First signal: drain gracefully. Second: stop waiting for pumps.
        (force if stop.is_set() else stop).set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal)
    raise_open_files_limit()
    tune_gc(settings.server.gc_young_threshold)  # before serving: its collection pauses
    try:
        async with run_gateway(settings, tracing=tracing) as running:
            await stop.wait()
            log.info("shutdown.started", drain_timeout_s=settings.server.drain_timeout_s)
            await drain(running.app, force=force)
    except OSError as exc:
        log.error("gateway.start_failed", error=str(exc))  # noqa: TRY400 - no traceback needed
        return 1
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signum)
    log.info("shutdown.completed")
    return 0
