"""The stream layer of one app, in-process, for unit tests: real registry and metrics."""

from __future__ import annotations

from typing import Any

from mcp_sse_gateway.config import Settings
from mcp_sse_gateway.metrics import Metrics
from mcp_sse_gateway.store.base import EventStore
from mcp_sse_gateway.store.memory import MemoryStore
from mcp_sse_gateway.streams import StreamContext, Streams
from mcp_sse_gateway.streams.registry import Registry


def make_streams(
    settings: Settings,
    upstream: Any,
    store: EventStore | None = None,
    *,
    replica_id: str = "replica-a",
) -> Streams:
    """:class:`Streams` over *upstream* (a scripted one) and *store* (a new memory store)."""
    return Streams(
        StreamContext(
            store=store if store is not None else MemoryStore(),
            upstream=upstream,
            registry=Registry(),
            settings=settings,
            metrics=Metrics(),
            replica_id=replica_id,
        )
    )
