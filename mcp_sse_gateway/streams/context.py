"""What every part of the stream layer shares within one app: store, upstream, registry, bounds."""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from mcp_sse_gateway.config import Settings
from mcp_sse_gateway.errors import GatewayBusy
from mcp_sse_gateway.metrics import Metrics
from mcp_sse_gateway.store.base import EventStore
from mcp_sse_gateway.streams.registry import Registry
from mcp_sse_gateway.streams.upstream import Upstream
from mcp_sse_gateway.tracing import NO_TRACING, Tracing

log = structlog.get_logger("mcp_sse_gateway.managed")


@dataclass(frozen=True, slots=True)
class StreamContext:
    """The shared objects of one app's stream layer.

    Attributes:
        store: the event store.
        upstream: the upstream seam.
        registry: background tasks and stream lives.
        settings: the gateway's settings.
        metrics: the gateway's metrics.
        replica_id: this replica's id: the owner recorded on the streams it pumps.
        tracing: spans of stream lives and resumes (a no-op unless tracing is on).
    """

    store: EventStore
    upstream: Upstream
    registry: Registry
    settings: Settings
    metrics: Metrics
    replica_id: str
    tracing: Tracing = NO_TRACING

    def check_pump_capacity(self, *, standalone: bool, reserved: int = 0) -> None:
        """Refuse a new upstream stream beyond ``server.max_pumps`` (running ones go on).

        Request pumps and standalone pumps are bounded separately, so standalone GETs (which
        run on while the session lives) can never use up what tool calls need.

        *reserved*: pumps about to start (let in, not yet spawned), counted as running.

        Raises:
            GatewayBusy: the bound is reached.
        """
        limit = self.settings.server.max_pumps
        registry = self.registry
        running = (registry.endless if standalone else registry.request_pumps) + reserved
        if running >= limit:
            kind = "standalone" if standalone else "request"
            self.metrics.rejected.labels("pumps").inc()
            log.warning("stream.refused_capacity", kind=kind, pumps=running, limit=limit)
            raise GatewayBusy
