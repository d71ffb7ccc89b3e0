"""The official SDK clients (Python ``mcp``, TypeScript ``@modelcontextprotocol/sdk``) complete
long tool calls through the gateway while their streams are closed on purpose (polling) or cut
mid-event by a flaky network, using their own reconnection. The upstream is the example server:
the official Python SDK without an event store, so every answer after a cut comes from the
gateway's store.
"""

from __future__ import annotations

from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from mcp_sse_gateway.example.content import sha256_hex
from mcp_sse_gateway.example.process import example_upstream
from tests.support.chaos import chaos_proxy
from tests.support.sdk_clients import python_call, ts_call, ts_polling_upstream

NOTIFICATIONS = 40
INTERVAL_MS = 10

pytestmark = pytest.mark.timeout(120)


def _indexes(data_items: list[Any]) -> list[int]:
    return [item["index"] for item in data_items if isinstance(item, dict) and "index" in item]


# The Python SDK (mcp 2.3) handles a network error on a *resumed* stream by reconnecting with
# the Last-Event-ID it had before that resume (so it receives again what it already had) and
# gives up after two errors in a row: its runs get polling, or one cut on the POST's stream.
# The TypeScript SDK gets polling and a cut on every stream.
@pytest.mark.parametrize("network", ["polling", "cut"])
async def test_python_sdk_long_call(gateway, network):
    sse = {"poll_after_ms": 0} if network.startswith("polling") else {}
    async with example_upstream() as upstream_url, gateway(upstream_url, sse=sse) as gw:
        url = gw.mcp_url
        if "cut" in network:
            async with chaos_proxy(gw.port, cut_after_bytes=2500, max_cuts=1) as proxy:
                url = f"http://127.0.0.1:{proxy.port}/mcp"
                logged, result = await python_call(
                    url,
                    "stream_notifications",
                    {"count": NOTIFICATIONS, "interval_ms": INTERVAL_MS, "payload_bytes": 100},
                )
            assert proxy.cuts > 0
        else:
            logged, result = await python_call(
                url, "stream_notifications", {"count": NOTIFICATIONS, "interval_ms": INTERVAL_MS}
            )
    assert not result.is_error
    assert result.content[0].text == f"sent {NOTIFICATIONS} notifications"
    assert _indexes(logged) == list(range(NOTIFICATIONS))


async def test_python_sdk_big_unicode_multiline_result_through_cuts(gateway):
    async with (
        example_upstream() as upstream_url,
        gateway(upstream_url, sse={"poll_after_ms": 0}) as gw,
        chaos_proxy(gw.port, cut_after_bytes=1_000_000, max_cuts=1) as proxy,
    ):
        _, result = await python_call(
            f"http://127.0.0.1:{proxy.port}/mcp",
            "big_payload",
            {"size_bytes": 3_000_000},
            max_event_bytes=16 * 1024 * 1024,
        )
    text, digest = result.content[0].text, result.content[1].text
    assert len(text.encode()) >= 3_000_000
    # JSON escapes CR and LF inside the text, so it crosses SSE framing byte for byte.
    assert digest == f"sha256:{sha256_hex(text)}"
    assert proxy.cuts > 0


@pytest.mark.parametrize("network", ["polling", "polling+cuts", "cuts"])
async def test_typescript_sdk_long_call(gateway, network):
    sse = {"poll_after_ms": 0} if network.startswith("polling") else {}
    arguments = {"count": NOTIFICATIONS, "interval_ms": INTERVAL_MS, "payload_bytes": 100}
    async with example_upstream() as upstream_url, gateway(upstream_url, sse=sse) as gw:
        if "cuts" in network:
            async with chaos_proxy(gw.port, cut_after_bytes=2500) as proxy:
                outcome = await ts_call(
                    f"http://127.0.0.1:{proxy.port}/mcp", "stream_notifications", arguments
                )
            assert proxy.cuts > 0
        else:
            outcome = await ts_call(gw.mcp_url, "stream_notifications", arguments)
    logged = [
        n["params"]["data"]
        for n in outcome["notifications"]
        if n["method"] == "notifications/message"
    ]
    assert outcome["result"]["content"][0]["text"] == f"sent {NOTIFICATIONS} notifications"
    assert _indexes(logged) == list(range(NOTIFICATIONS))


# The gap after each close: shorter than the client's and the gateway's retry (the answer comes
# on a re-opened GET), or longer (it comes while nothing is open: the upstream's replay holds it
# and then stays open).
@pytest.mark.parametrize("gap_ms", [20, 600], ids=["answer_on_a_reopened_get", "answer_in_a_gap"])
async def test_a_resumable_upstream_closing_again_and_again_is_resumed_each_time(gateway, gap_ms):
    """A TypeScript SDK upstream with an event store polls its client three times (SEP-1699):
    its replays carry neither priming nor retry, yet each later close is one on purpose too."""
    closes = 3
    async with (
        ts_polling_upstream(closes, gap_ms) as upstream_url,
        gateway(upstream_url) as gw,
    ):
        logged, result = await python_call(gw.mcp_url, "close_and_answer", {})
    assert not result.is_error, result
    assert result.content[0].text == f"answered after {closes} closes"
    assert [item["round"] for item in logged] == list(range(closes))


async def test_example_upstream_bare_surface():
    """The example server itself, without the gateway: what the other tests rely on."""
    async with example_upstream() as upstream_url:
        logged, result = await python_call(
            upstream_url, "stream_notifications", {"count": 50, "interval_ms": 0}
        )
        assert _indexes(logged) == list(range(50))
        assert result.content[0].text == "sent 50 notifications"
        _, big = await python_call(
            upstream_url,
            "big_payload",
            {"size_bytes": 200_000, "multiline": True, "unicode": True},
        )
        text = big.content[0].text
        assert "\r\n" in text
        assert any(ord(c) > 0xFFFF for c in text)
        assert big.content[1].text == f"sha256:{sha256_hex(text)}"
        async with (
            streamable_http_client(upstream_url) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            tools = {t.name for t in (await session.list_tools()).tools}
            resources = {str(r.uri) for r in (await session.list_resources()).resources}
            prompts = {p.name for p in (await session.list_prompts()).prompts}
    assert {"test_simple_text", "test_reconnection", "stream_notifications", "sleep"} <= tools
    assert "test://static-text" in resources
    assert "test_simple_prompt" in prompts


def test_demo_resumes_a_call_and_loses_nothing(tmp_path):
    """The README's first command, once and on a free port."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "mcp_sse_gateway", "demo", "--once", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "nothing lost: 20/20 notifications and the result, each exactly once" in done.stdout
