"""``aiohttp-relay``: a bare aiohttp pass-through relay (the framework's floor; no resumability).

``python -m bench.aiohttp_relay`` (:mod:`bench.aiohttp_relay`): one aiohttp server and one
aiohttp client session, with the gateway's own aiohttp settings, copying each request upstream
and each response's chunks back as they arrive. Nothing is stored, parsed or resumed. Its CPU per
call is what any proxy built on aiohttp pays at least (server request + client request), so the
tables show how much of the gateway's cost is the framework's and how much its own.

Readiness: its ``LISTENING <url>`` line, printed once its socket accepts connections, waited for
with a deadline.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from bench.procs import child_env, child_process, python, read_announcement
from bench.targets.base import Running

NAME = "aiohttp-relay"
RESUMABLE = False
DESCRIPTION = "bare aiohttp pass-through relay, the gateway's aiohttp settings (no resumability)"
START_TIMEOUT_S = 30.0


def available() -> str | None:
    return None


@contextlib.asynccontextmanager
async def start(upstream_url: str, *, workdir: Path) -> AsyncIterator[Running]:
    argv = [python(), "-m", "bench.aiohttp_relay", "--upstream", upstream_url, "--port", "0"]
    async with child_process(NAME, argv, workdir=workdir, env=child_env()) as child:
        url = await read_announcement(child, "LISTENING ", START_TIMEOUT_S)
        yield Running(name=NAME, url=url, pids=[child.pid])
