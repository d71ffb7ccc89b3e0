"""Redis outages and dead replicas, against a real redis-server and the real example server.

* Redis stops mid-stream: the connected client keeps receiving (the new events without ids),
  resumes while Redis is down get 503 + Retry-After, and once Redis is back (empty: no
  persistence) resumes across the gap get 400 and new calls work again without a restart.
* Redis refuses writes mid-stream (out of memory) but keeps its data: the same for the client,
  and the stream life is dropped once Redis takes writes again, so a resume gets 400 rather
  than a silent gap.
* A gateway process is killed (SIGKILL) mid-call and started again: the resuming client gets
  the JSON-RPC error of its request (code -32003) exactly once, then the end of the stream,
  never a hang (DESIGN D7, pump liveness).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from mcp_sse_gateway import jsonrpc
from mcp_sse_gateway.example.process import example_upstream
from tests.conftest import TEST_DIGEST_KEY
from tests.support.gateway_process import gateway_env, gateway_process, serve_command
from tests.support.mcp_http import open_session
from tests.support.mcp_http import stream_notifications_call as _call
from tests.support.ports import free_port
from tests.support.redis_keys import redis_store
from tests.support.sse_client import json_messages as _messages
from tests.support.sse_client import read_events
from tests.support.waiting import until_status

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

#: Every condition below is met within this many seconds, or the test fails.
DEADLINE_S = 30.0


def _indexes(messages: list[dict[str, Any]]) -> list[int]:
    return [m["params"]["data"]["index"] for m in messages if m.get("method")]


async def test_redis_stops_mid_stream_client_keeps_receiving_then_gateway_recovers(
    gateway, private_redis
):
    count = 30
    async with (
        example_upstream() as upstream_url,
        gateway(
            upstream_url, store=redis_store(private_redis.url), server={"max_body_bytes": 4096}
        ) as gw,
        aiohttp.ClientSession() as http,
    ):
        headers = await open_session(http, gw.mcp_url)
        call = await http.post(gw.mcp_url, headers=headers, json=_call(count, 60))
        assert call.status == 200
        first, _ = await read_events(call, until=4)  # priming + 3 notifications, with ids
        assert all(e.id for e in first)
        private_redis.stop()
        rest, ended = await read_events(call, timeout_s=DEADLINE_S)
        assert ended
        messages = _messages(first + rest)
        assert _indexes(messages) == list(range(count)), "a notification was lost or repeated"
        results = [m for m in messages if m.get("id") == 1]
        assert len(results) == 1
        assert "result" in results[0]
        # Events the store never held carry no id (WHATWG: the client's last id stays put).
        assert any(e.data and e.id is None for e in rest)
        last_id = next(e.id for e in reversed(first + rest) if e.id)

        # While Redis is down: 503 + Retry-After and a JSON-RPC error body, never a hang.
        resume = {**headers, "Last-Event-ID": last_id}
        async with http.get(gw.mcp_url, headers=resume) as down:
            assert down.status == 503
            assert down.headers["Retry-After"].isdigit()
            assert (await down.json())["error"]["code"] == jsonrpc.UPSTREAM_UNAVAILABLE
        # A call whose session the store cannot be asked about: its 503 carries its own id.
        unseen = {**headers, "Mcp-Session-Id": "unseen-session-0123456789abcdef"}
        async with http.post(gw.mcp_url, headers=unseen, json=_call(1, 0, 41)) as refused:
            assert refused.status == 503
            assert (await refused.json())["id"] == 41
        # ... read as it would have been with the store up: a body over the bound gets 413.
        big = {**_call(1, 0, 42), "padding": "x" * 5000}
        async with http.post(gw.mcp_url, headers=unseen, json=big) as too_large:
            assert too_large.status == 413
        # Still ready (every replica shares the outage), and says why the store is not used.
        async with http.get(gw.base_url + "/readyz") as ready:
            assert ready.status == 200
            assert await ready.json() == {"status": "ready", "store": "unavailable"}

        # Redis returns empty (no persistence): the gap is reported, not skipped.
        private_redis.start()
        await until_status(
            gw.mcp_url, 400, timeout_s=DEADLINE_S, http=http, headers=resume, retry_errors=False
        )

        # The gateway recovered by itself: a new session streams with ids again.
        headers2 = await open_session(http, gw.mcp_url)
        again = await http.post(gw.mcp_url, headers=headers2, json=_call(3, 0))
        events, ended = await read_events(again, timeout_s=DEADLINE_S)
        assert ended
        assert _indexes(_messages(events)) == [0, 1, 2]
        assert all(e.id for e in events if e.data)


async def test_redis_refusing_writes_mid_stream_drops_the_life_so_resumes_get_400(
    gateway, private_redis
):
    count = 30
    admin = aioredis.Redis.from_url(private_redis.url)
    try:
        async with (
            example_upstream() as upstream_url,
            gateway(upstream_url, store=redis_store(private_redis.url)) as gw,
            aiohttp.ClientSession() as http,
        ):
            headers = await open_session(http, gw.mcp_url)
            call = await http.post(gw.mcp_url, headers=headers, json=_call(count, 60))
            first, _ = await read_events(call, until=4)
            cursor = first[-1].id
            assert cursor
            # Writes now fail with OOM; reads and deletes still work; the data stays.
            await admin.config_set("maxmemory-policy", "noeviction")
            await admin.config_set("maxmemory", "1")
            rest, ended = await read_events(call, timeout_s=DEADLINE_S)
            assert ended
            messages = _messages(first + rest)
            assert _indexes(messages) == list(range(count))
            assert [m["id"] for m in messages if "id" in m and "method" not in m] == [1]
            await admin.config_set("maxmemory", "0")
            # Events after the cursor were never stored: the resume must not skip them silently.
            await until_status(
                gw.mcp_url,
                400,
                timeout_s=DEADLINE_S,
                http=http,
                headers={**headers, "Last-Event-ID": cursor},
                retry_errors=False,
            )
    finally:
        with contextlib.suppress(Exception):
            await admin.config_set("maxmemory", "0")
        await admin.aclose()


# A gateway process killed mid-call ------------------------------------------------------------


def _gateway_process(
    upstream_url: str, port: int, redis_url: str, prefix: str
) -> contextlib.AbstractAsyncContextManager[asyncio.subprocess.Process]:
    """``mcp-sse-gateway serve`` as a process on *port*, on Redis, ready when yielded."""
    env = gateway_env(
        MCP_SSE_GATEWAY_STORE__BACKEND="redis",
        MCP_SSE_GATEWAY_STORE__REDIS_URL=redis_url,
        MCP_SSE_GATEWAY_STORE__KEY_PREFIX=prefix,
        MCP_SSE_GATEWAY_AUTH__DIGEST_KEY=TEST_DIGEST_KEY,
        MCP_SSE_GATEWAY_STORE__HEARTBEAT_S="0.2",
        MCP_SSE_GATEWAY_STORE__HEARTBEAT_EXPIRY_S="1",
        MCP_SSE_GATEWAY_SSE__KEEPALIVE_S="0.5",
    )
    return gateway_process(
        serve_command(upstream_url, port),
        env=env,
        ready_url=f"http://127.0.0.1:{port}/readyz",
        ready_timeout_s=DEADLINE_S,
    )


async def test_killed_gateway_restarted_resuming_client_gets_the_error_once(private_redis):
    port, prefix = free_port(), uuid.uuid4().hex
    url = f"http://127.0.0.1:{port}/mcp"
    async with example_upstream() as upstream_url, aiohttp.ClientSession() as http:
        async with _gateway_process(upstream_url, port, private_redis.url, prefix) as first_run:
            headers = await open_session(http, url)
            call = await http.post(url, headers=headers, json=_call(1000, 50, request_id=7))
            first, _ = await read_events(call, until=4)
            first_run.send_signal(signal.SIGKILL)
            await first_run.wait()
        cursor = first[-1].id
        assert cursor
        async with _gateway_process(upstream_url, port, private_redis.url, prefix):
            resumed = await http.get(url, headers={**headers, "Last-Event-ID": cursor})
            assert resumed.status == 200
            rest, ended = await read_events(resumed, timeout_s=DEADLINE_S)
            assert ended, "the resumed stream must end, not hang"
            answers = [m for m in _messages(rest) if m.get("id") == 7]
            assert len(answers) == 1
            assert answers[0]["error"]["code"] == jsonrpc.UPSTREAM_STREAM_BROKEN
            indexes = _indexes(_messages(first + rest))
            assert indexes == list(range(len(indexes))), "stored notifications were skipped"
            # The stream is finished: nothing follows its last event.
            last = next(e.id for e in reversed(rest) if e.id)
            end = await http.get(url, headers={**headers, "Last-Event-ID": last})
            assert end.status == 204
