"""Slow is not down (DESIGN D7), against a real redis-server and the real example server.

* Redis answers every command, late (a latency proxy in front of it), under a burst of calls
  whose store work takes several such round trips each: no call gets 503, every call completes,
  every stream replays in full. (That a wait longer than the stall timeout is no outage is
  shown at the store, deterministically: ``tests/store/test_redis_batches.py``.)
* Redis is frozen (SIGSTOP): within the stall timeout new calls and resumes get 503 +
  ``Retry-After``, the connected client keeps receiving (D4), and after SIGCONT the gateway
  serves again by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from typing import Any

import aiohttp
import pytest

from mcp_sse_gateway.example.process import example_upstream
from mcp_sse_gateway.metrics import Metrics
from mcp_sse_gateway.web.keys import METRICS
from tests.support.latency import latency_proxy
from tests.support.mcp_http import open_session
from tests.support.mcp_http import stream_notifications_call as _call
from tests.support.redis_keys import redis_store
from tests.support.sse_client import Event, read_events
from tests.support.sse_client import json_messages as _messages
from tests.support.waiting import eventually

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]

DEADLINE_S = 60.0
STALL_TIMEOUT_S = 1.0


def _store(url: str) -> dict[str, Any]:
    return redis_store(url, stall_timeout_s=STALL_TIMEOUT_S)


def _indexes(events: list[Event]) -> list[int]:
    return [m["params"]["data"]["index"] for m in _messages(events) if m.get("method")]


def _waits_over(metrics: Metrics, seconds: float) -> int:
    """Store calls that waited in the queue longer than *seconds* (from the histogram)."""
    text = metrics.render().decode()
    over = 0
    for operation in set(re.findall(r'queue_wait_seconds_count\{operation="(\w+)"\}', text)):
        count = float(
            re.search(rf'queue_wait_seconds_count\{{operation="{operation}"\}} (\S+)', text)[1]
        )
        within = float(
            re.search(
                rf'queue_wait_seconds_bucket\{{le="{seconds}",operation="{operation}"\}} (\S+)',
                text,
            )[1]
        )
        over += int(count - within)
    return over


async def test_a_slow_redis_is_waited_for_no_call_refused_no_event_lost(gateway, private_redis):
    sessions, calls_per_session, count = 10, 10, 3
    async with (
        latency_proxy(private_redis.port, delay_s=0.1) as slow,
        example_upstream() as upstream_url,
        gateway(upstream_url, store=_store(f"redis://127.0.0.1:{slow.port}/0")) as gw,
        aiohttp.ClientSession() as http,
    ):
        headers = [await open_session(http, gw.mcp_url) for _ in range(sessions)]

        took: list[float] = []

        async def call(session: dict[str, str], request_id: int) -> tuple[int, list[Event]]:
            began = time.monotonic()
            async with http.post(
                gw.mcp_url, headers=session, json=_call(count, 0, request_id)
            ) as response:
                if response.status != 200:
                    return response.status, []
                events, ended = await read_events(response, timeout_s=DEADLINE_S)
                assert ended
                took.append(time.monotonic() - began)
                return 200, events

        results = await asyncio.gather(
            *(
                call(session, request_id)
                for session in headers
                for request_id in range(1, calls_per_session + 1)
            )
        )
        statuses = [status for status, _ in results]
        assert statuses == [200] * (sessions * calls_per_session), "a slow Redis refused calls"
        for _, events in results:
            assert _indexes(events) == list(range(count))
        print(
            f"calls took {min(took):.2f}-{max(took):.2f} s; store calls queued longer than the "
            f"stall timeout: {_waits_over(gw.app[METRICS], STALL_TIMEOUT_S)}"
        )

        # Every stream is resumable in full from its priming event.
        async def replay(session: dict[str, str], events: list[Event]) -> list[Event]:
            primed = {**session, "Last-Event-ID": events[0].id or ""}
            async with http.get(gw.mcp_url, headers=primed) as response:
                assert response.status == 200
                replayed, ended = await read_events(response, timeout_s=DEADLINE_S)
                assert ended
                return replayed

        sessions_of_calls = [s for s in headers for _ in range(calls_per_session)]
        replays = await asyncio.gather(
            *(replay(s, events) for s, (_, events) in zip(sessions_of_calls, results, strict=True))
        )
        for (_, live), replayed in zip(results, replays, strict=True):
            assert [e.data for e in replayed if e.data] == [e.data for e in live[1:] if e.data]


async def test_a_frozen_redis_is_down_within_the_stall_timeout_then_recovers(
    gateway, private_redis
):
    count = 40
    timeline: dict[str, float] = {}
    async with (
        example_upstream() as upstream_url,
        gateway(upstream_url, store=_store(private_redis.url)) as gw,
        aiohttp.ClientSession() as http,
    ):
        headers = await open_session(http, gw.mcp_url)
        running = await http.post(gw.mcp_url, headers=headers, json=_call(count, 50))
        first, _ = await read_events(running, until=4)
        cursor = first[-1].id
        assert cursor
        stopped = time.monotonic()
        os.kill(private_redis.pid, signal.SIGSTOP)
        try:
            # New work is refused within the stall timeout (plus scheduling), never a hang.
            async with http.post(gw.mcp_url, headers=headers, json=_call(1, 0, 2)) as refused:
                timeline["new call refused after"] = time.monotonic() - stopped
                assert refused.status == 503
                assert refused.headers["Retry-After"].isdigit()
            resume = {**headers, "Last-Event-ID": cursor}
            async with http.get(gw.mcp_url, headers=resume) as down:
                timeline["resume refused after"] = time.monotonic() - stopped
                assert down.status == 503
            # The connected client keeps receiving every notification (D4).
            rest, ended = await read_events(running, timeout_s=DEADLINE_S)
            assert ended
            assert _indexes(first + rest) == list(range(count))
        finally:
            os.kill(private_redis.pid, signal.SIGCONT)
        resumed = time.monotonic()

        async def serves() -> bool:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                fresh = await open_session(http, gw.mcp_url)
                async with http.post(gw.mcp_url, headers=fresh, json=_call(2, 0)) as again:
                    if again.status == 200:
                        events, ended = await read_events(again, timeout_s=DEADLINE_S)
                        return ended and _indexes(events) == [0, 1]
            return False

        await eventually(serves, timeout_s=DEADLINE_S, poll_s=0.05)
        timeline["serving again after SIGCONT"] = time.monotonic() - resumed
    print("SIGSTOP timeline (s):", {k: round(v, 3) for k, v in timeline.items()})
    assert timeline["new call refused after"] <= STALL_TIMEOUT_S + 2
    assert timeline["resume refused after"] <= STALL_TIMEOUT_S + 2
