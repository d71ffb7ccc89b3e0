"""OpenTelemetry tracing (the ``otel`` extra), when the ``OTEL_*`` variables configure it.

:class:`OtelTracing` is the :class:`~mcp_sse_gateway.tracing.Tracing` the gateway then uses.
OpenTelemetry is imported only when tracing is on, so an install without the extra never needs it.
:func:`tracing_from_environment` decides, from the variables the OpenTelemetry SDK documents:

* ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``: off;
* ``OTEL_TRACES_EXPORTER`` naming ``otlp`` or ``console``, or an endpoint in
  ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``: on;
* otherwise off.

Everything else (endpoint, headers, protocol, sampler, propagators, resource) is read by the SDK
from its own variables. ``service.name`` defaults to ``mcp-sse-gateway``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from typing import Any

from mcp_sse_gateway.config import redact_url
from mcp_sse_gateway.errors import ConfigError
from mcp_sse_gateway.tracing import NO_TRACING, Attribute, Span, SpanKind, Tracing

__all__ = ["OtelTracing", "tracing_enabled_by", "tracing_from_environment"]

#: ``pip install`` hint when the variables ask for tracing and the extra is missing.
EXTRA_HINT = "pip install 'mcp-sse-gateway[otel]' (from a checkout: pip install '.[otel]')"
DEFAULT_SERVICE_NAME = "mcp-sse-gateway"
#: Exporters ``OTEL_TRACES_EXPORTER`` may name here.
EXPORTERS = frozenset({"otlp", "console", "none"})


def tracing_enabled_by(environ: Mapping[str, str]) -> str | None:
    """The exporter the ``OTEL_*`` variables of *environ* ask for, or None (tracing off).

    Raises:
        ConfigError: ``OTEL_TRACES_EXPORTER`` names an exporter this gateway does not ship.
    """
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    named = [e.strip().lower() for e in environ.get("OTEL_TRACES_EXPORTER", "").split(",")]
    named = [e for e in named if e]
    unknown = sorted(set(named) - EXPORTERS)
    if unknown:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER names {', '.join(unknown)}: this gateway exports traces "
            "with otlp or console (or none)"
        )
    if named:
        return None if named == ["none"] else next(e for e in named if e != "none")
    if environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    ):
        return "otlp"
    return None


def tracing_from_environment(environ: Mapping[str, str] | None = None) -> Tracing:
    """The gateway's tracing as the ``OTEL_*`` variables configure it (see the module doc).

    Returns:
        :data:`~mcp_sse_gateway.tracing.NO_TRACING` when off, else an :class:`OtelTracing`
        exporting in batches.

    Raises:
        ConfigError: tracing is asked for but the ``otel`` extra is not installed, or the
            variables name an exporter or protocol this gateway does not ship.
    """
    environ = os.environ if environ is None else environ
    exporter_name = tracing_enabled_by(environ)
    if exporter_name is None:
        return NO_TRACING
    try:
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import (  # noqa: PLC0415
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ImportError:
        raise ConfigError(
            f"tracing is configured (OTEL_* variables) but OpenTelemetry is not installed: "
            f"{EXTRA_HINT}"
        ) from None
    exporter: SpanExporter = (
        ConsoleSpanExporter() if exporter_name == "console" else _otlp_exporter(environ)
    )
    attributes = {} if environ.get("OTEL_SERVICE_NAME") else {"service.name": DEFAULT_SERVICE_NAME}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return OtelTracing(provider)


def _otlp_exporter(environ: Mapping[str, str]) -> Any:
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found]  # noqa: PLC0415
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError:
            raise ConfigError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc "
                "(the otel extra ships http/protobuf)"
            ) from None
        return GrpcExporter()
    if protocol != "http/protobuf":
        raise ConfigError(f"OTLP protocol {protocol!r}: use http/protobuf (or grpc)")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
        OTLPSpanExporter,
    )

    return OTLPSpanExporter()


class _OtelSpan:
    __slots__ = ("_span", "_tracing")

    def __init__(self, span: Any, tracing: OtelTracing) -> None:
        self._span = span
        self._tracing = tracing

    def link(self, traceparent: str) -> None:
        for link in self._tracing.links((traceparent,)):
            self._span.add_link(link.context)

    def set(self, key: str, value: Attribute) -> None:
        self._span.set_attribute(key, value)

    def fail(self, reason: str) -> None:
        from opentelemetry.trace import Status, StatusCode  # noqa: PLC0415

        self._span.set_status(Status(StatusCode.ERROR, reason))


class OtelTracing:
    """Tracing on, with OpenTelemetry: spans from *provider*, context by the global propagator.

    Args:
        provider: an ``opentelemetry.sdk.trace.TracerProvider`` (or any API provider). Tests
            pass one with an in-memory exporter.
    """

    def __init__(self, provider: Any) -> None:
        from opentelemetry import propagate, trace  # noqa: PLC0415
        from opentelemetry.context import Context  # noqa: PLC0415
        from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415
            TraceContextTextMapPropagator,
        )

        from mcp_sse_gateway import __version__  # noqa: PLC0415

        self._provider = provider
        self._tracer = provider.get_tracer("mcp_sse_gateway", __version__)
        self._trace = trace
        self._propagate = propagate
        self._context = Context
        # Links are stored as traceparent values: always W3C, whatever OTEL_PROPAGATORS says.
        self._w3c = TraceContextTextMapPropagator()
        self._kinds = {
            "internal": trace.SpanKind.INTERNAL,
            "server": trace.SpanKind.SERVER,
            "client": trace.SpanKind.CLIENT,
        }

    @property
    def enabled(self) -> bool:
        """True."""
        return True

    @contextlib.contextmanager
    def span(
        self,
        name: str,
        *,
        kind: SpanKind = "internal",
        attributes: Mapping[str, Attribute] | None = None,
        links: Sequence[str] = (),
        detached: bool = False,
        carrier: Mapping[str, str] | None = None,
        start_ns: int | None = None,
    ) -> Iterator[Span]:
        """A recorded span (see :meth:`mcp_sse_gateway.tracing.Tracing.span`)."""
        if carrier is not None:
            parent = self._propagate.extract(carrier)
        elif detached:
            parent = self._context()
        else:
            parent = None
        with self._tracer.start_as_current_span(
            name,
            context=parent,
            kind=self._kinds[kind],
            attributes=dict(attributes) if attributes else None,
            links=self.links(links),
            start_time=start_ns,
            record_exception=False,
        ) as span:
            yield _OtelSpan(span, self)

    def links(self, traceparents: Sequence[str]) -> list[Any]:
        """``Link`` objects to the spans *traceparents* name (malformed ones are skipped)."""
        links = []
        for value in traceparents:
            if not value:
                continue
            context = self._trace.get_current_span(
                self._w3c.extract({"traceparent": value})
            ).get_span_context()
            if context.is_valid:
                links.append(self._trace.Link(context))
        return links

    def origin(self) -> str:
        """The current span as a ``traceparent`` value, or ``""`` outside any span."""
        carrier: MutableMapping[str, str] = {}
        self._w3c.inject(carrier)
        return carrier.get("traceparent", "")

    def annotate(self, key: str, value: Attribute) -> None:
        """Set *key* on the current span."""
        self._trace.get_current_span().set_attribute(key, value)

    def http_client_hooks(self) -> list[Any]:
        """OpenTelemetry's aiohttp client instrumentation (URLs redacted as in logs)."""
        from opentelemetry.instrumentation.aiohttp_client import (  # noqa: PLC0415
            create_trace_config,
        )

        return [
            create_trace_config(
                url_filter=lambda url: redact_url(str(url)), tracer_provider=self._provider
            )
        ]

    def shutdown(self) -> None:
        """Flush buffered spans to the exporter and stop the provider."""
        shutdown = getattr(self._provider, "shutdown", None)
        if shutdown is not None:
            shutdown()

    def log_ids(self) -> dict[str, str]:
        """The current span's ``trace_id`` and ``span_id`` (hex) for a log line, or ``{}``."""
        context = self._trace.get_current_span().get_span_context()
        if not context.is_valid:
            return {}
        return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}
