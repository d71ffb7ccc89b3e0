"""The Redis store's call queue: slow is waited for, stalled is down (DESIGN D7). No sockets."""

from __future__ import annotations

import asyncio

import pytest
import redis
import structlog

from mcp_sse_gateway.errors import StoreBusy, StoreUnavailable
from mcp_sse_gateway.store.redis import calls as calls_module
from mcp_sse_gateway.store.redis.calls import LIVENESS, NEW, RUNNING, Calls
from tests.support.waiting import eventually

DEADLINE_S = 10.0


class Gate:
    """Stands in for Redis: each call blocks until opened (or fails as told)."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.order: list[str] = []

    async def run(self, calls: Calls, name: str, priority: int) -> str:
        async with calls.call(name, priority):
            self.order.append(name)
            await self.opened.wait()
        return name


async def test_a_long_queue_is_waited_for_however_long_it_takes():
    waits: list[float] = []
    # Each round trip takes TURN_S, far below the stall timeout (a collector pause or a busy
    # machine must not pass for a stall), and the queue's last calls wait 24 turns, far above.
    stall_s, turn_s = 0.25, 0.02
    calls = Calls(
        2, "", stall_timeout_s=stall_s, on_queue_wait=lambda _op, seconds: waits.append(seconds)
    )
    gate = Gate()
    tasks = [asyncio.create_task(gate.run(calls, f"c{i}", RUNNING)) for i in range(50)]
    # Redis answers each pair of calls in flight once both are there and TURN_S passed: 25 turns.
    for turn in range(25):
        await eventually(lambda t=turn: len(gate.order) == 2 * (t + 1))
        await asyncio.sleep(turn_s)  # the round trip's duration (time passing is the subject)
        gate.opened.set()
        gate.opened = asyncio.Event()
    assert await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE_S) == [
        f"c{i}" for i in range(50)
    ]
    # The last calls waited in the queue far longer than the stall timeout, and none failed.
    assert max(waits) > stall_s
    assert calls.healthy
    assert (calls.queued, calls.in_flight) == (0, 0)


async def test_liveness_then_running_streams_then_new_work():
    calls = Calls(1, "")
    gate = Gate()
    first = asyncio.create_task(gate.run(calls, "holder", RUNNING))
    await eventually(lambda: calls.in_flight == 1)
    queued = [
        asyncio.create_task(gate.run(calls, name, priority))
        for name, priority in [("new1", NEW), ("run1", RUNNING), ("beat", LIVENESS), ("new2", NEW)]
    ]
    await eventually(lambda: calls.queued == 4)
    gate.opened.set()
    await asyncio.wait_for(asyncio.gather(first, *queued), DEADLINE_S)
    assert gate.order == ["holder", "beat", "run1", "new1", "new2"]


async def test_new_work_that_waited_takes_every_other_turn(monkeypatch):
    monkeypatch.setattr(calls_module, "NEW_PROMOTED_AFTER_S", 0.0)  # every new call is aged
    calls = Calls(1, "")
    gate = Gate()
    first = asyncio.create_task(gate.run(calls, "holder", RUNNING))
    await eventually(lambda: calls.in_flight == 1)
    queued = [
        asyncio.create_task(gate.run(calls, name, priority))
        for name, priority in [
            ("run1", RUNNING),
            ("run2", RUNNING),
            ("run3", RUNNING),
            ("new1", NEW),
            ("new2", NEW),
        ]
    ]
    await eventually(lambda: calls.queued == 5)
    gate.opened.set()
    await asyncio.wait_for(asyncio.gather(first, *queued), DEADLINE_S)
    assert gate.order == ["holder", "run1", "new1", "run2", "new2", "run3"]


async def test_a_full_queue_refuses_new_work_only():
    calls = Calls(1, "", max_queued_calls=2)
    gate = Gate()
    holder = asyncio.create_task(gate.run(calls, "holder", RUNNING))
    queued = [asyncio.create_task(gate.run(calls, f"q{i}", NEW)) for i in range(2)]
    await eventually(lambda: calls.queued == 2)
    with structlog.testing.capture_logs() as logs, pytest.raises(StoreBusy):
        await gate.run(calls, "refused", NEW)
    assert [e["event"] for e in logs] == ["store.queue_full"]
    assert isinstance(StoreBusy(), StoreUnavailable)  # answered 503 + Retry-After
    running = asyncio.create_task(gate.run(calls, "append", RUNNING))  # never refused
    await eventually(lambda: calls.queued == 3)
    gate.opened.set()
    await asyncio.wait_for(asyncio.gather(holder, running, *queued), DEADLINE_S)
    assert "refused" not in gate.order
    assert "append" in gate.order
    assert calls.healthy


async def test_a_stalled_call_is_down_and_the_queue_fails_at_once():
    calls = Calls(1, "", stall_timeout_s=0.2)
    gate = Gate()  # never opened: Redis answers nothing
    stalled = asyncio.create_task(gate.run(calls, "stalled", RUNNING))
    await eventually(lambda: calls.in_flight == 1)
    queued = [asyncio.create_task(gate.run(calls, f"q{i}", RUNNING)) for i in range(20)]
    await eventually(lambda: calls.queued == 20)
    with structlog.testing.capture_logs() as logs:
        with pytest.raises(StoreUnavailable):
            await asyncio.wait_for(stalled, DEADLINE_S)
        results = await asyncio.wait_for(
            asyncio.gather(*queued, return_exceptions=True), DEADLINE_S
        )
    assert all(isinstance(r, StoreUnavailable) for r in results)
    assert gate.order == ["stalled"]  # none of the queued ones waited its own timeout
    assert [(e["event"], e["error"]) for e in logs] == [("store.redis_unavailable", "stalled")]
    assert not calls.healthy
    assert (calls.queued, calls.in_flight) == (0, 0)


async def test_while_down_one_call_tries_redis_the_others_fail_at_once_then_it_recovers():
    calls = Calls(4, "", stall_timeout_s=5)

    async def refused() -> None:
        async with calls.call("ping", LIVENESS):
            raise redis.ConnectionError("refused")

    with pytest.raises(StoreUnavailable):
        await refused()
    assert not calls.healthy
    gate = Gate()
    probe = asyncio.create_task(gate.run(calls, "probe", RUNNING))
    await eventually(lambda: calls.in_flight == 1)
    with pytest.raises(StoreUnavailable):  # a probe is in flight: no second one, no waiting
        await asyncio.wait_for(gate.run(calls, "other", RUNNING), DEADLINE_S)
    with structlog.testing.capture_logs() as logs:
        gate.opened.set()
        assert await asyncio.wait_for(probe, DEADLINE_S) == "probe"
    assert calls.healthy
    assert [e["event"] for e in logs] == ["store.redis_recovered"]
    assert await gate.run(calls, "after", NEW) == "after"


async def test_cancelled_waiters_leak_no_permit():
    calls = Calls(1, "")
    gate = Gate()
    holder = asyncio.create_task(gate.run(calls, "holder", RUNNING))
    await eventually(lambda: calls.in_flight == 1)
    waiters = [asyncio.create_task(gate.run(calls, f"w{i}", NEW)) for i in range(10)]
    await eventually(lambda: calls.queued == 10)
    for waiter in waiters[::2]:
        waiter.cancel()
    await eventually(lambda: calls.queued == 5)
    gate.opened.set()
    await asyncio.wait_for(holder, DEADLINE_S)
    done = await asyncio.gather(*waiters, return_exceptions=True)
    assert [d for d in done if isinstance(d, str)] == [f"w{i}" for i in range(1, 10, 2)]
    # Every permit came back: as many calls as permits run at once again.
    assert (calls.queued, calls.in_flight) == (0, 0)
    assert await gate.run(calls, "again", NEW) == "again"


async def test_observers_get_every_wait_and_round_trip():
    seen: list[tuple[str, str]] = []
    calls = Calls(
        1,
        "",
        on_queue_wait=lambda op, s: seen.append(("wait", op)) if s >= 0 else None,
        on_round_trip=lambda op, s: seen.append(("trip", op)) if s >= 0 else None,
    )
    gate = Gate()
    gate.opened.set()
    await gate.run(calls, "append", RUNNING)
    assert seen == [("wait", "append"), ("trip", "append")]


async def test_a_waiter_cancelled_as_the_permit_returns_strands_no_permit():
    """The holder finishes, the queued call's client goes away and a new call arrives, all in
    one turn of the event loop: the new call and every later one still get the permit."""
    calls = Calls(1, "")
    gate, late_ready = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        async with calls.call("append", RUNNING):
            await gate.wait()

    async def one() -> str:
        async with calls.call("read", RUNNING):
            return "ok"

    async def newcomer() -> str:
        late_ready.set()
        await gate.wait()  # woken in the same turn as the holder
        return await one()

    held = asyncio.create_task(holder())
    await eventually(lambda: calls.in_flight == 1)
    waiter = asyncio.create_task(one())
    await eventually(lambda: calls.queued == 1)
    late = asyncio.create_task(newcomer())
    await asyncio.wait_for(late_ready.wait(), DEADLINE_S)
    gate.set()
    waiter.cancel()
    await asyncio.wait_for(held, DEADLINE_S)
    assert await asyncio.wait_for(late, DEADLINE_S) == "ok"
    assert await asyncio.wait_for(one(), DEADLINE_S) == "ok"
    assert (calls.queued, calls.in_flight) == (0, 0)


async def test_queued_calls_failed_by_an_outage_strand_no_permit():
    calls = Calls(2, "")
    gate, late_ready = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        async with calls.call("append", RUNNING):
            await gate.wait()
            raise redis.ConnectionError("lost")

    async def one() -> str:
        try:
            async with calls.call("read", RUNNING):
                return "ok"
        except StoreUnavailable:
            return "unavailable"

    async def newcomer() -> str:
        late_ready.set()
        await gate.wait()
        return await one()

    holders = [asyncio.create_task(holder()) for _ in range(2)]
    await eventually(lambda: calls.in_flight == 2)
    queued = [asyncio.create_task(one()) for _ in range(3)]
    await eventually(lambda: calls.queued == 3)
    late = asyncio.create_task(newcomer())
    await asyncio.wait_for(late_ready.wait(), DEADLINE_S)
    gate.set()
    assert await asyncio.wait_for(asyncio.gather(*queued), DEADLINE_S) == ["unavailable"] * 3
    await asyncio.gather(*holders, return_exceptions=True)
    # The newcomer either probed Redis (and succeeded: the store is back) or failed fast.
    assert await asyncio.wait_for(late, DEADLINE_S) in ("ok", "unavailable")
    assert await asyncio.wait_for(one(), DEADLINE_S) == "ok"
    assert calls.healthy
    assert (calls.queued, calls.in_flight) == (0, 0)


async def test_an_error_reply_fails_that_call_only():
    """Out of memory, a read-only replica, TRYAGAIN: Redis is reachable, so no outage mode."""
    calls = Calls(2, "")
    gate = Gate()
    holder = asyncio.create_task(gate.run(calls, "append", RUNNING))
    await eventually(lambda: calls.in_flight == 1)
    with pytest.raises(StoreUnavailable):
        async with calls.call("append", RUNNING):
            raise redis.exceptions.OutOfMemoryError("OOM command not allowed")
    assert calls.healthy
    gate.opened.set()
    assert await asyncio.wait_for(holder, DEADLINE_S) == "append"
    assert await gate.run(calls, "next", RUNNING) == "next"
