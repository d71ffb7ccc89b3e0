"""The Grafana dashboard and the Prometheus alert rules in deploy/ query metrics that exist.

Real traffic first (the example MCP server, a gateway on a real redis-server, a tool call that
drops and resumes, a resume that cannot be served), then every ``mcp_sse_gateway_*`` name the
dashboard's panels and the rules use must be in the gateway's ``/metrics``. promtool (Debian's
``prometheus`` package) checks the rules, runs their unit tests, and checks every panel query as
PromQL.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from mcp_sse_gateway.server import run_gateway
from tests.conftest import make_settings
from tests.support.mcp_http import open_session, stream_notifications_call
from tests.support.redis_keys import redis_store
from tests.support.sse_client import read_events
from tests.support.upstream import start_example_upstream
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "mcp-sse-gateway.json"
RULES = ROOT / "deploy" / "prometheus" / "alerts.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts.test.yaml"
METRIC = re.compile(r"\bmcp_sse_gateway_[a-z_]+\b")
#: Series suffixes of one metric family in the exposition.
SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")
#: Families queried whose samples need events the traffic here does not cause (each still
#: declared in /metrics, with HELP and TYPE): an upstream failure, a refused resume.
RARE = {
    "mcp_sse_gateway_upstream_errors_total",
    "mcp_sse_gateway_auth_refusals_total",
    "mcp_sse_gateway_auth_probes_total",
    "mcp_sse_gateway_auth_probe_seconds_bucket",
}
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool")


def _dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def _rule_queries() -> list[str]:
    rules = yaml.safe_load(RULES.read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def _family(series: str) -> str:
    for suffix in SUFFIXES:
        if series.endswith(suffix):
            return series[: -len(suffix)]
    return series


NOTIFICATIONS = 5


def _sample(text: str, name: str) -> float:
    """The value of the unlabelled sample *name* in a /metrics text (0 when absent)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and not sample.labels:
                return float(sample.value)
    return 0.0


async def _traffic_then_metrics(redis_url: str) -> str:
    """/metrics of a gateway on Redis after a dropped and resumed call and a bad resume."""
    async with start_example_upstream() as upstream_url:
        settings = make_settings(upstream_url, store=redis_store(redis_url))
        async with run_gateway(settings) as gw, aiohttp.ClientSession() as http:
            session = await open_session(http, gw.mcp_url)
            call = stream_notifications_call(NOTIFICATIONS, interval_ms=20)
            response = await http.post(gw.mcp_url, json=call, headers=session)
            first, _ = await read_events(response, until=2)
            response.close()
            assert first[-1].id is not None
            # Resume once the call has finished upstream: all it missed is then a replay.
            stored = NOTIFICATIONS + 1  # the notifications and the response

            async def all_stored() -> bool:
                async with http.get(gw.base_url + "/metrics") as now:
                    text = await now.text()
                return _sample(text, "mcp_sse_gateway_events_stored_total") >= stored

            await eventually(all_stored)
            headers = {**session, "Last-Event-ID": first[-1].id}
            async with http.get(gw.mcp_url, headers=headers) as resumed:
                assert resumed.status == 200
                await read_events(resumed)
            bad = {**session, "Last-Event-ID": "0" * 32 + "-1"}
            async with http.get(gw.mcp_url, headers=bad) as refused:
                assert refused.status == 400
            # A request for another host (DNS rebinding): refused before forwarding.
            async with http.post(gw.mcp_url, json=call, headers={"Host": "evil.example"}) as no:
                assert no.status == 403
            async with http.get(gw.base_url + "/metrics") as metrics:
                assert metrics.status == 200
                return await metrics.text()


def test_the_dashboard_is_a_grafana_dashboard_on_a_prometheus_datasource() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "instance"} <= variables
    graphs = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(graphs) >= 10
    for panel in graphs:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        assert panel["description"], panel["title"]
        for target in panel["targets"]:
            assert 'instance=~"$instance"' in target["expr"], target["expr"]


async def test_every_metric_the_dashboard_and_rules_query_is_exported(
    redis_server: str,
) -> None:
    text = await _traffic_then_metrics(redis_server)
    families = list(text_string_to_metric_families(text))
    declared = {f.name for f in families} | {f.name + "_total" for f in families}
    with_samples = {s.name for f in families for s in f.samples}
    queried = {m for q in _dashboard_queries() + _rule_queries() for m in METRIC.findall(q)}
    assert len(queried) >= 20
    for name in sorted(queried):
        assert _family(name) in declared or name in declared, f"{name} is not in /metrics"
        if name not in RARE:
            assert name in with_samples, f"{name} has no samples after the traffic"
    # The traffic itself, as the dashboard will show it.
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples
    }
    assert values[("mcp_sse_gateway_resumes_total", (("outcome", "served"),))] == 1
    assert values[("mcp_sse_gateway_events_replayed_total", ())] >= 1
    assert values[("mcp_sse_gateway_store_up", ())] == 1


@needs_promtool
def test_the_alert_rules_pass_promtool_and_their_unit_tests() -> None:
    for command in (["check", "rules", RULES.name], ["test", "rules", RULE_TESTS.name]):
        done = subprocess.run(
            ["promtool", *command],
            cwd=RULES.parent,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    rules: dict[str, Any] = {"groups": [{"name": "dashboard", "rules": []}]}
    for index, query in enumerate(_dashboard_queries()):
        expr = query.replace("$instance", ".*").replace("$__rate_interval", "1m")
        rules["groups"][0]["rules"].append({"record": f"dashboard:query_{index}", "expr": expr})
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump(rules))
    done = subprocess.run(
        ["promtool", "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
