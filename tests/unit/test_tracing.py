"""When tracing is on, what it needs, and what it costs when off (mcp_sse_gateway.otel)."""

from __future__ import annotations

import sys

import pytest

from mcp_sse_gateway.cli import main
from mcp_sse_gateway.errors import ConfigError
from mcp_sse_gateway.otel import OtelTracing, tracing_enabled_by, tracing_from_environment
from mcp_sse_gateway.tracing import NO_TRACING


@pytest.mark.parametrize(
    ("environ", "exporter"),
    [
        ({}, None),
        ({"OTEL_SERVICE_NAME": "gw"}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, "otlp"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, "otlp"),
        ({"OTEL_TRACES_EXPORTER": "console"}, "console"),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}, None),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, None),
        ({"OTEL_SDK_DISABLED": "false", "OTEL_TRACES_EXPORTER": " OTLP "}, "otlp"),
    ],
)
def test_the_standard_variables_decide(environ: dict[str, str], exporter: str | None) -> None:
    assert tracing_enabled_by(environ) == exporter


def test_an_exporter_the_gateway_does_not_ship_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="zipkin"):
        tracing_enabled_by({"OTEL_TRACES_EXPORTER": "zipkin"})


def test_off_is_the_no_op_tracer() -> None:
    tracing = tracing_from_environment({})
    assert tracing is NO_TRACING
    assert not tracing.enabled
    assert tracing.origin() == ""
    assert tracing.http_client_hooks() == []
    with tracing.span("anything", links=("00-" + "1" * 32 + "-" + "2" * 16 + "-01",)) as span:
        span.set("k", 1)
        span.link("not a traceparent")


def test_console_exporter_makes_a_real_tracer() -> None:
    tracing = tracing_from_environment({"OTEL_TRACES_EXPORTER": "console"})
    try:
        assert isinstance(tracing, OtelTracing)
        with tracing.span("outer"):
            origin = tracing.origin()
        assert origin.startswith("00-")
        assert tracing.origin() == ""  # outside any span
    finally:
        tracing.shutdown()


def test_asking_for_tracing_without_the_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # As if OpenTelemetry were not installed: its import fails.
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    with pytest.raises(ConfigError, match=r"mcp-sse-gateway\[otel\]"):
        tracing_from_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})


def test_serve_refuses_to_start_on_a_bad_tracing_setup(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "jaeger")
    assert main(["serve", "--upstream", "http://127.0.0.1:9/mcp", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "OTEL_TRACES_EXPORTER" in err
    assert "Traceback" not in err


def test_a_malformed_link_is_skipped() -> None:
    tracing = tracing_from_environment({"OTEL_TRACES_EXPORTER": "console"})
    try:
        assert isinstance(tracing, OtelTracing)
        assert tracing.links(("", "garbage", "00-" + "0" * 32 + "-" + "0" * 16 + "-01")) == []
        assert len(tracing.links(("00-" + "a" * 32 + "-" + "b" * 16 + "-01",))) == 1
    finally:
        tracing.shutdown()
