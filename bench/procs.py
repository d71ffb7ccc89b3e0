"""Process helpers: free ports, child processes with deadlines, CPU and memory from /proc.

Everything waits on a condition with a deadline (a line on stdout, a port answering, a process
exiting); nothing sleeps blindly.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: The repository root: the directory holding ``bench`` and ``mcp_sse_gateway``.
ROOT = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024
POLL_S = 0.01
STOP_TIMEOUT_S = 10.0


class StartError(RuntimeError):
    """A child process exited, or did not become ready before its deadline."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the caller binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: Open files the scale scenarios want per process: a proxy holding 10,000 streams has a client
#: and an upstream socket for each.
WANTED_NOFILE = 65_536


def raise_nofile_limit() -> int:
    """Raise this process's (and its future children's) open-file limit as far as allowed.

    Up to :data:`WANTED_NOFILE` when the hard limit is lower and this process may raise it
    (root), else to the hard limit. Returns the soft limit now.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < WANTED_NOFILE:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (WANTED_NOFILE, WANTED_NOFILE))
            return WANTED_NOFILE
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard
    return soft


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without ``MCP_SSE_GATEWAY_*`` variables, the repo on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_SSE_GATEWAY_")}
    paths = [str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.update(extra or {})
    return env


def process_cpu_clock(pid: int) -> int:
    """Linux's CPU-time clock id of process *pid* (``clock_getcpuclockid(3)``, which Python lacks).

    The kernel encodes it as ``~pid << 3 | CPUCLOCK_SCHED``: the scheduler's runtime of every
    thread of the process, in nanoseconds, exited threads included.
    """
    return (~pid << 3) | 2


def cpu_seconds(pids: Sequence[int]) -> float:
    """CPU time of *pids* (all their threads), seconds; gone pids count 0.

    Read from each process's CPU-time clock (nanoseconds), so a short run is not rounded to
    the clock ticks of ``/proc/<pid>/stat`` (10 ms each: 10 µs per event over 1,000 events);
    from ``/proc`` (utime + stime) where that clock cannot be read.
    """
    total = 0.0
    for pid in pids:
        if pid <= 0:  # to the kernel, pid 0's clock is the caller's own
            continue
        try:
            total += time.clock_gettime(process_cpu_clock(pid))
            continue
        except OSError:
            pass
        total += proc_cpu_seconds(pid)
    return total


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of *pid* from ``/proc/<pid>/stat``, seconds, in clock ticks; 0 if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    # The command name may hold spaces: fields are counted after its closing parenthesis.
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def self_cpu_seconds() -> float:
    """CPU time of this process (every thread), seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rss_mib(pid: int) -> float:
    """Resident memory of *pid* (VmRSS), MiB; 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cpu_model() -> str:
    """The processor's model name, for the report's header."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


@dataclass
class Child:
    """A child process whose output goes to a log file."""

    name: str
    process: asyncio.subprocess.Process
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""


async def stop_process(
    process: asyncio.subprocess.Process, timeout_s: float = STOP_TIMEOUT_S
) -> None:
    """SIGTERM, then SIGKILL after *timeout_s*; a second SIGTERM halfway (forces a drain)."""
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        async with asyncio.timeout(timeout_s / 2):
            await process.wait()
            return
    except TimeoutError:
        pass
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        async with asyncio.timeout(timeout_s / 2):
            await process.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        # SIGKILL ends it at once; the wait is bounded anyway (asyncio's wait() also waits for
        # the process's pipes, which a child of its own may hold open).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await process.wait()


def _new_log(workdir: Path, name: str) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir / f"{name}.log"


@contextlib.asynccontextmanager
async def child_process(
    name: str,
    argv: Sequence[str],
    *,
    workdir: Path,
    env: dict[str, str] | None = None,
    stop_timeout_s: float = STOP_TIMEOUT_S,
) -> AsyncIterator[Child]:
    """Run *argv* with stdout and stderr to ``workdir/<name>.log``; stop it on exit."""
    log_path = _new_log(workdir, name)
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env if env is not None else child_env(),
            cwd=str(ROOT),
        )
    try:
        yield Child(name, process, log_path)
    finally:
        await stop_process(process, stop_timeout_s)


async def wait_until(
    condition: Callable[[], Awaitable[bool]],
    *,
    timeout_s: float,
    what: str,
    alive: Child | None = None,
    poll_s: float = POLL_S,
) -> None:
    """Poll *condition* until true; StartError after *timeout_s* or when *alive* exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        if alive is not None and alive.process.returncode is not None:
            raise StartError(
                f"{alive.name} exited with code {alive.process.returncode} before {what}; "
                f"log tail:\n{alive.log_tail()}"
            )
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, ValueError):
            if await condition():
                return
        if time.monotonic() >= deadline:
            tail = f"; log tail:\n{alive.log_tail()}" if alive is not None else ""
            raise StartError(f"timed out after {timeout_s:g} s waiting for {what}{tail}")
        await asyncio.sleep(poll_s)


async def http_get(
    url_host: str, port: int, path: str, timeout_s: float = 5.0
) -> tuple[int, bytes]:
    """A one-shot ``GET`` (``Connection: close``): status and body. For probes and counters."""
    async with asyncio.timeout(timeout_s):
        reader, writer = await asyncio.open_connection(url_host, port)
        try:
            head = f"GET {path} HTTP/1.1\r\nHost: {url_host}:{port}\r\nConnection: close\r\n\r\n"
            writer.write(head.encode())
            raw = await reader.read()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        body = _dechunk(body)
    return status, body


def _dechunk(body: bytes) -> bytes:
    out = bytearray()
    pos = 0
    while True:
        end = body.index(b"\r\n", pos)
        size = int(body[pos:end].split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += body[end + 2 : end + 2 + size]
        pos = end + 2 + size + 2


async def read_announcement(child: Child, prefix: str, timeout_s: float) -> str:
    """Wait for a line starting with *prefix* in the child's log; the rest of that line."""

    found: list[str] = []

    async def announced() -> bool:
        for line in child.log_path.read_text(errors="replace").splitlines():
            if line.startswith(prefix):
                found.append(line[len(prefix) :].strip())
                return True
        return False

    await wait_until(announced, timeout_s=timeout_s, what=f"its {prefix.strip()} line", alive=child)
    return found[0]


def python() -> str:
    """The interpreter running the harness (the project's venv)."""
    return sys.executable
