"""Long calls on a JSON-only server survive idle timeouts with ``sse.upgrade_json`` (official
SDK clients, the bundled example server in JSON mode, no event store).

Between the client and the gateway, an HTTP relay cuts every response that sends nothing for
its idle timeout, as a load balancer does. Without the upgrade, a JSON answer sends nothing
until the call ends, so a call longer than the idle timeout is lost. With it, the client gets an
SSE stream at once: keepalives carry the call through an idle timeout longer than
``keepalive_s``; a shorter one cuts the stream, and the client resumes it with
``Last-Event-ID``, on the same replica or on another one (the relay sends GETs to a second
gateway on the same Redis).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from mcp_sse_gateway.example.process import example_upstream
from mcp_sse_gateway.server import RunningGateway
from mcp_sse_gateway.web.keys import METRICS
from tests.support.idle_proxy import IdleCutRelay
from tests.support.redis_keys import redis_store
from tests.support.sdk_clients import python_call, ts_call

pytestmark = pytest.mark.timeout(120)

#: The call outlasts the relay's idle timeout; the first cut comes before it ends.
CALL_S = 1.0
IDLE_S = 0.4
#: The gateway: the client's stream starts within 0.1 s, reconnections wait 0.2 s.
UPGRADE = {"upgrade_json": True, "upgrade_wait_ms": 100, "retry_ms": 200}


@contextlib.asynccontextmanager
async def _json_upstream() -> AsyncIterator[str]:
    async with example_upstream("--json-response") as url:
        yield url


async def _sleep_call(client: str, url: str) -> str:
    """The ``sleep`` tool's text, called by the *client* SDK at *url*."""
    arguments: dict[str, Any] = {"seconds": CALL_S}
    if client == "python":
        _, result = await python_call(url, "sleep", arguments)
        assert not result.is_error, result
        return str(result.content[0].text)
    outcome = await ts_call(url, "sleep", arguments)
    assert "result" in outcome, outcome
    return str(outcome["result"]["content"][0]["text"])


@pytest.mark.parametrize("client", ["python", "typescript"])
async def test_an_idle_cut_stream_resumes_on_the_same_replica(gateway, client):
    sse = {**UPGRADE, "keepalive_s": 5.0}  # keepalives too rare for the relay: it cuts
    async with _json_upstream() as upstream_url, gateway(upstream_url, sse=sse) as gw:
        relay = IdleCutRelay({"*": gw.mcp_url}, IDLE_S)
        async with relay.running():
            text = await _sleep_call(client, relay.url)
        resumes = _metric(gw, "mcp_sse_gateway_resumes_total", outcome="served")
    assert text == f"slept {CALL_S:g} s"
    assert relay.cuts >= 1
    assert resumes >= 1


@pytest.mark.parametrize("client", ["python", "typescript"])
async def test_an_idle_cut_stream_resumes_on_another_replica(gateway, redis_server, client):
    sse = {**UPGRADE, "keepalive_s": 5.0}
    store = redis_store(redis_server)
    async with (
        _json_upstream() as upstream_url,
        gateway(upstream_url, sse=sse, store=store) as a,
        gateway(upstream_url, sse=sse, store=store) as b,
    ):
        # Tool calls (POST) on A; every GET, the resume among them, on B.
        relay = IdleCutRelay({"POST": a.mcp_url, "*": b.mcp_url}, IDLE_S)
        async with relay.running():
            text = await _sleep_call(client, relay.url)
        pumped_on_a = _metric(a, "mcp_sse_gateway_events_stored_total")
        resumed_on_b = _metric(b, "mcp_sse_gateway_resumes_total", outcome="served")
    assert text == f"slept {CALL_S:g} s"
    assert relay.cuts >= 1
    assert pumped_on_a >= 1
    assert resumed_on_b >= 1


@pytest.mark.parametrize("client", ["python", "typescript"])
async def test_keepalives_carry_a_long_call_through_a_longer_idle_timeout(gateway, client):
    sse = {**UPGRADE, "keepalive_s": IDLE_S / 4}
    async with _json_upstream() as upstream_url, gateway(upstream_url, sse=sse) as gw:
        relay = IdleCutRelay({"*": gw.mcp_url}, IDLE_S)
        async with relay.running():
            text = await _sleep_call(client, relay.url)
        resumes = _metric(gw, "mcp_sse_gateway_resumes_total", outcome="served")
    assert text == f"slept {CALL_S:g} s"
    # The relay cut nothing that mattered: the tool call's stream was never resumed.
    assert resumes == 0


@pytest.mark.parametrize("client", ["python", "typescript"])
async def test_without_the_upgrade_the_idle_timeout_loses_the_call(gateway, client):
    """The negative control: the same call, the same relay, JSON answers as they are."""
    async with _json_upstream() as upstream_url, gateway(upstream_url) as gw:
        relay = IdleCutRelay({"*": gw.mcp_url}, IDLE_S)
        async with relay.running():
            with pytest.raises(BaseException) as lost:  # each SDK fails its own way
                await _sleep_call(client, relay.url)
    assert relay.cuts >= 1
    assert not isinstance(lost.value, (KeyboardInterrupt, SystemExit))


def _metric(gw: RunningGateway, name: str, **labels: str) -> float:
    value = gw.app[METRICS].registry.get_sample_value(name, labels or None)
    return value or 0.0
