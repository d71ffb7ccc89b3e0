"""Prometheus metrics, named ``mcp_sse_gateway_*`` and kept in a registry of their own.

Each app gets its own :class:`Metrics` (tests build several apps in one process).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from mcp_sse_gateway.store.base import StoreObserver

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

#: Buckets of the store timings, seconds: from a loopback round trip to a stall.
STORE_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Metrics:
    """The gateway's counters, gauges and histograms."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "mcp_sse_gateway_requests_total",
            "Client requests answered, by method and status class.",
            ["method", "status"],
            registry=self.registry,
        )
        self.upstream_errors = Counter(
            "mcp_sse_gateway_upstream_errors_total",
            "Upstream failures before response headers, by kind.",
            ["kind"],
            registry=self.registry,
        )
        self.rejected = Counter(
            "mcp_sse_gateway_requests_rejected_total",
            "Requests refused before forwarding, by reason (host, origin, path, body_timeout, "
            "capacity, buffered_bodies, pumps, store_busy, stream_limit, store_unavailable).",
            ["reason"],
            registry=self.registry,
        )
        self.streams_active = Gauge(
            "mcp_sse_gateway_streams_active",
            "Client connections receiving an event stream now (managed or passed through).",
            registry=self.registry,
        )
        self.events_stored = Counter(
            "mcp_sse_gateway_events_stored_total",
            "Events appended to the event store by pumps (upstream messages and gateway errors).",
            registry=self.registry,
        )
        self.pumps_active = Gauge(
            "mcp_sse_gateway_pumps_active",
            "Upstream streams this replica reads now, by kind (request: a POST's answer; "
            "standalone: a session's GET).",
            ["kind"],
            registry=self.registry,
        )
        self.events_replayed = Counter(
            "mcp_sse_gateway_events_replayed_total",
            "Events written to resumed connections (GET + Last-Event-ID) that were stored before "
            "the resume arrived: what clients missed; a subset of events delivered.",
            registry=self.registry,
        )
        self.resumes = Counter(
            "mcp_sse_gateway_resumes_total",
            "GETs with Last-Event-ID, by outcome (served, done: nothing left, refused: not "
            "authorized, invalid, unknown_stream, cursor_gone: 400).",
            ["outcome"],
            registry=self.registry,
        )
        self.json_upgrades = Counter(
            "mcp_sse_gateway_json_upgrades_total",
            "Tool calls whose JSON answer became a resumable SSE stream (sse.upgrade_json), by "
            "when the client got its stream: in_time (the upstream answered 2xx JSON within "
            "sse.upgrade_wait_ms) or late (before the upstream answered).",
            ["when"],
            registry=self.registry,
        )
        self.json_upgrade_late_answers = Counter(
            "mcp_sse_gateway_json_upgrade_late_answers_total",
            "What the upstream answered an upgraded call whose client already had its stream, "
            "by answer: json (2xx JSON, relayed as the stream's event), event_stream, status (a "
            "non-2xx or unreadable answer: a JSON-RPC error event), failed (no answer: connect "
            "error, reset or upstream timeout) or cancelled (the gateway shut down first).",
            ["answer"],
            registry=self.registry,
        )
        self.tasks_created = Counter(
            "mcp_sse_gateway_tasks_created_total",
            "Tasks the gateway created for task-supporting tool calls ([tasks], DESIGN D11).",
            registry=self.registry,
        )
        self.tasks_settled = Counter(
            "mcp_sse_gateway_tasks_settled_total",
            "Tasks that ended, by status: completed (a tool result, an error result included), "
            "failed (a JSON-RPC error: the upstream's, or the gateway's when the upstream failed, "
            "the replica died or shut down first) or cancelled.",
            ["status"],
            registry=self.registry,
        )
        self.store_up = Gauge(
            "mcp_sse_gateway_store_up",
            "1 when this replica's last heartbeat write to the event store succeeded, else 0.",
            registry=self.registry,
        )
        self.heartbeat_age_seconds = Gauge(
            "mcp_sse_gateway_heartbeat_age_seconds",
            "Seconds since this replica's heartbeat was last written to the event store (other "
            "replicas take it for dead past store.heartbeat_expiry_s).",
            registry=self.registry,
        )
        self.events_delivered = Counter(
            "mcp_sse_gateway_events_delivered_total",
            "Events written to clients on managed streams (replay and live tail).",
            registry=self.registry,
        )
        self.connections_ended = Counter(
            "mcp_sse_gateway_stream_connections_ended_total",
            "Client connections to managed streams that ended, by reason (finished, poll, "
            "superseded, draining, slow_reader, client_gone, replay_bound, stream_dropped).",
            ["reason"],
            registry=self.registry,
        )
        self.standalone_takeovers = Counter(
            "mcp_sse_gateway_standalone_takeovers_total",
            "Standalone leases taken over by this replica (the holder died, drained or was "
            "refused by the upstream; DESIGN D5).",
            registry=self.registry,
        )
        self.streams_store_lost = Counter(
            "mcp_sse_gateway_streams_store_lost_total",
            "Streams whose events could no longer be stored (store outage): request streams go on "
            "without ids to the connected client then are dropped; standalone ones start again.",
            registry=self.registry,
        )
        self.streams_orphaned = Counter(
            "mcp_sse_gateway_streams_orphaned_total",
            "Streams of a dead replica this replica ended with their pending JSON-RPC errors.",
            registry=self.registry,
        )
        self.pumps_broken = Counter(
            "mcp_sse_gateway_pumps_broken_total",
            "Upstream streams that ended before every response arrived (clients got an error).",
            registry=self.registry,
        )
        self.sessions_recorded = Counter(
            "mcp_sse_gateway_sessions_recorded_total",
            "Sessions whose protocol version was recorded, by version.",
            ["protocol_version"],
            registry=self.registry,
        )
        self.upstream_headers_seconds = Histogram(
            "mcp_sse_gateway_upstream_headers_seconds",
            "Time from forwarding a request to the upstream's response headers, seconds.",
            registry=self.registry,
        )

        self.store_queue_depth = Gauge(
            "mcp_sse_gateway_store_queue_depth",
            "Redis store calls waiting now, for a connection or in a batch for their pipeline "
            "(this replica).",
            registry=self.registry,
        )
        self.store_queue_wait_seconds = Histogram(
            "mcp_sse_gateway_store_queue_wait_seconds",
            "Time a Redis store call waited before its command left (in its batch, then for a "
            "connection), seconds, by store operation.",
            ["operation"],
            buckets=STORE_BUCKETS_S,
            registry=self.registry,
        )
        self.store_round_trip_seconds = Histogram(
            "mcp_sse_gateway_store_round_trip_seconds",
            "Time a connection was held for one pipeline or call (commands and replies), "
            "seconds, by store operation.",
            ["operation"],
            buckets=STORE_BUCKETS_S,
            registry=self.registry,
        )

        self.auth_probes = Counter(
            "mcp_sse_gateway_auth_probes_total",
            "Upstream authorization probes of resumes, by outcome (ok, 401, 403, 404, 429, "
            "unavailable, other).",
            ["outcome"],
            registry=self.registry,
        )
        self.auth_refusals = Counter(
            "mcp_sse_gateway_auth_refusals_total",
            "Resumes and stream joins refused, by reason (upstream_<status>, "
            "upstream_unavailable, upstream_other, principal_mismatch, creator_only).",
            ["reason"],
            registry=self.registry,
        )
        self.auth_served = Counter(
            "mcp_sse_gateway_auth_served_total",
            "Resumes and stream joins authorized, by how (creator, cached, probed, principal, "
            "disabled).",
            ["by"],
            registry=self.registry,
        )
        self.auth_probe_seconds = Histogram(
            "mcp_sse_gateway_auth_probe_seconds",
            "Duration of one upstream authorization probe, seconds.",
            registry=self.registry,
        )

        #: ``count_request(method, status_class)``: :attr:`requests` + 1, children cached.
        self.count_request = _inc_by_labels(self.requests)
        #: ``count_connection_ended(reason)``: :attr:`connections_ended` + 1, children cached.
        self.count_connection_ended = _inc_by_labels(self.connections_ended)

    def store_observer(self) -> StoreObserver:
        """The store's call timings, as the two store histograms."""
        return StoreObserver(
            queue_wait=_observe_by_label(self.store_queue_wait_seconds),
            round_trip=_observe_by_label(self.store_round_trip_seconds),
        )

    def render(self) -> bytes:
        """The exposition text of every metric (Prometheus text format 0.0.4)."""
        return generate_latest(self.registry)


def _observe_by_label(histogram: Histogram) -> Callable[[str, float], None]:
    """``observe(label, value)`` of a one-label *histogram*, each label's child looked up once.

    The store observes every call: ``labels()`` (a lock and a dict lookup of a tuple) per call
    was a measurable part of a lone call's cost. Labels are the store's operation names, a
    fixed set.
    """
    children: dict[str, Any] = {}

    def observe(label: str, value: float) -> None:
        child = children.get(label)
        if child is None:
            child = children[label] = histogram.labels(label)
        child.observe(value)

    return observe


def _inc_by_labels(counter: Counter) -> Callable[..., None]:
    """``inc(*labels)`` of *counter*, each label set's child looked up once.

    For counters bumped on every request or stream; their label sets are bounded (methods by
    name or ``OTHER``, status classes, end reasons), so the cache is too.
    """
    children: dict[tuple[str, ...], Any] = {}

    def inc(*labels: str) -> None:
        child = children.get(labels)
        if child is None:
            child = children[labels] = counter.labels(*labels)
        child.inc()

    return inc
