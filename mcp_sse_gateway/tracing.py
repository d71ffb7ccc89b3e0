"""Tracing, as the gateway's layers see it: spans without knowing OpenTelemetry.

Tracing is optional (the ``otel`` extra, :mod:`mcp_sse_gateway.otel`) and off unless the
standard ``OTEL_*`` variables configure an exporter. The web and stream layers talk to a
:class:`Tracing`; :data:`NO_TRACING` costs a method call and nothing else, and with it the
``traceparent``/``tracestate`` headers of a request pass through untouched (DESIGN D3).

Span shapes (see ``docs/operations.md``, "Traces"):

* ``<METHOD> <route>`` (server): one client request; its upstream request is a child, so the
  upstream's own spans join the client's trace.
* ``mcp.stream`` (internal, a root of its own): a managed stream's life, from the upstream
  request to its end. A pump outlives the request that started it, so it is *linked* to that
  request's span rather than nested in it.
* ``mcp.resume`` (internal, child of the resuming request): a ``Last-Event-ID`` replay, linked
  to the span of the request that created the stream (on any replica: the link is stored with
  the stream).
* ``store.<operation>`` (client): one event store call.

Attributes carry the session digest, the stream life, the JSON-RPC method and counts, never
payloads, session ids or credentials.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

__all__ = [
    "NO_TRACING",
    "Attribute",
    "NoTracing",
    "Span",
    "SpanKind",
    "Tracing",
]

#: A span attribute's value.
Attribute = str | int | float | bool
SpanKind = Literal["internal", "server", "client"]

#: Attribute names shared by the layers (OpenTelemetry's MCP conventions where they exist).
SESSION = "mcp.session.digest"
METHOD = "mcp.method.name"
LIFE = "mcp.stream.life"
KIND = "mcp.stream.kind"


class Span(Protocol):
    """One span being recorded."""

    def set(self, key: str, value: Attribute) -> None:
        """Set attribute *key* (a value that is not a payload, id or credential)."""

    def fail(self, reason: str) -> None:
        """Mark the span's status as an error with a short *reason* (no request data)."""

    def link(self, traceparent: str) -> None:
        """Add a link to the span a W3C *traceparent* names (ignored when malformed)."""


class Tracing(Protocol):
    """The gateway's tracer: OpenTelemetry's (:mod:`mcp_sse_gateway.otel`) or none."""

    @property
    def enabled(self) -> bool:
        """Spans are recorded and exported."""

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
    ) -> contextlib.AbstractContextManager[Span]:
        """A span, current inside the ``with`` block.

        Args:
            name: the span name.
            kind: ``server`` for a client request, ``client`` for a call out, else internal.
            attributes: its first attributes.
            links: W3C ``traceparent`` values of spans it follows from (see :meth:`origin`);
                empty strings are skipped.
            detached: a root of its own instead of a child of the current span.
            carrier: the request headers to take the parent from (``traceparent``), for a
                server span.
            start_ns: its start, nanoseconds since the epoch (default: now).
        """

    def origin(self) -> str:
        """The current span as a W3C ``traceparent`` value (to link to later), or ``""``."""

    def annotate(self, key: str, value: Attribute) -> None:
        """Set an attribute on the current span (no-op without one)."""

    def http_client_hooks(self) -> list[Any]:
        """``aiohttp.TraceConfig`` objects for the upstream client session (empty when off)."""

    def log_ids(self) -> dict[str, str]:
        """The current span's ``trace_id`` and ``span_id`` (hex) for a log line, or ``{}``."""

    def shutdown(self) -> None:
        """Export what is buffered and stop (at exit)."""


class _NoSpan:
    __slots__ = ()

    def set(self, key: str, value: Attribute) -> None:
        pass

    def fail(self, reason: str) -> None:
        pass

    def link(self, traceparent: str) -> None:
        pass


_NO_SPAN = _NoSpan()
#: Shared by every span of :class:`NoTracing` (reusable and reentrant): a waiting stream keeps
#: no context manager and generator of its own alive for the collector.
_NO_SPAN_CONTEXT: contextlib.AbstractContextManager[Span] = contextlib.nullcontext(_NO_SPAN)


class NoTracing:
    """Tracing off: every call is a no-op and nothing is added to requests."""

    __slots__ = ()

    @property
    def enabled(self) -> bool:
        """False."""
        return False

    def span(
        self,
        name: str,  # noqa: ARG002
        *,
        kind: SpanKind = "internal",  # noqa: ARG002
        attributes: Mapping[str, Attribute] | None = None,  # noqa: ARG002
        links: Sequence[str] = (),  # noqa: ARG002
        detached: bool = False,  # noqa: ARG002
        carrier: Mapping[str, str] | None = None,  # noqa: ARG002
        start_ns: int | None = None,  # noqa: ARG002
    ) -> contextlib.AbstractContextManager[Span]:
        """A span that records nothing."""
        return _NO_SPAN_CONTEXT

    def origin(self) -> str:
        """``""``: there is no span to link to."""
        return ""

    def annotate(self, key: str, value: Attribute) -> None:
        """Nothing to annotate."""

    def http_client_hooks(self) -> list[Any]:
        """None: upstream requests carry the client's own ``traceparent`` untouched (D3)."""
        return []

    def log_ids(self) -> dict[str, str]:
        """``{}``: log lines carry no trace ids."""
        return {}

    def shutdown(self) -> None:
        """Nothing to export."""


#: The tracer when tracing is off.
NO_TRACING: Tracing = NoTracing()
