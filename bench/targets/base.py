"""The target interface: something MCP clients talk to, in front of (or instead of) an upstream.

Each target module exposes::

    NAME = "my-target"                      # optional; default: the module name, "_" -> "-"
    RESUMABLE = True                        # optional: answers GET + Last-Event-ID itself

    def available() -> str | None:          # None if usable, else why not (shown in tables)
        ...

    @contextlib.asynccontextmanager
    async def start(upstream_url: str, *, workdir: pathlib.Path) -> AsyncIterator[Running]:
        ...                                 # ready when it yields; stopped when the block ends

A module may instead expose ``TARGETS = {name: (available, start)}`` for several variants
(``gateway.py``: memory and Redis stores).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass
class Running:
    """A started target.

    Attributes:
        name: the target's name (as in the tables).
        url: the MCP endpoint clients use.
        pids: processes whose CPU time (each one's CPU clock: ``bench.procs.cpu_seconds``) is
            the target's cost: the proxy, plus its redis-server. The first one is the proxy
            itself (its RSS is reported on its own).
        redis_url: the Redis the target uses, if any (the scale scenario counts its clients).
        metrics_url: Prometheus ``/metrics`` of the target, if any: the replay scenario waits
            for ``mcp_sse_gateway_events_stored_total`` to know a stream is complete.
    """

    name: str
    url: str
    pids: list[int]
    redis_url: str | None = None
    metrics_url: str | None = None
    notes: list[str] = field(default_factory=list)
    #: Set by the harness from the module's ``events_stored(redis_url)``, if it has one: how
    #: many events the target has stored so far (to know a stream is complete in its store).
    stored_probe: Callable[[], Awaitable[float]] | None = None


class StartTarget(Protocol):
    def __call__(
        self, upstream_url: str, *, workdir: Path
    ) -> AbstractAsyncContextManager[Running]: ...


@dataclass(frozen=True)
class Target:
    """A target of the registry (see :mod:`bench.targets`)."""

    name: str
    available: Callable[[], str | None]
    start: StartTarget
    resumable: bool
    description: str = ""
    #: ``events_stored(redis_url)`` of the module, if any.
    events_stored: Callable[[str], Awaitable[float]] | None = None


AsyncRunning = AsyncIterator[Running]
