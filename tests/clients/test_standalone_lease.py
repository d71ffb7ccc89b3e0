"""One standalone stream per session across replicas (DESIGN D5), with real processes.

Two gateway replicas on a real redis-server, in front of the real example server (no event
store) through a relay that counts the upstream GETs open per session
(:mod:`tests.support.counting_proxy`):

* a newer plain GET on the other replica attaches there; the older connection is closed with
  ``retry`` within a second; the upstream never has two GETs of the session open, and what
  the server sends next reaches the newer connection, once;
* the lease's holder is SIGKILLed: the replica whose client stays attached takes the lease
  over and opens the upstream GET within the lease TTL plus one renewal period;
* a GET with ``Last-Event-ID`` on the other replica replays from its cursor, then tails: every
  notification arrives once, none at or before the cursor.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from mcp_sse_gateway.example.process import example_upstream
from tests.conftest import TEST_DIGEST_KEY
from tests.support.counting_proxy import CountingProxy
from tests.support.gateway_process import gateway_env, gateway_process, serve_command
from tests.support.mcp_http import open_session
from tests.support.ports import free_port
from tests.support.sse_client import Event, parse

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

DEADLINE_S = 30.0
LEASE_TTL_S = 1.5
RENEWAL_S = LEASE_TTL_S / 3
#: Beyond the bound itself: the example server noticing a dropped connection, scheduling.
SLACK_S = 0.5
SSE = {"Accept": "text/event-stream"}


@contextlib.asynccontextmanager
async def _replica(
    upstream_url: str, redis_url: str, prefix: str, lease_ttl_s: float = LEASE_TTL_S
) -> AsyncIterator[Any]:
    port = free_port()
    env = gateway_env(
        MCP_SSE_GATEWAY_STORE__BACKEND="redis",
        MCP_SSE_GATEWAY_STORE__REDIS_URL=redis_url,
        MCP_SSE_GATEWAY_STORE__KEY_PREFIX=prefix,
        MCP_SSE_GATEWAY_STORE__LEASE_TTL_S=str(lease_ttl_s),
        # Drain: connections closed over a quarter of this (0.5 s), then the pumps stop.
        MCP_SSE_GATEWAY_SERVER__DRAIN_TIMEOUT_S="2",
        MCP_SSE_GATEWAY_STORE__HEARTBEAT_S="0.2",
        MCP_SSE_GATEWAY_STORE__HEARTBEAT_EXPIRY_S="1",
        MCP_SSE_GATEWAY_AUTH__DIGEST_KEY=TEST_DIGEST_KEY,
        MCP_SSE_GATEWAY_SSE__KEEPALIVE_S="0.5",
    )
    async with gateway_process(
        serve_command(upstream_url, port),
        env=env,
        ready_url=f"http://127.0.0.1:{port}/readyz",
        ready_timeout_s=DEADLINE_S,
    ) as process:
        process.mcp_url = f"http://127.0.0.1:{port}/mcp"
        yield process


@contextlib.asynccontextmanager
async def _setup(
    private_redis: Any, lease_ttl_s: float = LEASE_TTL_S
) -> AsyncIterator[tuple[CountingProxy, Any, Any]]:
    prefix = uuid.uuid4().hex
    async with (
        example_upstream() as upstream_url,
        CountingProxy(upstream_url).running() as proxy,
        _replica(proxy.url, private_redis.url, prefix, lease_ttl_s) as a,
        _replica(proxy.url, private_redis.url, prefix, lease_ttl_s) as b,
    ):
        yield proxy, a, b


class _Stream:
    """A client GET stream read in the background: its events, and when it ended."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.events: list[Event] = []
        self.ended_at: float | None = None
        self._news = asyncio.Event()
        self._task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        wire = b""
        with contextlib.suppress(aiohttp.ClientError):
            async for chunk in self.response.content.iter_any():
                wire += chunk
                complete = wire[: wire.rfind(b"\n\n") + 2] if b"\n\n" in wire else b""
                self.events = parse(complete)
                self._news.set()
        self.ended_at = time.monotonic()
        self._news.set()

    def notifications(self) -> list[tuple[int, int]]:
        """``(count, index)`` of each ``stream_notifications`` notification received."""
        import json

        out = []
        for event in self.events:
            if event.data:
                message = json.loads(event.data)
                if message.get("method") == "notifications/message":
                    data = message["params"]["data"]
                    out.append((data["count"], data["index"]))
        return out

    async def until(self, condition: Any, timeout_s: float = DEADLINE_S) -> None:
        async with asyncio.timeout(timeout_s):
            while not condition():
                self._news.clear()
                await self._news.wait()

    def close(self) -> None:
        self._task.cancel()
        self.response.close()


async def _get(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> _Stream:
    response = await http.get(url, headers={**headers, **SSE})
    assert response.status == 200, response.status
    return _Stream(response)


async def _notify(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], count: int, rid: int
) -> None:
    """Have the server send *count* log notifications on the session's standalone stream."""
    call = {
        "jsonrpc": "2.0",
        "id": rid,
        "method": "tools/call",
        "params": {
            "name": "stream_notifications",
            "arguments": {"count": count, "interval_ms": 20, "standalone": True},
        },
    }
    async with http.post(url, headers=headers, json=call) as response:
        assert response.status == 200
        await response.read()


async def _stop_holder(
    http: aiohttp.ClientSession, proxy: CountingProxy, a: Any, b: Any, signum: int
) -> tuple[dict[str, str], str, _Stream, float]:
    """A's GET holds the session's upstream GET, B's client stays; stop A with *signum*.

    Returns:
        The session's headers, its id, B's stream, and the seconds from the signal until the
        upstream saw the takeover's GET.
    """
    headers = await open_session(http, a.mcp_url)
    session = headers["Mcp-Session-Id"]
    holder = await _get(http, a.mcp_url, headers)
    await proxy.wait(lambda: proxy.gets(session).open == 1, DEADLINE_S)
    stayer = await _get(http, b.mcp_url, headers)
    await holder.until(lambda: holder.ended_at is not None)
    a.send_signal(signum)
    stopped = time.monotonic()
    await proxy.wait(lambda: len(proxy.gets(session).opened_at) == 2, DEADLINE_S)
    return headers, session, stayer, proxy.gets(session).opened_at[1] - stopped


async def test_a_newer_plain_get_on_another_replica_wins_and_the_upstream_keeps_one_get(
    private_redis,
):
    async with _setup(private_redis) as (proxy, a, b), aiohttp.ClientSession() as http:
        headers = await open_session(http, a.mcp_url)
        session = headers["Mcp-Session-Id"]
        older = await _get(http, a.mcp_url, headers)
        await proxy.wait(lambda: proxy.gets(session).open == 1, DEADLINE_S)
        newer = await _get(http, b.mcp_url, headers)  # 200, not the upstream's 409
        attached = time.monotonic()
        await older.until(lambda: older.ended_at is not None)
        assert older.ended_at is not None
        assert older.ended_at - attached < 1.0, "the older connection must close within 1 s"
        assert older.events[-1].retry is not None, "closed with retry"

        await _notify(http, b.mcp_url, headers, 5, rid=2)
        await newer.until(lambda: len(newer.notifications()) >= 5)
        assert newer.notifications() == [(5, i) for i in range(5)]
        await _notify(http, a.mcp_url, headers, 3, rid=3)
        await newer.until(lambda: len(newer.notifications()) >= 8)
        assert newer.notifications()[5:] == [(3, i) for i in range(3)]
        gets = proxy.gets(session)
        assert gets.most == 1, "two upstream GETs of one session were open at once"
        assert len(gets.opened_at) == 1  # the holder kept its GET while the client moved
        newer.close()


async def test_a_killed_holder_is_taken_over_within_the_lease_ttl_plus_a_renewal(
    private_redis,
):
    async with _setup(private_redis) as (proxy, a, b), aiohttp.ClientSession() as http:
        headers, session, stayer, takeover_s = await _stop_holder(http, proxy, a, b, signal.SIGKILL)
        print(f"\ntakeover after SIGKILL: {takeover_s:.2f} s (lease TTL {LEASE_TTL_S} s)")
        assert takeover_s <= LEASE_TTL_S + RENEWAL_S + SLACK_S, f"takeover took {takeover_s:.2f} s"
        gets = proxy.gets(session)
        assert gets.most == 1
        assert gets.closed_at[0] <= gets.opened_at[1]  # the killed holder's GET closed first

        await _notify(http, b.mcp_url, headers, 4, rid=2)
        await stayer.until(lambda: len(stayer.notifications()) >= 4)
        assert stayer.notifications() == [(4, i) for i in range(4)]
        assert stayer.ended_at is None, "the attached client stayed through the takeover"
        stayer.close()


async def test_a_resume_on_another_replica_replays_from_its_cursor_then_tails_once(
    private_redis,
):
    async with _setup(private_redis) as (proxy, a, b), aiohttp.ClientSession() as http:
        headers = await open_session(http, a.mcp_url)
        session = headers["Mcp-Session-Id"]
        first = await _get(http, a.mcp_url, headers)
        await proxy.wait(lambda: proxy.gets(session).open == 1, DEADLINE_S)
        await _notify(http, a.mcp_url, headers, 3, rid=2)
        await first.until(lambda: len(first.notifications()) >= 3)
        seen = [e for e in first.events if e.data]
        cursor = seen[1].id  # the client saw index 1 last, say
        assert cursor
        # Notifications go on while the client reconnects, on the other replica.
        emitting = asyncio.ensure_future(_notify(http, a.mcp_url, headers, 5, rid=3))
        resumed = await _get(http, b.mcp_url, {**headers, "Last-Event-ID": cursor})
        await emitting
        await resumed.until(lambda: len(resumed.notifications()) >= 6)
        assert resumed.notifications() == [(3, 2), *[(5, i) for i in range(5)]]
        assert all(e.id != cursor for e in resumed.events if e.data)
        await first.until(lambda: first.ended_at is not None)  # the older one was replaced
        assert proxy.gets(session).most == 1
        resumed.close()


async def test_a_draining_holder_releases_the_lease_and_is_taken_over_before_it_expires(
    private_redis,
):
    lease_ttl_s = 6.0  # long: a takeover before it could expire shows the lease was released
    async with (
        _setup(private_redis, lease_ttl_s) as (proxy, a, b),
        aiohttp.ClientSession() as http,
    ):
        headers, session, stayer, takeover_s = await _stop_holder(http, proxy, a, b, signal.SIGTERM)
        print(f"\ntakeover after a drain: {takeover_s:.2f} s (lease TTL {lease_ttl_s} s)")
        # The drain's spread (0.5 s), then the release; one renewal period of the stand-by.
        assert takeover_s <= 0.5 + lease_ttl_s / 3 + SLACK_S
        assert proxy.gets(session).most == 1
        await _notify(http, b.mcp_url, headers, 2, rid=2)
        await stayer.until(lambda: len(stayer.notifications()) >= 2)
        assert stayer.notifications() == [(2, 0), (2, 1)]
        stayer.close()
