"""Graceful drain on SIGTERM (DESIGN D8) of a real ``mcp-sse-gateway serve`` process."""

from __future__ import annotations

import signal

import aiohttp
import pytest

from mcp_sse_gateway.example.process import example_upstream
from tests.support.gateway_process import gateway_env, gateway_process, serve_command
from tests.support.mcp_http import open_session
from tests.support.ports import free_port
from tests.support.sse_client import json_messages, read_events
from tests.support.waiting import eventually, until_status

pytestmark = pytest.mark.timeout(90)


async def test_sigterm_drains_readiness_connections_then_pumps():
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = gateway_env(MCP_SSE_GATEWAY_SERVER__DRAIN_TIMEOUT_S="20")
    async with (
        example_upstream() as upstream_url,
        aiohttp.ClientSession() as http,
        gateway_process(
            serve_command(upstream_url, port),
            env=env,
            ready_url=base + "/readyz",
            ready_timeout_s=30,
            http=http,
            poll_s=0,
        ) as gateway,
    ):
        session = await open_session(http, base + "/mcp")
        call = await http.post(
            base + "/mcp",
            headers=session,
            json={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "sleep", "arguments": {"seconds": 3}},
            },
        )
        priming, _ = await read_events(call, until=1)
        gateway.send_signal(signal.SIGTERM)

        # Still listening, no longer ready: load balancers move new requests elsewhere.
        await until_status(base + "/readyz", 503, timeout_s=10, http=http, poll_s=0)
        # The client's connection is closed on purpose, with retry, before the call ends.
        rest, ended = await read_events(call, timeout_s=10)
        assert ended
        assert rest[-1].retry is not None
        assert not [e for e in rest if e.data]
        # The pump runs on: the client resumes (here, on the draining replica itself).
        resumed = await http.get(base + "/mcp", headers={**session, "Last-Event-ID": priming[0].id})
        events, _ = await read_events(resumed, timeout_s=15)
        answers = json_messages(events)
        assert answers[-1]["result"]["content"][0]["text"] == "slept 3 s"
        await eventually(lambda: gateway.returncode is not None, timeout_s=30)
        assert gateway.returncode == 0
