"""``mcp-sse-gateway serve`` as a real process on a loopback port, for tests.

    port = free_port()
    env = gateway_env(MCP_SSE_GATEWAY_SERVER__DRAIN_TIMEOUT_S="20")
    async with gateway_process(
        serve_command(upstream_url, port),
        env=env,
        ready_url=f"http://127.0.0.1:{port}/readyz",
        ready_timeout_s=30,
    ) as process:
        ...                                  # ready: /readyz answered 200

The process is stopped when the block is left, however it is left (SIGKILL unless the caller
names another signal and a deadline). :func:`start_gateway` and
:func:`tests.support.waiting.until_status` are the two halves, for a process that outlives a
block (a replica restarted by the test).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from typing import IO, Any

import aiohttp

from tests.support.processes import stop_process
from tests.support.waiting import HTTP_POLL_S, until_status

#: The prefix of the gateway's environment variables.
GATEWAY_ENV_PREFIX = "MCP_SSE_GATEWAY_"

#: Where a child's output goes: a file, ``asyncio.subprocess.DEVNULL`` / ``PIPE``, or None
#: (inherited).
Output = IO[Any] | int | None


def gateway_env(**variables: str) -> dict[str, str]:
    """This process's environment without any ``MCP_SSE_GATEWAY_*`` variable, plus *variables*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(GATEWAY_ENV_PREFIX)}
    env.update(variables)
    return env


def serve_command(
    upstream_url: str | None = None,
    port: int | None = None,
    *,
    host: str | None = None,
    program: Sequence[str] | None = None,
) -> list[str]:
    """The command line of ``serve`` (``python -m mcp_sse_gateway`` unless *program* is given).

    Options left None are not passed (the environment or the defaults decide).
    """
    command = [*(program or [sys.executable, "-m", "mcp_sse_gateway"]), "serve"]
    if upstream_url is not None:
        command += ["--upstream", upstream_url]
    if host is not None:
        command += ["--host", host]
    if port is not None:
        command += ["--port", str(port)]
    return command


async def start_gateway(
    command: Sequence[str],
    *,
    env: dict[str, str],
    cwd: str | os.PathLike[str] | None = None,
    stdout: Output = None,
    stderr: Output = asyncio.subprocess.DEVNULL,
) -> asyncio.subprocess.Process:
    """Start *command* (see :func:`serve_command`); it is not waited for."""
    return await asyncio.create_subprocess_exec(
        *command, env=env, cwd=cwd, stdout=stdout, stderr=stderr
    )


@contextlib.asynccontextmanager
async def gateway_process(
    command: Sequence[str],
    *,
    env: dict[str, str],
    ready_url: str,
    ready_timeout_s: float,
    http: aiohttp.ClientSession | None = None,
    poll_s: float = HTTP_POLL_S,
    cwd: str | os.PathLike[str] | None = None,
    stdout: Output = None,
    stderr: Output = asyncio.subprocess.DEVNULL,
    stop_signal: int = signal.SIGKILL,
    stop_timeout_s: float | None = None,
) -> AsyncIterator[asyncio.subprocess.Process]:
    """Run *command*; yield the process once ``GET ready_url`` answers 200.

    Args:
        command: what to run (see :func:`serve_command`).
        env: its environment (see :func:`gateway_env`).
        ready_url: polled every *poll_s* seconds (with *http*, or a client of its own) until it
            answers 200; RuntimeError as soon as the process exits, TimeoutError after
            *ready_timeout_s*.
        stop_signal: sent when the block is left, if the process still runs; it is killed
            when it has not exited *stop_timeout_s* seconds later (None: no deadline).
    """
    process = await start_gateway(command, env=env, cwd=cwd, stdout=stdout, stderr=stderr)
    try:
        await until_status(
            ready_url, 200, timeout_s=ready_timeout_s, http=http, process=process, poll_s=poll_s
        )
        yield process
    finally:
        await stop_process(process, stop_signal, timeout_s=stop_timeout_s)
