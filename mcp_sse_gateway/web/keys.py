"""Typed keys of the objects the app shares between handlers."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from mcp_sse_gateway.config import Settings
from mcp_sse_gateway.metrics import Metrics
from mcp_sse_gateway.registry import Registry
from mcp_sse_gateway.store.base import EventStore
from mcp_sse_gateway.web.authz import Authorizer

SETTINGS = web.AppKey("settings", Settings)
STORE = web.AppKey("store", EventStore)
METRICS = web.AppKey("metrics", Metrics)
UPSTREAM_CLIENT = web.AppKey("upstream_client", aiohttp.ClientSession)


class GatewayState:
    """Mutable, process-wide state of one gateway app.

    Attributes:
        draining: set on shutdown; ``/readyz`` answers 503 from then on.
        streams: the client responses currently relaying a stream, closed on shutdown.
        in_flight: requests being served now (``server.max_concurrent_requests``).
        buffered_bytes: request body bytes held now (``server.max_buffered_body_bytes``).
        busy_logged_at: when a refusal for capacity was last logged (monotonic seconds).
    """

    def __init__(self) -> None:
        self.draining = False
        self.streams: set[web.StreamResponse] = set()
        self.in_flight = 0
        self.buffered_bytes = 0
        self.busy_logged_at = float("-inf")


STATE = web.AppKey("state", GatewayState)
REGISTRY = web.AppKey("registry", Registry)
#: Resume authorization (DESIGN D8): credential digests, upstream probes.
AUTHORIZER = web.AppKey("authorizer", Authorizer)
#: Per request: the body bytes it holds, counted in ``GatewayState.buffered_bytes``.
BUFFERED_BYTES = web.RequestKey("buffered_bytes", int)
#: This replica's id (random per process): the owner recorded on the streams it pumps.
REPLICA_ID = web.AppKey("replica_id", str)
