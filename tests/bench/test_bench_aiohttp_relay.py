"""The aiohttp-relay baseline: a call passes through it whole, and a dead upstream is a 502."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from bench.procs import child_process, free_port, python, read_announcement
from bench.targets import aiohttp_relay
from mcp_sse_gateway.sse import SSEDecoder

START_S = 30.0
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def test_a_streamed_call_passes_through_whole_with_its_session_header(
    tmp_path: Path,
) -> None:
    argv = [python(), "-m", "bench.upstream", "--port", "0"]
    async with child_process("upstream", argv, workdir=tmp_path) as upstream:
        upstream_url = await read_announcement(upstream, "LISTENING ", START_S)
        async with (
            aiohttp_relay.start(upstream_url, workdir=tmp_path) as relay,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
        ):
            assert relay.url != upstream_url
            init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
            async with http.post(relay.url, json=init, headers=HEADERS) as response:
                assert response.status == 200
                session = response.headers["Mcp-Session-Id"]
                assert (await response.json())["result"]["protocolVersion"] == "2025-11-25"
            call = {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "stream_notifications", "arguments": {"count": 50}},
            }
            headers = {**HEADERS, "Mcp-Session-Id": session}
            async with http.post(relay.url, json=call, headers=headers) as response:
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("text/event-stream")
                decoder = SSEDecoder()
                events = []
                async for chunk in response.content.iter_any():
                    events += decoder.feed(chunk)
                events += decoder.end()
    messages = [json.loads(event.data or "null") for event in events]
    assert [m["params"]["data"]["i"] for m in messages[:-1]] == list(range(50))
    assert messages[-1]["id"] == 2
    assert "result" in messages[-1]


async def test_an_unreachable_upstream_is_a_502(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/mcp"
    async with (
        aiohttp_relay.start(dead, workdir=tmp_path) as relay,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
        http.post(relay.url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}) as response,
    ):
        assert response.status == 502
        assert "upstream unreachable" in await response.text()
