"""Settings: one frozen tree, loaded from TOML, environment and command-line flags.

Precedence, highest first: command-line flags (passed as init arguments), environment variables
(prefix ``MCP_SSE_GATEWAY_``, sections nested with ``__``, e.g.
``MCP_SSE_GATEWAY_UPSTREAM__URL``), the TOML file (``--config PATH`` or
``MCP_SSE_GATEWAY_CONFIG``), then the defaults. ``config.example.toml`` documents every key.

Units are in the names: ``*_s`` seconds, ``*_ms`` milliseconds, ``*_bytes`` bytes. Every default is
a named constant with the reason it was chosen (see DESIGN D7).

This package is sans-IO apart from reading the TOML file; it imports neither aiohttp nor redis.
Every name is re-exported here; one job per module:

* :mod:`.settings`: :class:`Settings`, the root, its sources, :func:`load_settings` and
  :func:`unknown_variables`.
* :mod:`.network`: the ``[upstream]`` and ``[server]`` sections.
* :mod:`.events`: the ``[store]`` and ``[sse]`` sections.
* :mod:`.access`: the ``[auth]`` section.
* :mod:`.telemetry`: the ``[logging]`` and ``[metrics]`` sections.
* :mod:`.tasks`: the ``[tasks]`` section (the Tasks extension, DESIGN D11).
* :mod:`.defaults`: every default, as a named constant.
* :mod:`.fields`: the sections' base model and constrained field types.
* :mod:`.redaction`: :func:`redact_url`, secrets taken out of URLs.
"""

from mcp_sse_gateway.config.access import AuthSettings
from mcp_sse_gateway.config.defaults import (
    DEFAULT_ALLOWED_HOSTS,
    DEFAULT_ALLOWED_ORIGINS,
    DEFAULT_AUTH_PROBE_TIMEOUT_S,
    DEFAULT_AUTH_RECHECK_S,
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_FINISHED_STREAM_TTL_S,
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_HEADERS_TIMEOUT_S,
    DEFAULT_HEARTBEAT_EXPIRY_S,
    DEFAULT_HEARTBEAT_S,
    DEFAULT_KEEPALIVE_S,
    DEFAULT_KEEPALIVE_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_BUFFERED_BODY_BYTES,
    DEFAULT_MAX_CONCURRENT_REQUESTS,
    DEFAULT_MAX_EVENT_BYTES,
    DEFAULT_MAX_EVENTS_PER_STREAM,
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_HEADERS,
    DEFAULT_MAX_PUMPS,
    DEFAULT_MAX_QUEUED_CALLS,
    DEFAULT_MAX_STREAMS_PER_SESSION,
    DEFAULT_MEMORY_STORE_MAX_BYTES,
    DEFAULT_REPLAY_BATCH_EVENTS,
    DEFAULT_REPLAY_MAX_PASSES,
    DEFAULT_RETRY_MS,
    DEFAULT_SESSION_IDLE_TTL_S,
    DEFAULT_SLOW_READER_CUT_S,
    DEFAULT_STALL_TIMEOUT_S,
    DEFAULT_UPGRADE_WAIT_MS,
    MIB,
    MIN_DIGEST_KEY_CHARS,
    MIN_STALL_TIMEOUT_S,
)
from mcp_sse_gateway.config.events import SSESettings, StoreSettings
from mcp_sse_gateway.config.fields import PositiveSeconds
from mcp_sse_gateway.config.network import ServerSettings, UpstreamSettings
from mcp_sse_gateway.config.redaction import redact_url
from mcp_sse_gateway.config.settings import (
    CONFIG_PATH_ENV,
    ENV_PREFIX,
    Settings,
    load_settings,
    unknown_variables,
)
from mcp_sse_gateway.config.tasks import TasksSettings, TaskSupport
from mcp_sse_gateway.config.telemetry import LoggingSettings, MetricsSettings

__all__ = [
    "CONFIG_PATH_ENV",
    "DEFAULT_ALLOWED_HOSTS",
    "DEFAULT_ALLOWED_ORIGINS",
    "DEFAULT_AUTH_PROBE_TIMEOUT_S",
    "DEFAULT_AUTH_RECHECK_S",
    "DEFAULT_BODY_TIMEOUT_S",
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_DRAIN_TIMEOUT_S",
    "DEFAULT_FINISHED_STREAM_TTL_S",
    "DEFAULT_HEADERS_TIMEOUT_S",
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_HEARTBEAT_EXPIRY_S",
    "DEFAULT_HEARTBEAT_S",
    "DEFAULT_KEEPALIVE_S",
    "DEFAULT_KEEPALIVE_TIMEOUT_S",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_BUFFERED_BODY_BYTES",
    "DEFAULT_MAX_CONCURRENT_REQUESTS",
    "DEFAULT_MAX_EVENTS_PER_STREAM",
    "DEFAULT_MAX_EVENT_BYTES",
    "DEFAULT_MAX_HEADERS",
    "DEFAULT_MAX_HEADER_BYTES",
    "DEFAULT_MAX_PUMPS",
    "DEFAULT_MAX_QUEUED_CALLS",
    "DEFAULT_MAX_STREAMS_PER_SESSION",
    "DEFAULT_MEMORY_STORE_MAX_BYTES",
    "DEFAULT_REPLAY_BATCH_EVENTS",
    "DEFAULT_REPLAY_MAX_PASSES",
    "DEFAULT_RETRY_MS",
    "DEFAULT_SESSION_IDLE_TTL_S",
    "DEFAULT_SLOW_READER_CUT_S",
    "DEFAULT_STALL_TIMEOUT_S",
    "DEFAULT_UPGRADE_WAIT_MS",
    "ENV_PREFIX",
    "MIB",
    "MIN_DIGEST_KEY_CHARS",
    "MIN_STALL_TIMEOUT_S",
    "AuthSettings",
    "LoggingSettings",
    "MetricsSettings",
    "PositiveSeconds",
    "SSESettings",
    "ServerSettings",
    "Settings",
    "StoreSettings",
    "TaskSupport",
    "TasksSettings",
    "UpstreamSettings",
    "load_settings",
    "redact_url",
    "unknown_variables",
]
