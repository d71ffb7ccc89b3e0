"""Request handlers start a bounded number per event-loop turn, in arrival order."""

from __future__ import annotations

import asyncio

import pytest

from mcp_sse_gateway.web.admission import Admission

MAX_TURNS = 100


async def _burst(admission: Admission, count: int, admitted: list[int]) -> list[asyncio.Task[None]]:
    async def handler(n: int) -> None:
        await admission.enter()
        admitted.append(n)

    return [asyncio.create_task(handler(n)) for n in range(count)]


async def _per_turn(admitted: list[int], tasks: list[asyncio.Task[None]]) -> list[int]:
    """How many were admitted in each loop turn, until every task is done.

    This coroutine steps once per turn (``sleep(0)`` puts it at the end of the next one), so
    the growth of *admitted* between two of its steps is what one turn admitted.
    """
    counts: list[int] = []
    seen = 0
    for _ in range(MAX_TURNS):
        await asyncio.sleep(0)
        counts.append(len(admitted) - seen)
        seen = len(admitted)
        if all(task.done() for task in tasks):
            return counts
    raise AssertionError(f"not all admitted after {MAX_TURNS} turns: {admitted}")


async def test_a_burst_starts_at_most_the_bound_per_turn_in_arrival_order():
    admission = Admission(3)
    admitted: list[int] = []
    tasks = await _burst(admission, 10, admitted)
    counts = await _per_turn(admitted, tasks)
    assert admitted == list(range(10))
    assert counts[0] == 3  # the turn they arrived in: up to the bound, at once
    assert max(counts) == 3
    assert admission.waiting == 0


async def test_no_bound_starts_everything_in_the_turn_it_arrived():
    admission = Admission(0)
    admitted: list[int] = []
    tasks = await _burst(admission, 1000, admitted)
    counts = await _per_turn(admitted, tasks)
    assert counts[0] == 1000
    assert admitted == list(range(1000))


async def test_a_cancelled_wait_gives_its_place_to_the_next():
    admission = Admission(2)
    admitted: list[int] = []
    tasks = await _burst(admission, 6, admitted)
    await asyncio.sleep(0)  # the first two started, four wait
    assert admitted == [0, 1]
    assert admission.waiting == 4
    tasks[2].cancel()
    await _per_turn(admitted, [t for i, t in enumerate(tasks) if i != 2])
    assert admitted == [0, 1, 3, 4, 5]
    assert tasks[2].cancelled()
    assert admission.waiting == 0


async def test_after_a_burst_a_lone_request_starts_in_its_own_turn():
    admission = Admission(2)
    admitted: list[int] = []
    await _per_turn(admitted, await _burst(admission, 7, admitted))
    for _ in range(3):  # the bound's bookkeeping settles within a turn or two
        await asyncio.sleep(0)
    # enter() with room returns without suspending: the coroutine ends on its first step.
    step = admission.enter().__await__()
    try:
        step.send(None)
    except StopIteration:
        pass
    else:
        raise AssertionError("a request with room waited for a later turn")


async def test_arrivals_after_a_wake_start_behind_the_woken():
    admission = Admission(3)
    admitted: list[str] = []

    async def handler(name: str) -> None:
        await admission.enter()
        admitted.append(name)

    first = [asyncio.create_task(handler(f"a{n}")) for n in range(4)]
    await asyncio.sleep(0)  # a0..a2 started, a3 waits
    await asyncio.sleep(0)  # a3 woken, not yet started
    later = [asyncio.create_task(handler(f"b{n}")) for n in range(3)]
    await _per_turn(admitted, first + later)
    assert admitted == ["a0", "a1", "a2", "a3", "b0", "b1", "b2"]


async def test_waits_given_up_do_not_pile_up():
    admission = Admission(1)
    admitted: list[int] = []
    live = await _burst(admission, 100, admitted)
    await asyncio.sleep(0)
    for _ in range(50):  # clients that give up while queued, over and over
        gone = [asyncio.create_task(admission.enter()) for _ in range(20)]
        await asyncio.sleep(0)
        for task in gone:
            task.cancel()
        await asyncio.gather(*gone, return_exceptions=True)
        assert admission.waiting <= 100
        assert len(admission._waiters) <= 2 * 100 + 20
    await _per_turn(admitted, live)
    assert admitted == list(range(100))
    assert admission.waiting == 0


def test_a_negative_bound_is_refused():
    with pytest.raises(ValueError, match="per_turn"):
        Admission(-1)


def test_a_new_event_loop_starts_afresh():
    admission = Admission(2)

    async def burst() -> list[int]:
        admitted: list[int] = []
        tasks = await _burst(admission, 5, admitted)
        await asyncio.sleep(0)
        for task in tasks:
            task.cancel()
        return admitted

    asyncio.run(burst())  # left waiters and a turn behind on a loop now closed
    admitted: list[int] = []

    async def again() -> None:
        await asyncio.wait_for(_per_turn(admitted, await _burst(admission, 5, admitted)), 30)

    asyncio.run(again())
    assert admitted == list(range(5))
