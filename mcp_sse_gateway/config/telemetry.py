"""What the gateway tells its operators: the ``[logging]`` and ``[metrics]`` sections."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mcp_sse_gateway.config.fields import Section


class LoggingSettings(Section):
    """Log output. JSON lines in production; a readable console format on a terminal."""

    level: Literal["debug", "info", "warning", "error"] = Field(
        default="info",
        description="Lowest level written ('debug' adds probes and per-connection detail).",
    )
    format: Literal["auto", "json", "console"] = Field(
        default="auto", description="'auto': console on a TTY, JSON otherwise."
    )


class MetricsSettings(Section):
    """Prometheus metrics at ``/metrics``."""

    enabled: bool = Field(
        default=True, description="Serve /metrics (Prometheus text format) on the listen port."
    )
