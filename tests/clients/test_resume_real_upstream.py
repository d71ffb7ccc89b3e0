"""Drops and resumes against the real example MCP server (official SDK, no event store).

The upstream cannot replay anything: every message a client gets after a drop comes from the
gateway's store. Raw HTTP here, so the test decides exactly where the connection drops.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CreateMessageResult, ElicitResult, TextContent

from mcp_sse_gateway.example.process import example_upstream
from tests.support.mcp_http import open_session
from tests.support.mcp_http import stream_notifications_call as _call
from tests.support.sse_client import read_events

N = 10

pytestmark = pytest.mark.timeout(90)


def _check_exactly_once(messages: list[dict[str, Any]], request_id: int = 1) -> None:
    indexes = [m["params"]["data"]["index"] for m in messages if m.get("method")]
    assert indexes == list(range(N))
    results = [m for m in messages if m.get("id") == request_id]
    assert len(results) == 1
    assert results[0]["result"]["content"][0]["text"] == f"sent {N} notifications"


@pytest.mark.parametrize("drop_after", [0, 1, N // 2, N - 1, N, N + 1])
async def test_drop_after_k_messages_and_resume(gateway, drop_after):
    """k = 0 (right after priming), 1, the middle, just before the last notification, just
    before the response, and after the response."""
    async with (
        example_upstream() as upstream_url,
        gateway(upstream_url) as gw,
        aiohttp.ClientSession() as http,
    ):
        headers = await open_session(http, gw.mcp_url)
        call = await http.post(gw.mcp_url, headers=headers, json=_call(N, 20))
        first, _ = await read_events(call, until=1 + drop_after)
        first = first[: 1 + drop_after]  # read no further than the drop point
        call.close()
        cursor = first[-1].id
        resumed = await http.get(gw.mcp_url, headers={**headers, "Last-Event-ID": cursor})
        if drop_after == N + 1:
            # The response was already received: nothing follows the cursor of a stream that
            # has ended (or ends as soon as the upstream call does).
            assert resumed.status in (200, 204)
            second, _ = await read_events(resumed) if resumed.status == 200 else ([], True)
            assert not [e for e in second if e.data]
        else:
            assert resumed.status == 200
            second, ended = await read_events(resumed)
            assert ended
        messages = [json.loads(e.data) for e in first + second if e.data]
    _check_exactly_once(messages)


async def test_resume_mid_call_then_again_after_the_call_ended(gateway):
    async with (
        example_upstream() as upstream_url,
        gateway(upstream_url) as gw,
        aiohttp.ClientSession() as http,
    ):
        headers = await open_session(http, gw.mcp_url)
        call = await http.post(gw.mcp_url, headers=headers, json=_call(N, 30))
        first, _ = await read_events(call, until=3)
        first = first[:3]
        call.close()
        mid = await http.get(gw.mcp_url, headers={**headers, "Last-Event-ID": first[-1].id})
        second, _ = await read_events(mid, until=3)
        second = second[:3]
        mid.close()
        # Let the call end upstream while no client is connected: the stream is in the store.
        sleep = await http.post(
            gw.mcp_url,
            headers=headers,
            json={
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "sleep", "arguments": {"seconds": N * 0.03 + 0.3}},
            },
        )
        await sleep.read()
        last = [e.id for e in second if e.id][-1]
        after = await http.get(gw.mcp_url, headers={**headers, "Last-Event-ID": last})
        third, ended = await read_events(after)
        assert ended
        messages = [json.loads(e.data) for e in first + second + third if e.data]
    _check_exactly_once(messages)


async def test_elicitation_and_sampling_answered_across_polling_closes(gateway):
    """The server's requests arrive on resumed connections; the client answers by POST."""
    asked: list[str] = []

    async def on_elicit(context: Any, params: Any) -> ElicitResult:
        asked.append("elicitation")
        return ElicitResult(action="accept", content={"response": "yes"})

    async def on_sample(context: Any, params: Any) -> CreateMessageResult:
        asked.append("sampling")
        return CreateMessageResult(
            role="assistant",
            content=TextContent(type="text", text="Paris"),
            model="test-model",
        )

    async with (
        example_upstream() as upstream_url,
        gateway(upstream_url, sse={"poll_after_ms": 0}) as gw,
        streamable_http_client(gw.mcp_url) as (read, write),
        ClientSession(
            read, write, elicitation_callback=on_elicit, sampling_callback=on_sample
        ) as session,
    ):
        await session.initialize()
        elicited = await asyncio.wait_for(
            session.call_tool("test_elicitation", {"message": "Proceed?"}), 30
        )
        sampled = await asyncio.wait_for(
            session.call_tool("test_sampling", {"prompt": "Capital of France?"}), 30
        )
    assert asked == ["elicitation", "sampling"]
    assert elicited.content[0].text == 'User response: action=accept, content={"response":"yes"}'
    assert sampled.content[0].text == "LLM response: Paris"
