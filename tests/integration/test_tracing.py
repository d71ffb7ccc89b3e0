"""Tracing (the ``otel`` extra) against real traffic: the example MCP server, real HTTP.

A tool call whose connection drops and is resumed is three traces: the client's (its POST, the
gateway's request span, the upstream request, and the upstream's own spans through the
``traceparent`` the gateway sends), the stream's (the pump, linked to that POST) and the
resume's (a later request, its ``mcp.resume`` span linked to that POST too).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from mcp_sse_gateway.event_ids import parse_event_id
from mcp_sse_gateway.logs import configure_logging
from mcp_sse_gateway.otel import OtelTracing
from mcp_sse_gateway.server import run_gateway
from tests.conftest import make_settings
from tests.support.counting_proxy import CountingProxy
from tests.support.mcp_http import open_session, stream_notifications_call
from tests.support.sse_client import json_messages, read_events
from tests.support.upstream import start_example_upstream

#: The client's own trace: its POST carries this ``traceparent``.
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
NOTIFICATIONS = 6
TOKEN = "Bearer secret-token-that-must-not-be-recorded"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.clear()


def _tracing(exporter: InMemorySpanExporter) -> OtelTracing:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return OtelTracing(provider)


def _hex(value: int, digits: int) -> str:
    return f"{value:0{digits}x}"


def _one(spans: list[ReadableSpan], **where: Any) -> ReadableSpan:
    """The one span whose attributes (and ``name``/``kind``/``parent``) match *where*."""
    found = [s for s in spans if _matches(s, where)]
    assert len(found) == 1, (where, [(s.name, dict(s.attributes or {})) for s in found])
    return found[0]


def _matches(span: ReadableSpan, where: dict[str, Any]) -> bool:
    for key, value in where.items():
        if key == "name":
            actual: Any = span.name
        elif key == "kind":
            actual = span.kind
        elif key == "parent":
            actual = span.parent.span_id if span.parent is not None else None
        else:
            actual = (span.attributes or {}).get(key)
        if actual != value:
            return False
    return True


async def _drop_and_resume(
    mcp_url: str, http: aiohttp.ClientSession
) -> tuple[dict[str, str], str, list[Any]]:
    """A traced tools/call, dropped after two notifications and resumed to its result."""
    session = await open_session(http, mcp_url, headers={"Authorization": TOKEN})
    call = stream_notifications_call(NOTIFICATIONS, interval_ms=50)
    response = await http.post(mcp_url, json=call, headers={**session, "traceparent": TRACEPARENT})
    assert response.status == 200
    first, _ = await read_events(response, until=3)  # priming + 2 notifications
    response.close()
    cursor = first[-1].id
    assert cursor is not None
    resumed = await http.get(mcp_url, headers={**session, "Last-Event-ID": cursor})
    assert resumed.status == 200
    second, ended = await read_events(resumed)
    assert ended
    messages = json_messages(first) + json_messages(second)
    return session, cursor, messages


async def test_a_dropped_and_resumed_tool_call_is_three_linked_traces(
    exporter: InMemorySpanExporter,
) -> None:
    async with (
        start_example_upstream() as upstream_url,
        CountingProxy(upstream_url).running() as proxy,
        run_gateway(make_settings(proxy.url), tracing=_tracing(exporter)) as gw,
        aiohttp.ClientSession() as http,
    ):
        session, cursor, messages = await _drop_and_resume(gw.mcp_url, http)
    # The gateway has stopped: every span has ended.
    indexes = [m["params"]["data"]["index"] for m in messages if m.get("method")]
    assert indexes == list(range(NOTIFICATIONS))
    assert "result" in messages[-1]
    spans = list(exporter.get_finished_spans())

    # 1. The client's trace: its POST, the gateway's request span, the upstream request.
    post = _one(spans, name="POST /mcp", **{"mcp.method.name": "tools/call"})
    assert post.kind == SpanKind.SERVER
    assert _hex(post.context.trace_id, 32) == CLIENT_TRACE
    assert post.parent is not None
    assert _hex(post.parent.span_id, 16) == CLIENT_SPAN
    # The client dropped its connection mid-stream: 499, as in the request's log line.
    assert (post.attributes or {})["http.response.status_code"] == 499
    upstream_post = _one(spans, name="POST", kind=SpanKind.CLIENT, parent=post.context.span_id)
    assert upstream_post.context.trace_id == post.context.trace_id
    # What the upstream received: the gateway's upstream span as its parent, in the client's
    # trace (the client's own traceparent was replaced, as a traced proxy does).
    sent = [h["traceparent"] for _, h in proxy.requests if CLIENT_TRACE in h.get("traceparent", "")]
    assert sent == [f"00-{CLIENT_TRACE}-{_hex(upstream_post.context.span_id, 16)}-01"]

    # 2. The stream's trace: a root of its own, linked to the POST.
    stream = _one(spans, name="mcp.stream")
    assert stream.parent is None
    assert stream.context.trace_id != post.context.trace_id
    assert [link.context.span_id for link in stream.links] == [post.context.span_id]
    attributes = stream.attributes or {}
    life = parse_event_id(cursor)
    assert life is not None
    assert attributes["mcp.stream.life"] == life.life
    assert attributes["mcp.stream.kind"] == "request"
    assert attributes["mcp.method.name"] == "tools/call"
    assert attributes["mcp.stream.events_stored"] == NOTIFICATIONS + 1  # and the result
    assert attributes["mcp.stream.end"] == "finished"
    assert stream.start_time is not None
    assert post.start_time is not None
    assert post.start_time <= stream.start_time <= upstream_post.start_time  # type: ignore[operator]
    appends = [s for s in spans if s.name.startswith("store.append")]
    assert appends
    assert all(s.parent is not None and s.parent.span_id == stream.context.span_id for s in appends)

    # 3. The resume's trace: a later GET, its mcp.resume span linked to the POST.
    resume = _one(spans, name="mcp.resume")
    get = next(s for s in spans if s.context.span_id == (resume.parent and resume.parent.span_id))
    assert get.name == "GET /mcp"
    assert get.kind == SpanKind.SERVER
    assert [link.context.span_id for link in resume.links] == [post.context.span_id]
    resumed = resume.attributes or {}
    assert resumed["mcp.resume.outcome"] == "served"
    assert resumed["mcp.resume.from_offset"] == life.offset
    assert resumed["mcp.resume.ended"] == "finished"
    assert resumed["mcp.resume.events"] == NOTIFICATIONS - 2 + 1
    assert any(
        s.name == "store.stream_info" and s.parent and s.parent.span_id == resume.context.span_id
        for s in spans
    )

    # Never a session id, a credential or a payload in any span.
    secrets = (session["Mcp-Session-Id"], "secret-token", '"progress"', "notifications/message")
    for span in spans:
        recorded = json.dumps(dict(span.attributes or {}))
        assert not any(secret in recorded for secret in secrets), (span.name, recorded)
    # Probes are not traced.
    assert not [s for s in spans if "/healthz" in s.name or "/metrics" in s.name]


async def test_an_unknown_cursor_is_a_resume_span_with_its_outcome(
    exporter: InMemorySpanExporter,
) -> None:
    async with (
        start_example_upstream() as upstream_url,
        run_gateway(make_settings(upstream_url), tracing=_tracing(exporter)) as gw,
        aiohttp.ClientSession() as http,
    ):
        session = await open_session(http, gw.mcp_url)
        gone = "0" * 32 + "-1"
        async with http.get(gw.mcp_url, headers={**session, "Last-Event-ID": gone}) as response:
            assert response.status == 400
    spans = list(exporter.get_finished_spans())
    resume = _one(spans, name="mcp.resume")
    assert (resume.attributes or {})["mcp.resume.outcome"] in {"invalid", "unknown_stream"}
    get = _one(spans, name="GET /mcp")
    assert (get.attributes or {})["http.response.status_code"] == 400


async def test_log_lines_inside_a_span_carry_its_trace_id(
    exporter: InMemorySpanExporter, capsys: pytest.CaptureFixture[str]
) -> None:
    tracing = _tracing(exporter)
    configure_logging("info", "json", tracing=tracing)
    import structlog

    with tracing.span("test.work"):
        structlog.get_logger("test").info("inside")
    structlog.get_logger("test").info("outside")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line]
    inside = next(line for line in lines if line["event"] == "inside")
    outside = next(line for line in lines if line["event"] == "outside")
    (span,) = exporter.get_finished_spans()
    assert inside["trace_id"] == _hex(span.context.trace_id, 32)
    assert inside["span_id"] == _hex(span.context.span_id, 16)
    assert "trace_id" not in outside
