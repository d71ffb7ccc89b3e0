"""Settings: one frozen tree, loaded from TOML, environment and command-line flags.

Precedence, highest first: command-line flags (passed as init arguments), environment variables
(prefix ``MCP_SSE_GATEWAY_``, sections nested with ``__``, e.g.
``MCP_SSE_GATEWAY_UPSTREAM__URL``), the TOML file (``--config PATH`` or
``MCP_SSE_GATEWAY_CONFIG``), then the defaults below. ``config.example.toml`` documents every key.

Units are in the names: ``*_s`` seconds, ``*_ms`` milliseconds, ``*_bytes`` bytes. Every default is
a named constant with the reason it was chosen (see DESIGN D7).

This module is sans-IO apart from reading the TOML file; it imports neither aiohttp nor redis.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from mcp_sse_gateway.errors import ConfigError

ENV_PREFIX = "MCP_SSE_GATEWAY_"
CONFIG_PATH_ENV = f"{ENV_PREFIX}CONFIG"

MIB = 1024 * 1024

#: SEP-1699 suggests a short reconnection delay; 1 s keeps polling cheap without hammering.
DEFAULT_RETRY_MS = 1000
#: Below the 30-60 s idle timeouts of common load balancers (AWS ALB 60 s, nginx 60 s).
DEFAULT_KEEPALIVE_S = 15.0
#: Bounds one stream's history; a tool call rarely emits more notifications than this.
DEFAULT_MAX_EVENTS_PER_STREAM = 10_000
#: Long enough for a client to come back after a deploy or a network blip.
DEFAULT_FINISHED_STREAM_TTL_S = 300.0
#: Matches the idle session lifetime of the official SDKs' session managers.
DEFAULT_SESSION_IDLE_TTL_S = 3600.0
DEFAULT_MAX_STREAMS_PER_SESSION = 100
#: Tool results carrying files or images reach several MB; 16 MiB leaves headroom.
DEFAULT_MAX_EVENT_BYTES = 16 * MIB
DEFAULT_MAX_BODY_BYTES = 16 * MIB
DEFAULT_MEMORY_STORE_MAX_BYTES = 256 * MIB
DEFAULT_HEARTBEAT_S = 5.0
DEFAULT_HEARTBEAT_EXPIRY_S = 15.0
#: Kubernetes' default terminationGracePeriodSeconds is 30 s; operators raise both together.
DEFAULT_DRAIN_TIMEOUT_S = 60.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
#: Bounds only the wait for response headers: a tool call that answers as JSON may run long.
DEFAULT_HEADERS_TIMEOUT_S = 300.0
DEFAULT_REPLAY_BATCH_EVENTS = 1000
DEFAULT_REPLAY_MAX_PASSES = 16
#: Redis store: see ``StoreSettings.stall_timeout_s`` (DESIGN D7, slow is not down).
DEFAULT_STALL_TIMEOUT_S = 5.0
#: Below this, a loaded but healthy Redis would pass for a stalled one, seconds.
MIN_STALL_TIMEOUT_S = 0.1
#: Redis store: see ``StoreSettings.max_queued_calls``.
DEFAULT_MAX_QUEUED_CALLS = 10_000
DEFAULT_SLOW_READER_CUT_S = 10.0
#: Names a browser on this machine can reach the gateway by; anything else is DNS rebinding.
DEFAULT_ALLOWED_HOSTS = ("localhost", "127.0.0.1", "[::1]")
DEFAULT_ALLOWED_ORIGINS = (
    "http://localhost",
    "http://127.0.0.1",
    "http://[::1]",
    "https://localhost",
    "https://127.0.0.1",
    "https://[::1]",
)

#: How long credentials the upstream accepted are taken as still accepted without asking it
#: again: a revoked token keeps reading its own session's stored events at most this long.
DEFAULT_AUTH_RECHECK_S = 60.0
#: An authorization probe is one JSON-RPC ping; a healthy upstream answers in milliseconds.
DEFAULT_AUTH_PROBE_TIMEOUT_S = 5.0
#: Shortest ``auth.digest_key`` accepted, characters (HMAC-SHA256 keys below 128 bits are weak).
MIN_DIGEST_KEY_CHARS = 16

#: Generous for any real client (a request's headers arrive in one packet), short enough that
#: connections trickling headers (slowloris) do not pile up.
DEFAULT_HEADER_TIMEOUT_S = 10.0
#: Bodies are at most 16 MiB; 30 s covers them at about 4 Mbit/s.
DEFAULT_BODY_TIMEOUT_S = 30.0
#: Above the common load balancers' idle timeouts (AWS ALB 60 s): the balancer, not the
#: gateway, closes an idle pooled connection, so it never sends on one the gateway just closed.
DEFAULT_KEEPALIVE_TIMEOUT_S = 75.0
#: aiohttp's own limits, made configurable.
DEFAULT_MAX_HEADERS = 128
DEFAULT_MAX_HEADER_BYTES = 8190
#: Each open stream costs a few tens of KiB; 10,000 stays within a container's memory.
DEFAULT_MAX_CONCURRENT_REQUESTS = 10_000
DEFAULT_MAX_PUMPS = 10_000
#: Sixteen bodies of the largest size at once; tool calls' bodies are small.
DEFAULT_MAX_BUFFERED_BODY_BYTES = 256 * MIB

#: A duration in seconds: positive and finite (``inf`` and ``nan`` are refused).
PositiveSeconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class UpstreamSettings(_Section):
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


class ServerSettings(_Section):
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


class StoreSettings(_Section):
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
    max_events_per_stream: int = Field(default=DEFAULT_MAX_EVENTS_PER_STREAM, gt=0)
    finished_stream_ttl_s: PositiveSeconds = Field(
        default=DEFAULT_FINISHED_STREAM_TTL_S,
        description="How long a finished stream stays replayable, seconds.",
    )
    session_idle_ttl_s: PositiveSeconds = Field(
        default=DEFAULT_SESSION_IDLE_TTL_S,
        description="A session's records expire after this long without traffic, seconds.",
    )
    max_streams_per_session: int = Field(default=DEFAULT_MAX_STREAMS_PER_SESSION, gt=0)
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
    replay_batch_events: int = Field(default=DEFAULT_REPLAY_BATCH_EVENTS, gt=0)
    replay_max_passes: int = Field(default=DEFAULT_REPLAY_MAX_PASSES, gt=0)
    stall_timeout_s: PositiveSeconds = Field(
        default=DEFAULT_STALL_TIMEOUT_S,
        ge=MIN_STALL_TIMEOUT_S,
        description="Redis store: how long Redis may leave a command unanswered before it "
        "counts as down, seconds (waiting in the replica's call queue does not count).",
    )
    max_queued_calls: int = Field(
        default=DEFAULT_MAX_QUEUED_CALLS,
        gt=0,
        description="Redis store: calls waiting for a connection, per replica, beyond which new "
        "requests get 503 + Retry-After (running streams always wait their turn).",
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


class SSESettings(_Section):
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


class AuthSettings(_Section):
    """Who may read what the gateway answers from its store (DESIGN D8; see SECURITY.md).

    The gateway answers resumes (``GET`` + ``Last-Event-ID``) and joins of an open standalone
    stream itself, so it checks their credentials as strictly as the upstream would:

    * ``upstream`` (default): the creator's exact credentials (kept as a keyed digest) are
      served for ``recheck_s``; any other credentials, or the creator's after that, are checked
      with the upstream by a JSON-RPC ``ping`` in the session first, and a refusal is relayed.
      When the creator's and the resume's credentials are both JWTs, their ``iss`` + ``sub``
      must also match.
    * ``principal``: the identity (``principal_header`` from a trusted proxy, or a JWT's
      ``iss`` + ``sub``) must be the creator's, else 403.
    * ``none``: a valid session id and cursor suffice (only for upstreams without auth).
    """

    resume: Literal["upstream", "principal", "none"] = Field(
        default="upstream",
        description="How resumes and standalone-stream joins are authorized: 'upstream', "
        "'principal' or 'none'.",
    )
    bind: Literal["accepted", "creator"] = Field(
        default="accepted",
        description="'accepted': any credentials the upstream accepts for the session (JWTs "
        "must carry the creator's iss + sub); 'creator': only the creator's exact credentials "
        "(a refreshed opaque token gets 403 and the client starts over).",
    )
    digest_key: SecretStr | None = Field(
        default=None,
        description="Key of the credential digests kept in the store (HMAC-SHA256), shared by "
        f"every replica, at least {MIN_DIGEST_KEY_CHARS} characters; never stored. Required "
        "with the Redis store; the memory store makes a random one per process.",
    )
    credential_headers: tuple[str, ...] = Field(
        default=("authorization",),
        description="Request headers that carry credentials (case-insensitive).",
    )
    credential_cookies: tuple[str, ...] = Field(
        default=(),
        description="Cookies that carry credentials, by name (other cookies are ignored: they "
        "rotate for unrelated reasons).",
    )
    recheck_s: float = Field(
        default=DEFAULT_AUTH_RECHECK_S,
        ge=0,
        description="Credentials the upstream accepted are served this long without asking it "
        "again (never past a JWT's exp), seconds; 0 = ask every time.",
    )
    probe_timeout_s: PositiveSeconds = Field(
        default=DEFAULT_AUTH_PROBE_TIMEOUT_S,
        description="Bound on one authorization probe of the upstream, seconds (then 503).",
    )
    principal_header: str | None = Field(
        default=None,
        description="principal mode: header carrying the authenticated identity, set by a "
        "proxy in server.trusted_proxies (dropped from everyone else's requests).",
    )
    jwks_file: Path | None = Field(
        default=None,
        description="principal mode: JWKS (JSON) whose keys verify bearer JWTs, so their "
        "iss + sub count without asking the upstream.",
    )
    jwt_audience: str | None = Field(
        default=None, description="principal mode: the 'aud' verified JWTs must carry."
    )

    @field_validator("credential_headers", "credential_cookies")
    @classmethod
    def _names(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            if not value or any(c in value for c in " \t\r\n:;=,"):
                raise ValueError(f"not a header or cookie name: {value!r}")
        return values

    @field_validator("principal_header")
    @classmethod
    def _header(cls, value: str | None) -> str | None:
        if value is not None and (not value or any(c in value for c in " \t\r\n:")):
            raise ValueError("not a header name")
        return value

    @field_validator("digest_key")
    @classmethod
    def _key_length(cls, key: SecretStr | None) -> SecretStr | None:
        if key is not None and not key.get_secret_value():
            raise ValueError("is empty (unset it, or give a secret of 16 characters or more)")
        if key is not None and len(key.get_secret_value()) < MIN_DIGEST_KEY_CHARS:
            raise ValueError(f"must be at least {MIN_DIGEST_KEY_CHARS} characters")
        return key

    @model_validator(mode="after")
    def _jwks_readable(self) -> AuthSettings:
        if self.jwks_file is not None and not self.jwks_file.is_file():
            raise ValueError("jwks_file: no such file")
        return self


class LoggingSettings(_Section):
    """Log output. JSON lines in production; a readable console format on a terminal."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = Field(
        default="auto", description="'auto': console on a TTY, JSON otherwise."
    )


class MetricsSettings(_Section):
    """Prometheus metrics at ``/metrics``."""

    enabled: bool = True


class Settings(BaseSettings):
    """Every setting of the gateway. Frozen once loaded; see the module docstring for sources."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
        nested_model_default_partial_update=True,
    )

    upstream: UpstreamSettings = UpstreamSettings()
    server: ServerSettings = ServerSettings()
    store: StoreSettings = StoreSettings()
    sse: SSESettings = SSESettings()
    auth: AuthSettings = AuthSettings()
    logging: LoggingSettings = LoggingSettings()
    metrics: MetricsSettings = MetricsSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,  # noqa: ARG003 - no .env files, by design
        file_secret_settings: PydanticBaseSettingsSource,  # noqa: ARG003
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags (init) over environment over the TOML file (``model_config['toml_file']``)."""
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if settings_cls.model_config.get("toml_file"):
            sources.append(TomlConfigSettingsSource(settings_cls))
        return tuple(sources)

    @model_validator(mode="after")
    def _shared_digest_key(self) -> Settings:
        if (
            self.store.backend == "redis"
            and self.auth.resume != "none"
            and self.auth.digest_key is None
        ):
            raise ValueError(
                "auth.digest_key is required with the Redis store (the same secret on every "
                f"replica; env {ENV_PREFIX}AUTH__DIGEST_KEY), unless auth.resume = 'none'"
            )
        return self

    def redacted(self) -> dict[str, Any]:
        """The settings as plain JSON-able data, secrets shown as ``'**********'``.

        Credentials in the upstream URL (password, query values) are masked too.
        """
        data = self.model_dump(mode="json")
        if data["upstream"]["url"]:
            data["upstream"]["url"] = redact_url(data["upstream"]["url"])
        return data


def load_settings(
    config_path: str | os.PathLike[str] | None = None,
    overrides: dict[str, Any] | None = None,
) -> Settings:
    """Load and validate the settings.

    Args:
        config_path: TOML file; when None, ``$MCP_SSE_GATEWAY_CONFIG`` if set, else none.
        overrides: nested values from command-line flags, e.g. ``{"server": {"port": 8080}}``;
            they win over environment and file.

    Returns:
        The frozen settings.

    Raises:
        ConfigError: the file is missing or not valid TOML, or a value is invalid. The message
            names every offending key as a dotted path (``server.port``) and never shows values.
    """
    path = config_path if config_path is not None else os.environ.get(CONFIG_PATH_ENV) or None
    settings_cls: type[Settings] = Settings
    if path is not None:
        toml_path = Path(path)
        if not toml_path.is_file():
            raise ConfigError(f"config file not found: {toml_path}")
        settings_cls = type(
            "Settings",
            (Settings,),
            {
                "model_config": SettingsConfigDict(
                    **{**Settings.model_config, "toml_file": toml_path}
                )
            },
        )
    try:
        return settings_cls(**(overrides or {}))
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None
    except SettingsError as exc:
        # A variable holding a list or table that is not JSON, e.g. ALLOWED_HOSTS=a.example.
        raise ConfigError(
            f"invalid environment variable ({exc}); lists and tables are JSON, e.g. "
            f"{ENV_PREFIX}SERVER__ALLOWED_HOSTS='[\"mcp.example.com\"]'"
        ) from None
    except ValueError as exc:
        # tomllib.TOMLDecodeError is a ValueError: a syntax error in the file.
        raise ConfigError(f"cannot read config file {path}: {exc}") from None


def redact_url(url: str) -> str:
    """*url* safe to log: its password and every query value replaced by ``***``.

    The one redaction of the project, for the upstream URL and the Redis URL alike
    (``http(s)://``, ``redis(s)://``, ``unix://``). The user name is kept (it names the ACL
    user or account); a query item without ``=`` is replaced whole (it may be a token); the
    fragment is dropped. A URL that cannot be parsed comes back as ``***``.

    Args:
        url: any URL.

    Returns:
        The URL without secrets.
    """
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "***"
    netloc = parts.netloc
    if password is not None:
        userinfo, _, hostinfo = netloc.rpartition("@")
        netloc = f"{userinfo.partition(':')[0]}:***@{hostinfo}"
    query = "&".join(
        f"{pair.partition('=')[0]}=***" if "=" in pair else "***"
        for pair in parts.query.split("&")
        if pair
    )
    scheme = f"{parts.scheme}://" if "://" in url else f"{parts.scheme}:" * bool(parts.scheme)
    return f"{scheme}{netloc}{parts.path}" + (f"?{query}" if query else "")


def _describe(exc: ValidationError) -> str:
    lines = ["invalid configuration:"]
    for error in exc.errors(include_url=False, include_input=False):
        message = error["msg"].removeprefix("Value error, ")
        key = ".".join(str(part) for part in error["loc"])
        lines.append(f"  {key}: {message}" if key else f"  {message}")
    return "\n".join(lines)
