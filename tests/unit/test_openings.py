"""New streams open a few at a time; an opening holds its place only briefly, and counts toward
the pump bound while it is under way."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mcp_sse_gateway.config import Settings
from mcp_sse_gateway.errors import GatewayBusy
from mcp_sse_gateway.store.memory import MemoryStore
from mcp_sse_gateway.streams.openings import Openings
from mcp_sse_gateway.streams.upstream import UpstreamCall
from tests.support.fake_upstream import URL_, ScriptedResponse, ScriptedUpstream
from tests.support.streams import make_streams
from tests.support.waiting import eventually


async def test_openings_beyond_the_limit_wait_their_turn_in_order():
    openings = Openings(2, hold_s=60)
    first, second = await openings.enter(), await openings.enter()
    admitted: list[int] = []

    async def later(n: int) -> None:
        release = await openings.enter()
        admitted.append(n)
        release()

    waiters = [asyncio.create_task(later(n)) for n in range(3)]
    await eventually(lambda: all(not w.done() for w in waiters))
    assert admitted == []
    first()
    first()  # idempotent: gives back one place only
    await eventually(lambda: admitted == [0, 1, 2])
    second()
    await asyncio.gather(*waiters)


async def test_an_opening_gives_its_place_back_after_the_hold():
    openings = Openings(1, hold_s=0.05)
    await openings.enter()  # never released by its caller
    release = await asyncio.wait_for(openings.enter(), 5)
    release()


async def test_a_cancelled_wait_takes_no_place():
    openings = Openings(1, hold_s=60)
    release = await openings.enter()
    waiter = asyncio.create_task(openings.enter())
    await eventually(lambda: not waiter.done())
    waiter.cancel()
    release()
    again = await asyncio.wait_for(openings.enter(), 5)
    again()


async def test_no_limit_never_waits():
    openings = Openings(0)
    releases = [await openings.enter() for _ in range(1000)]
    for release in releases:
        release()


class _SlowCreate(MemoryStore):
    """Holds every stream creation until the test lets it through."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()
        self.creating = 0

    async def create_stream(self, *args: Any, **kwargs: Any) -> None:
        self.creating += 1
        await self.go.wait()
        await super().create_stream(*args, **kwargs)


async def test_openings_under_way_count_toward_the_pump_bound():
    store = _SlowCreate()
    body = (b'data: {"jsonrpc":"2.0","id":1,"result":{}}\n\n',)
    upstream = ScriptedUpstream().then(*(ScriptedResponse(body=body) for _ in range(4)))
    settings = Settings(upstream={"url": str(URL_)}, server={"max_pumps": 1})
    streams = make_streams(settings, upstream, store)
    call = UpstreamCall(URL_, [])
    first = asyncio.create_task(streams.requests.open_post("s", call, b"{}", [1]))
    await eventually(lambda: store.creating == 1)
    # The first one's pump is not spawned yet, but it is under way: no room for another.
    for _ in range(3):
        with pytest.raises(GatewayBusy):
            await streams.requests.open_post("s", call, b"{}", [1])
    store.go.set()
    response, stream = await first
    assert response is not None
    assert stream is not None
