"""Typed keys of the objects the app shares between handlers."""

from __future__ import annotations

from aiohttp import web

from mcp_sse_gateway.config import Settings
from mcp_sse_gateway.metrics import Metrics
from mcp_sse_gateway.store.base import EventStore
from mcp_sse_gateway.streams import Streams
from mcp_sse_gateway.streams.registry import Registry
from mcp_sse_gateway.tracing import Tracing
from mcp_sse_gateway.web.admission import Admission
from mcp_sse_gateway.web.authz import Authorizer
from mcp_sse_gateway.web.upstream import HttpUpstream

SETTINGS = web.AppKey("settings", Settings)
#: Spans (a no-op unless the OTEL_* variables configure tracing).
TRACING = web.AppKey("tracing", Tracing)
STORE = web.AppKey("store", EventStore)
METRICS = web.AppKey("metrics", Metrics)
#: The upstream seam (aiohttp's pooled client inside, started with the app).
UPSTREAM = web.AppKey("upstream", HttpUpstream)


class GatewayState:
    """Mutable, process-wide state of one gateway app.

    Args:
        registry: the app's registry, whose ``closing`` flag is the draining state.

    Attributes:
        in_flight: requests being served now (``server.max_concurrent_requests``).
        buffered_bytes: request body bytes held now (``server.max_buffered_body_bytes``).
        busy_logged_at: when a refusal for capacity was last logged (monotonic seconds).
        admission: request handlers started per loop turn (``server.max_requests_per_turn``).
    """

    def __init__(self, registry: Registry, *, requests_per_turn: int = 0) -> None:
        self._registry = registry
        self.admission = Admission(requests_per_turn)
        self.in_flight = 0
        self.buffered_bytes = 0
        self.busy_logged_at = float("-inf")

    @property
    def draining(self) -> bool:
        """Set on shutdown: ``/readyz`` answers 503, and nothing new is started or re-opened."""
        return self._registry.closing

    @draining.setter
    def draining(self, value: bool) -> None:
        self._registry.closing = value


STATE = web.AppKey("state", GatewayState)
REGISTRY = web.AppKey("registry", Registry)
#: The stream layer: request streams, standalone streams (on the registry, store, upstream).
STREAMS = web.AppKey("streams", Streams)
#: Resume authorization (DESIGN D8): credential digests, upstream probes.
AUTHORIZER = web.AppKey("authorizer", Authorizer)
#: Per request: the body bytes it holds, counted in ``GatewayState.buffered_bytes``.
BUFFERED_BYTES = web.RequestKey("buffered_bytes", int)
#: Per request: the id of the lone JSON-RPC request its body holds (not a batch), which the
#: gateway's own error response for it then carries (JSON-RPC 2.0 §5: null only when the id
#: cannot be determined).
JSONRPC_REQUEST_ID: web.RequestKey[str | int] = web.RequestKey("jsonrpc_request_id")
#: This replica's id (random per process): the owner recorded on the streams it pumps.
REPLICA_ID = web.AppKey("replica_id", str)
