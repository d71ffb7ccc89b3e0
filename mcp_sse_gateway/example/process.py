"""Run the example MCP server as a child process (used by the demo and the tests).

    async with example_upstream() as url:                   # "http://127.0.0.1:<port>/mcp"
        ...
    async with example_upstream_process("--stateless") as upstream:
        upstream.url, upstream.port, upstream.process, upstream.stderr_tail()
        upstream.kill()                                     # crash it on purpose (SIGKILL)

The child is ``python -m mcp_sse_gateway.example --host 127.0.0.1 --port 0 ARGS...`` (extra
arguments come last, so they may override the first ones): it listens on a free loopback port.
Start-up waits for its ``LISTENING <url>`` line on stdout, bounded by a deadline; leaving the
block stops it (SIGTERM, then SIGKILL after another deadline) whatever happened inside. Its
stderr is read all along (so it can never block on a full pipe) and its last lines are kept
for error messages.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Mapping, MutableSequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

MODULE = "mcp_sse_gateway.example"
ANNOUNCEMENT = "LISTENING "
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
STDERR_LINES_KEPT = 200
#: The directory holding the ``mcp_sse_gateway`` package, put on the child's PYTHONPATH.
SOURCE_ROOT = Path(__file__).resolve().parents[2]


class UpstreamStartError(RuntimeError):
    """The example server exited, or did not announce itself in time."""


@dataclass
class RunningUpstream:
    """A running example server.

    Attributes:
        url: its MCP endpoint, as announced (``http://127.0.0.1:<port>/mcp``).
        process: the child process.
        stderr_lines: the last lines it wrote on stderr.
        stdout_lines: what it printed on stdout after the announcement (normally nothing).
    """

    url: str
    process: asyncio.subprocess.Process
    stderr_lines: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=STDERR_LINES_KEPT)
    )
    stdout_lines: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        """The TCP port it listens on."""
        port = urlsplit(self.url).port
        assert port is not None
        return port

    @property
    def origin(self) -> str:
        """``http://127.0.0.1:<port>``: the URL without the endpoint path."""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}"

    def stderr_tail(self) -> str:
        """The last lines of its stderr, for failure messages."""
        return "".join(self.stderr_lines)

    def kill(self) -> None:
        """SIGKILL it now (an upstream crash); stopping it later is then a no-op."""
        if self.process.returncode is None:
            self.process.kill()


def _child_environment(env: Mapping[str, str] | None) -> dict[str, str]:
    child = dict(os.environ if env is None else env)
    paths = [str(SOURCE_ROOT), *filter(None, child.get("PYTHONPATH", "").split(os.pathsep))]
    child["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return child


async def _pump(stream: asyncio.StreamReader | None, sink: MutableSequence[str]) -> None:
    if stream is None:
        return
    while line := await stream.readline():
        sink.append(line.decode("utf-8", "replace"))


async def _stop(process: asyncio.subprocess.Process, timeout_s: float) -> None:
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        async with asyncio.timeout(timeout_s):
            await process.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


async def _join(readers: list[asyncio.Task[None]], timeout_s: float) -> None:
    """Wait for the pipe readers (they end at EOF, once the process is gone)."""
    _done, pending = await asyncio.wait(readers, timeout=timeout_s)
    for reader in pending:
        reader.cancel()


async def _announcement(
    process: asyncio.subprocess.Process, timeout_s: float
) -> tuple[str | None, str]:
    """The URL of the ``LISTENING`` line, or None and what went wrong instead."""
    assert process.stdout is not None
    try:
        async with asyncio.timeout(timeout_s):
            while line := await process.stdout.readline():
                text = line.decode("utf-8", "replace").strip()
                if text.startswith(ANNOUNCEMENT):
                    return text.removeprefix(ANNOUNCEMENT).strip(), ""
            await process.wait()
    except TimeoutError:
        return None, f"printed no {ANNOUNCEMENT.strip()} line within {timeout_s:g} s"
    return None, f"exited with code {process.returncode} before listening"


@contextlib.asynccontextmanager
async def example_upstream_process(
    *args: str,
    start_timeout_s: float = START_TIMEOUT_S,
    stop_timeout_s: float = STOP_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
) -> AsyncIterator[RunningUpstream]:
    """Start the example server with extra command-line *args*; yields it once it listens.

    Args:
        *args: more options for ``python -m mcp_sse_gateway.example`` (``--stateless``,
            ``--json-response``, ``--log-level debug`` …).
        start_timeout_s: how long to wait for the ``LISTENING`` line.
        stop_timeout_s: how long SIGTERM may take before SIGKILL.
        env: environment of the child (default: this process's).

    Yields:
        The running server.

    Raises:
        UpstreamStartError: it exited or stayed silent past the deadline (the message carries
            its stderr).
    """
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        MODULE,
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_child_environment(env),
    )
    stderr_lines: collections.deque[str] = collections.deque(maxlen=STDERR_LINES_KEPT)
    readers = [asyncio.create_task(_pump(process.stderr, stderr_lines))]
    try:
        url, problem = await _announcement(process, start_timeout_s)
        if url is None:
            await _stop(process, stop_timeout_s)
            await _join(readers, stop_timeout_s)
            raise UpstreamStartError(
                f"`python -m {MODULE}` {problem}; stderr:\n{''.join(stderr_lines)[-3000:]}"
            )
        running = RunningUpstream(url=url, process=process, stderr_lines=stderr_lines)
        readers.append(asyncio.create_task(_pump(process.stdout, running.stdout_lines)))
        yield running
    finally:
        await _stop(process, stop_timeout_s)
        await _join(readers, stop_timeout_s)


@contextlib.asynccontextmanager
async def example_upstream(
    *args: str,
    start_timeout_s: float = START_TIMEOUT_S,
    stop_timeout_s: float = STOP_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
) -> AsyncIterator[str]:
    """Start the example server with extra command-line *args*; yields its MCP endpoint URL.

    See :func:`example_upstream_process` for the arguments and the guarantees.

    Yields:
        The URL it announced, ``http://127.0.0.1:<port>/mcp`` by default.
    """
    async with example_upstream_process(
        *args, start_timeout_s=start_timeout_s, stop_timeout_s=stop_timeout_s, env=env
    ) as running:
        yield running.url
