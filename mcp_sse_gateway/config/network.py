"""The HTTP sides of the gateway: the ``[upstream]`` it fronts and its own ``[server]`` listener."""

from __future__ import annotations

import ipaddress

from pydantic import AnyHttpUrl, Field, field_validator

from mcp_sse_gateway.config.defaults import (
    DEFAULT_ALLOWED_HOSTS,
    DEFAULT_ALLOWED_ORIGINS,
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_GC_YOUNG_THRESHOLD,
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_HEADERS_TIMEOUT_S,
    DEFAULT_KEEPALIVE_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_BUFFERED_BODY_BYTES,
    DEFAULT_MAX_CONCURRENT_REQUESTS,
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_HEADERS,
    DEFAULT_MAX_OPENING_STREAMS,
    DEFAULT_MAX_PUMPS,
    DEFAULT_MAX_REQUESTS_PER_TURN,
)
from mcp_sse_gateway.config.fields import PositiveSeconds, Section


class UpstreamSettings(Section):
    """The one MCP server the gateway fronts. Requests never choose another origin."""

    url: AnyHttpUrl | None = Field(
        default=None,
        description="Upstream MCP endpoint, e.g. http://127.0.0.1:3000/mcp. Its path is the "
        "upstream's MCP path; other paths are relayed relative to its origin.",
    )
    connect_timeout_s: PositiveSeconds = Field(
        default=DEFAULT_CONNECT_TIMEOUT_S, description="TCP/TLS connect timeout, seconds."
    )
    headers_timeout_s: PositiveSeconds = Field(
        default=DEFAULT_HEADERS_TIMEOUT_S,
        description="Wait for the upstream's response headers, seconds. Never bounds a quiet "
        "stream once it has started.",
    )
    max_connections: int = Field(
        default=0,
        ge=0,
        description="Cap on pooled upstream connections; 0 = no cap (a cap queues tool calls).",
    )

    @field_validator("url")
    @classmethod
    def _no_credentials_or_fragment(cls, url: AnyHttpUrl | None) -> AnyHttpUrl | None:
        if url is not None and url.fragment:
            raise ValueError("must not have a #fragment")
        if url is not None and (url.username or url.password):
            raise ValueError(
                "must not carry credentials (user:password@): the gateway forwards each "
                "client's own Authorization, and would send these with every request"
            )
        return url


class ServerSettings(Section):
    """The gateway's own listener and request checks."""

    host: str = Field(default="127.0.0.1", description="Listen address; 0.0.0.0 in containers.")
    port: int = Field(default=8080, ge=0, le=65535, description="Listen port; 0 picks a free one.")
    path: str = Field(default="/mcp", description="The MCP endpoint path clients use.")
    allowed_hosts: tuple[str, ...] = Field(
        default=DEFAULT_ALLOWED_HOSTS,
        description="Host header values accepted (port ignored); ['*'] accepts any. "
        "Checked before forwarding: DNS-rebinding protection.",
    )
    allowed_origins: tuple[str, ...] = Field(
        default=DEFAULT_ALLOWED_ORIGINS,
        description="Origin header values accepted (port ignored) when a request carries one; "
        "['*'] accepts any.",
    )
    trusted_proxies: tuple[str, ...] = Field(
        default=(),
        description="CIDRs of proxies whose X-Forwarded-* headers are trusted and extended.",
    )
    max_body_bytes: int = Field(
        default=DEFAULT_MAX_BODY_BYTES, gt=0, description="Largest request body accepted, bytes."
    )
    header_timeout_s: PositiveSeconds = Field(
        default=DEFAULT_HEADER_TIMEOUT_S,
        description="A request's line and headers must arrive within this long of its first "
        "byte (or of a new connection), seconds; then the connection is closed (slowloris).",
    )
    body_timeout_s: PositiveSeconds = Field(
        default=DEFAULT_BODY_TIMEOUT_S,
        description="A request body must arrive whole within this long, seconds; then 408.",
    )
    keepalive_timeout_s: PositiveSeconds = Field(
        default=DEFAULT_KEEPALIVE_TIMEOUT_S,
        description="An idle keep-alive client connection is closed after this long, seconds "
        "(keep it above the idle timeout of the load balancer in front).",
    )
    max_headers: int = Field(
        default=DEFAULT_MAX_HEADERS, gt=0, description="Most header fields in one request."
    )
    max_header_bytes: int = Field(
        default=DEFAULT_MAX_HEADER_BYTES,
        gt=0,
        description="Longest request line, and longest header field, bytes.",
    )
    max_concurrent_requests: int = Field(
        default=DEFAULT_MAX_CONCURRENT_REQUESTS,
        gt=0,
        description="Requests served at once (open streams included); beyond: 503 + "
        "Retry-After. Health, readiness and metrics are not counted.",
    )
    max_buffered_body_bytes: int = Field(
        default=DEFAULT_MAX_BUFFERED_BODY_BYTES,
        gt=0,
        description="Request bodies held in memory at once, all requests together, bytes; "
        "beyond: 503 + Retry-After.",
    )
    max_pumps: int = Field(
        default=DEFAULT_MAX_PUMPS,
        gt=0,
        description="Upstream streams read at once by this replica (request and standalone "
        "pumps); a new stream beyond: 503 + Retry-After, running ones untouched.",
    )
    max_opening_streams: int = Field(
        default=DEFAULT_MAX_OPENING_STREAMS,
        ge=0,
        description="New streams opened at once (created, sent upstream, until its headers or "
        "10 ms); more wait their turn, so running streams keep flowing through a burst of new "
        "calls. 0: no bound.",
    )
    max_requests_per_turn: int = Field(
        default=DEFAULT_MAX_REQUESTS_PER_TURN,
        ge=0,
        description="Request handlers started per event-loop turn; more wait, in order, for the "
        "next turns, so that a burst of thousands of requests does not stop running streams "
        "for one long turn. 0: no bound.",
    )
    gc_young_threshold: int = Field(
        default=DEFAULT_GC_YOUNG_THRESHOLD,
        ge=0,
        description="Python's garbage collector: new objects between two young collections "
        "(Python's default: 700). Higher keeps collections from pausing thousands of streams; "
        "0 leaves Python's settings as they are.",
    )
    drain_timeout_s: PositiveSeconds = Field(
        default=DEFAULT_DRAIN_TIMEOUT_S,
        description="On SIGTERM, how long open streams may run on before they are closed, seconds.",
    )

    @field_validator("path")
    @classmethod
    def _path_absolute(cls, path: str) -> str:
        if not path.startswith("/") or "?" in path or "#" in path:
            raise ValueError("must be an absolute path such as /mcp, without query or fragment")
        return path.rstrip("/") or "/"

    @field_validator("trusted_proxies")
    @classmethod
    def _cidrs(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            try:
                ipaddress.ip_network(value, strict=False)
            except ValueError as exc:
                raise ValueError(f"not an IP network: {value!r}") from exc
        return values
