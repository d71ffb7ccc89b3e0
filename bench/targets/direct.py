"""``direct``: clients talk to the upstream itself. The reference: no proxy, CPU cost 0."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from bench.targets.base import Running

NAME = "direct"
RESUMABLE = False
DESCRIPTION = "no proxy: clients talk to the upstream itself (the reference)"


def available() -> str | None:
    return None


@contextlib.asynccontextmanager
async def start(upstream_url: str, *, workdir: Path) -> AsyncIterator[Running]:  # noqa: ARG001
    yield Running(name=NAME, url=upstream_url, pids=[])
