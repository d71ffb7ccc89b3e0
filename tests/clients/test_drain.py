"""Graceful drain on SIGTERM (DESIGN D8) of a real ``mcp-sse-gateway serve`` process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys

import aiohttp
import pytest

from mcp_sse_gateway.example.process import example_upstream
from tests.support.mcp_http import open_session
from tests.support.sse_client import read_events
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(90)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def _status(http: aiohttp.ClientSession, url: str) -> int | None:
    try:
        async with http.get(url) as response:
            return response.status
    except aiohttp.ClientError:
        return None


async def test_sigterm_drains_readiness_connections_then_pumps():
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_SSE_GATEWAY_")}
    env["MCP_SSE_GATEWAY_SERVER__DRAIN_TIMEOUT_S"] = "20"
    async with example_upstream() as upstream_url, aiohttp.ClientSession() as http:
        gateway = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "mcp_sse_gateway",
            "serve",
            "--upstream",
            upstream_url,
            "--port",
            str(port),
            env=env,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            ready_flags: list[int | None] = []

            async def ready() -> None:
                ready_flags.append(await _status(http, base + "/readyz"))

            async with asyncio.timeout(30):
                while not ready_flags or ready_flags[-1] != 200:
                    await ready()
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
            readiness: list[int | None] = []

            async def probe() -> bool:
                readiness.append(await _status(http, base + "/readyz"))
                return readiness[-1] == 503

            async with asyncio.timeout(10):
                while not await probe():
                    pass
            # The client's connection is closed on purpose, with retry, before the call ends.
            rest, ended = await read_events(call, timeout_s=10)
            assert ended
            assert rest[-1].retry is not None
            assert not [e for e in rest if e.data]
            # The pump runs on: the client resumes (here, on the draining replica itself).
            resumed = await http.get(
                base + "/mcp", headers={**session, "Last-Event-ID": priming[0].id}
            )
            events, _ = await read_events(resumed, timeout_s=15)
            answers = [json.loads(e.data) for e in events if e.data]
            assert answers[-1]["result"]["content"][0]["text"] == "slept 3 s"
            await eventually(lambda: gateway.returncode is not None, timeout_s=30)
            assert gateway.returncode == 0
        finally:
            if gateway.returncode is None:
                gateway.kill()
            await gateway.wait()
