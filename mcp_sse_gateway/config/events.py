"""Where events are kept and how they go on the wire: the ``[store]`` and ``[sse]`` sections.

The store is DESIGN D7; the wire behaviour follows MCP 2025-11-25 (SEP-1699: priming event,
``retry``, polling).
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from mcp_sse_gateway.config.defaults import (
    DEFAULT_FINISHED_STREAM_TTL_S,
    DEFAULT_HEARTBEAT_EXPIRY_S,
    DEFAULT_HEARTBEAT_S,
    DEFAULT_KEEPALIVE_S,
    DEFAULT_LEASE_TTL_S,
    DEFAULT_MAX_EVENT_BYTES,
    DEFAULT_MAX_EVENTS_PER_STREAM,
    DEFAULT_MAX_QUEUED_CALLS,
    DEFAULT_MAX_STREAMS_PER_SESSION,
    DEFAULT_MEMORY_STORE_MAX_BYTES,
    DEFAULT_REPLAY_BATCH_EVENTS,
    DEFAULT_REPLAY_MAX_PASSES,
    DEFAULT_RETRY_MS,
    DEFAULT_SESSION_IDLE_TTL_S,
    DEFAULT_SLOW_READER_CUT_S,
    DEFAULT_STALL_TIMEOUT_S,
    DEFAULT_UPGRADE_ANSWER_TIMEOUT_S,
    DEFAULT_UPGRADE_WAIT_MS,
    MIN_LEASE_TTL_S,
    MIN_STALL_TIMEOUT_S,
)
from mcp_sse_gateway.config.fields import PositiveSeconds, Section


class StoreSettings(Section):
    """The event store (DESIGN D7). ``memory`` is the embedded, single-process default.

    ``redis`` needs ``redis_url``. With ``redis_cluster = true`` (env
    ``MCP_SSE_GATEWAY_STORE__REDIS_CLUSTER``) that URL is one node of a Redis Cluster
    (``redis://`` or ``rediss://``, database 0): the store discovers the other nodes, keeps each
    session's keys in one hash slot and bounds its connections per node (see
    :mod:`mcp_sse_gateway.store.redis`).
    """

    backend: Literal["memory", "redis"] = Field(
        default="memory", description="'memory' (one process) or 'redis' (replicas)."
    )
    redis_url: SecretStr | None = Field(
        default=None,
        description="redis:// or rediss:// URL (user and password allowed; redacted in logs).",
    )
    redis_cluster: bool = Field(
        default=False,
        description="redis_url names a node of a Redis Cluster (the other nodes are discovered).",
    )
    key_prefix: str = Field(
        default="mcp-sse-gateway", min_length=1, description="Prefix of every Redis key."
    )
    max_events_per_stream: int = Field(
        default=DEFAULT_MAX_EVENTS_PER_STREAM,
        gt=0,
        description="Events kept per stream; older ones are trimmed (a cursor before them "
        "gets 400).",
    )
    finished_stream_ttl_s: PositiveSeconds = Field(
        default=DEFAULT_FINISHED_STREAM_TTL_S,
        description="How long a finished stream stays replayable, seconds.",
    )
    session_idle_ttl_s: PositiveSeconds = Field(
        default=DEFAULT_SESSION_IDLE_TTL_S,
        description="A session's records expire after this long without traffic, seconds.",
    )
    max_streams_per_session: int = Field(
        default=DEFAULT_MAX_STREAMS_PER_SESSION,
        gt=0,
        description="Streams kept per session (finished ones of the same creator are evicted "
        "first; beyond: 503).",
    )
    max_event_bytes: int = Field(
        default=DEFAULT_MAX_EVENT_BYTES, gt=0, description="Largest single SSE event, bytes."
    )
    memory_max_bytes: int = Field(
        default=DEFAULT_MEMORY_STORE_MAX_BYTES,
        gt=0,
        description="Memory store: cap on stored event bytes across all streams.",
    )
    heartbeat_s: PositiveSeconds = Field(
        default=DEFAULT_HEARTBEAT_S, description="Replica heartbeat period, seconds."
    )
    heartbeat_expiry_s: PositiveSeconds = Field(
        default=DEFAULT_HEARTBEAT_EXPIRY_S,
        description="A replica whose heartbeat is older than this is dead, seconds.",
    )
    lease_ttl_s: PositiveSeconds = Field(
        default=DEFAULT_LEASE_TTL_S,
        ge=MIN_LEASE_TTL_S,
        description="A session's standalone lease (which replica holds its one upstream GET) "
        "expires this long after its holder's last renewal (every third of it), seconds; "
        "another replica with a client attached then takes it over (DESIGN D5).",
    )
    replay_batch_events: int = Field(
        default=DEFAULT_REPLAY_BATCH_EVENTS,
        gt=0,
        description="A replay reads the store in batches of this many events.",
    )
    replay_max_passes: int = Field(
        default=DEFAULT_REPLAY_MAX_PASSES,
        gt=0,
        description="Batches one connection replays before it is closed with retry (the "
        "client resumes from there).",
    )
    stall_timeout_s: PositiveSeconds = Field(
        default=DEFAULT_STALL_TIMEOUT_S,
        ge=MIN_STALL_TIMEOUT_S,
        description="Redis store: how long Redis may leave a command unanswered before it "
        "counts as down, seconds (waiting in the replica's call queue does not count).",
    )
    max_queued_calls: int = Field(
        default=DEFAULT_MAX_QUEUED_CALLS,
        gt=0,
        description="Redis store: calls waiting (for a connection, or in a batch for their "
        "pipeline), per replica, beyond which new requests get 503 + Retry-After (running "
        "streams always wait their turn).",
    )

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, url: SecretStr | None) -> SecretStr | None:
        if url is not None:
            scheme = urlsplit(url.get_secret_value()).scheme
            if scheme not in {"redis", "rediss", "unix"}:
                raise ValueError("must start with redis://, rediss:// or unix://")
        return url

    @model_validator(mode="after")
    def _consistent(self) -> StoreSettings:
        if self.backend == "redis" and self.redis_url is None:
            raise ValueError("backend 'redis' needs store.redis_url")
        if (
            self.redis_cluster
            and self.redis_url is not None
            and urlsplit(self.redis_url.get_secret_value()).scheme == "unix"
        ):
            raise ValueError("redis_cluster needs a redis:// or rediss:// URL, not unix://")
        if self.heartbeat_expiry_s <= self.heartbeat_s:
            raise ValueError("heartbeat_expiry_s must be greater than heartbeat_s")
        return self


class SSESettings(Section):
    """Wire behaviour of managed streams (MCP 2025-11-25, SEP-1699)."""

    retry_ms: int = Field(
        default=DEFAULT_RETRY_MS,
        ge=0,
        description="The SSE retry field sent before every close, milliseconds (on the wire).",
    )
    poll_after_ms: int | None = Field(
        default=None,
        ge=0,
        description="Close 2025-11-25 streams on purpose after this long, milliseconds; "
        "absent = never, 0 = right after the priming event.",
    )
    keepalive_s: PositiveSeconds = Field(
        default=DEFAULT_KEEPALIVE_S, description="Comment sent on an idle stream, seconds."
    )
    slow_reader_cut_s: PositiveSeconds = Field(
        default=DEFAULT_SLOW_READER_CUT_S,
        description="A client this far behind the live end is cut (it resumes), seconds.",
    )
    upgrade_json: bool = Field(
        default=False,
        description="Answer a call (a POST of one JSON-RPC request, not a batch, on a "
        "resumable session, from a client that accepts SSE) with a resumable SSE stream even "
        "when the upstream answers JSON: keepalives cross idle timeouts and a dropped "
        "connection resumes. Off by default: it changes the response type clients see.",
    )
    upgrade_wait_ms: int = Field(
        default=DEFAULT_UPGRADE_WAIT_MS,
        ge=0,
        description="With upgrade_json: how long the gateway waits for the upstream's status "
        "before it commits to the 200 SSE answer, milliseconds. A non-2xx within it is relayed "
        "as it is; after it, each pending request gets a JSON-RPC error event instead (a 401 "
        "that late cannot start the client's OAuth flow).",
    )
    upgrade_answer_timeout_s: PositiveSeconds = Field(
        default=DEFAULT_UPGRADE_ANSWER_TIMEOUT_S,
        description="With upgrade_json: how long an upgraded call may run upstream before its "
        "JSON answer, seconds (in place of upstream.headers_timeout_s: a JSON-only upstream "
        "sends its headers with the answer). Past it, the call gets a JSON-RPC error event.",
    )
