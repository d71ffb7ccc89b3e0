"""Structured logging: JSON lines in production, a readable console on a terminal.

Event names are dotted and lower-case (``upstream.connect_failed``), values are flat key/values
with units in the keys (``duration_ms``). Logs carry a session digest (``session``), never the raw
``Mcp-Session-Id``, ``Authorization`` or payloads. aiohttp's own loggers are routed through the
same renderer so there is one output format.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Literal

import structlog

if TYPE_CHECKING:
    from collections.abc import MutableMapping

    from mcp_sse_gateway.tracing import Tracing

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def configure_logging(
    level: Literal["debug", "info", "warning", "error"] = "info",
    fmt: Literal["auto", "json", "console"] = "auto",
    *,
    tracing: Tracing | None = None,
) -> None:
    """Configure structlog and the standard library's root logger (to stderr).

    Args:
        level: the lowest level written.
        fmt: ``json`` (one object per line), ``console``, or ``auto`` (console on a TTY).
        tracing: when it is on, every line written inside a span carries its ``trace_id`` and
            ``span_id``.
    """
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if tracing is not None and tracing.enabled:
        ids = tracing.log_ids

        def add_trace_ids(
            _logger: object, _name: str, event: MutableMapping[str, object]
        ) -> MutableMapping[str, object]:
            for key, value in ids().items():
                event.setdefault(key, value)
            return event

        shared.append(add_trace_ids)
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS[level])
    # One canonical request line of our own replaces aiohttp's access log.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
