"""The root :class:`Settings`, its sources and their loading (:func:`load_settings`).

Precedence, highest first: command-line flags (passed as init arguments), environment variables
(prefix ``MCP_SSE_GATEWAY_``, sections nested with ``__``, e.g.
``MCP_SSE_GATEWAY_UPSTREAM__URL``), the TOML file (``--config PATH`` or
``MCP_SSE_GATEWAY_CONFIG``), then the defaults of the sections. :func:`load_settings` turns every
failure into a :class:`~mcp_sse_gateway.errors.ConfigError` whose message names the offending
keys and never shows values.

This module is sans-IO apart from reading the TOML file; it imports neither aiohttp nor redis.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from mcp_sse_gateway.config.access import AuthSettings
from mcp_sse_gateway.config.events import SSESettings, StoreSettings
from mcp_sse_gateway.config.network import ServerSettings, UpstreamSettings
from mcp_sse_gateway.config.redaction import redact_url
from mcp_sse_gateway.config.tasks import TasksSettings
from mcp_sse_gateway.config.telemetry import LoggingSettings, MetricsSettings
from mcp_sse_gateway.errors import ConfigError

ENV_PREFIX = "MCP_SSE_GATEWAY_"
CONFIG_PATH_ENV = f"{ENV_PREFIX}CONFIG"


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
    tasks: TasksSettings = TasksSettings()

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

        The upstream and Redis URLs are shown with their credentials masked (password, query
        values: :func:`~mcp_sse_gateway.config.redaction.redact_url`), so the host they name
        can be checked.
        """
        data = self.model_dump(mode="json")
        if data["upstream"]["url"]:
            data["upstream"]["url"] = redact_url(data["upstream"]["url"])
        if self.store.redis_url is not None:
            data["store"]["redis_url"] = redact_url(self.store.redis_url.get_secret_value())
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


#: What Kubernetes sets in every pod for a Service named ``mcp-sse-gateway`` (service links):
#: ``…_SERVICE_HOST``, ``…_SERVICE_PORT[_NAME]``, ``…_PORT``,
#: ``…_PORT_8080_TCP[_PROTO|_PORT|_ADDR]``.
_SERVICE_LINK = re.compile(r"(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT(_\d+_(TCP|UDP|SCTP)(_\w+)?)?)")


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """Names of ``MCP_SSE_GATEWAY_*`` variables that name no section, sorted: to warn about.

    The environment source reads only the variables of known sections, so a misspelt section
    (``MCP_SSE_GATEWAY_SERVERS__PORT``) is ignored without a word; a misspelt key within a
    known section is refused by the section itself (extra keys are forbidden). Kubernetes'
    service links for a Service of this name are not reported. Names are matched
    case-insensitively, as the settings read them; values are never looked at.
    """
    sections = {name.upper() for name in Settings.model_fields}
    unknown = []
    for name in environ:
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper == CONFIG_PATH_ENV:
            continue
        rest = upper.removeprefix(ENV_PREFIX)
        if rest.split("__", 1)[0] not in sections and not _SERVICE_LINK.fullmatch(rest):
            unknown.append(name)
    return sorted(unknown)


def _describe(exc: ValidationError) -> str:
    lines = ["invalid configuration:"]
    for error in exc.errors(include_url=False, include_input=False):
        message = error["msg"].removeprefix("Value error, ")
        key = ".".join(str(part) for part in error["loc"])
        lines.append(f"  {key}: {message}" if key else f"  {message}")
    return "\n".join(lines)
