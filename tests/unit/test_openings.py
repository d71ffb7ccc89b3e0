"""New streams open a few at a time; an opening holds its place only briefly."""

from __future__ import annotations

import asyncio

from mcp_sse_gateway.streams.openings import Openings
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
