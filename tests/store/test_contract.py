"""The event-store contract: every backend must pass these same behavioural tests (DESIGN D7)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from mcp_sse_gateway.errors import CursorGone, StoreLimitExceeded, UnknownStream
from mcp_sse_gateway.event_ids import new_life
from mcp_sse_gateway.store.memory import MemoryStore

StoreFactory = Callable[..., Any]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory"])
async def make_store(request) -> AsyncIterator[StoreFactory]:
    """``make_store(**bounds)`` builds a store of the parametrized backend; closed afterwards."""
    made: list[Any] = []

    def factory(**bounds: Any) -> Any:
        store = MemoryStore(**bounds)
        made.append(store)
        return store

    yield factory
    for store in made:
        await store.close()


async def test_append_assigns_sequential_offsets_and_read_is_exclusive(make_store):
    store = make_store()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    offsets = [await store.append("s", life, f"m{i}", None) for i in range(5)]
    assert offsets == [1, 2, 3, 4, 5]
    result = await store.read("s", life, 2, 10)
    assert [(e.offset, e.data) for e in result.events] == [(3, "m2"), (4, "m3"), (5, "m4")]
    assert not result.finished
    assert (await store.read("s", life, 0, 2)).events[-1].offset == 2
    assert (await store.read("s", life, 5, 10)).events == []


async def test_event_type_round_trips(make_store):
    store = make_store()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    await store.append("s", life, "x", "custom")
    assert (await store.read("s", life, 0, 1)).events[0].event == "custom"


async def test_finish_marks_the_end_and_reads_report_it(make_store):
    store = make_store()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    await store.append("s", life, "a", None)
    await store.append("s", life, "b", None)
    await store.finish("s", life)
    await store.finish("s", life)
    assert not (await store.read("s", life, 0, 1)).finished
    assert (await store.read("s", life, 0, 2)).finished
    assert (await store.read("s", life, 2, 2)).finished
    info = await store.stream_info("s", life)
    assert (info.first_offset, info.last_offset, info.finished) == (1, 2, True)
    assert info.kind == "request"
    assert info.owner == "r1"


async def test_streams_are_bound_to_their_session(make_store):
    store = make_store()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    await store.append("s", life, "a", None)
    with pytest.raises(UnknownStream):
        await store.read("other", life, 0, 10)
    with pytest.raises(UnknownStream):
        await store.append("other", life, "x", None)
    assert await store.stream_info("other", life) is None
    with pytest.raises(UnknownStream):
        await store.read("s", new_life(), 0, 10)


async def test_trimmed_cursor_is_gone_never_a_silent_gap(make_store):
    store = make_store(max_events_per_stream=3)
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    for i in range(5):
        await store.append("s", life, f"m{i}", None)
    info = await store.stream_info("s", life)
    assert (info.first_offset, info.last_offset) == (3, 5)
    with pytest.raises(CursorGone):
        await store.read("s", life, 1, 10)
    assert [e.offset for e in (await store.read("s", life, 2, 10)).events] == [3, 4, 5]
    with pytest.raises(CursorGone):
        await store.read("s", life, 6, 10)


async def test_wait_wakes_on_append_and_times_out_otherwise(make_store):
    store = make_store()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    assert await store.wait("s", life, 0, 0.01) is False
    waiter = asyncio.create_task(store.wait("s", life, 0, 10))
    await asyncio.sleep(0)
    assert not waiter.done()
    await store.append("s", life, "a", None)
    assert await asyncio.wait_for(waiter, 5) is True
    assert await store.wait("s", life, 0, 10) is True  # already past the cursor


async def test_wait_wakes_on_finish(make_store):
    store = make_store()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    waiter = asyncio.create_task(store.wait("s", life, 0, 10))
    await asyncio.sleep(0)
    await store.finish("s", life)
    assert await asyncio.wait_for(waiter, 5) is True


async def test_many_waiters_one_append(make_store):
    store = make_store()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    waiters = [asyncio.create_task(store.wait("s", life, 0, 10)) for _ in range(200)]
    await asyncio.sleep(0)
    await store.append("s", life, "a", None)
    assert await asyncio.wait_for(asyncio.gather(*waiters), 5) == [True] * 200


async def test_streams_per_session_bound_evicts_finished_first(make_store):
    store = make_store(max_streams_per_session=2)
    first, second, third = new_life(), new_life(), new_life()
    await store.create_stream("s", first, kind="request", owner="r1")
    await store.create_stream("s", second, kind="request", owner="r1")
    with pytest.raises(StoreLimitExceeded):
        await store.create_stream("s", third, kind="request", owner="r1")
    await store.finish("s", first)
    await store.create_stream("s", third, kind="request", owner="r1")
    assert await store.stream_info("s", first) is None
    assert await store.stream_info("s", second) is not None
    await store.create_stream("other", new_life(), kind="request", owner="r1")


async def test_finished_stream_expires_after_its_grace_period():
    clock = Clock()
    store = MemoryStore(finished_stream_ttl_s=10, clock=clock)
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    await store.append("s", life, "a", None)
    await store.finish("s", life)
    clock.now += 9
    assert (await store.read("s", life, 0, 10)).finished
    clock.now += 2
    with pytest.raises(UnknownStream):
        await store.read("s", life, 0, 10)


async def test_memory_cap_evicts_finished_streams_then_trims(make_store):
    store = make_store(max_bytes=10_000)
    done, live = new_life(), new_life()
    await store.create_stream("s", done, kind="request", owner="r1")
    await store.append("s", done, "x" * 4000, None)
    await store.finish("s", done)
    await store.create_stream("s", live, kind="request", owner="r1")
    await store.append("s", live, "y" * 4000, None)
    await store.append("s", live, "z" * 4000, None)
    assert await store.stream_info("s", done) is None
    assert store.stored_bytes <= 10_000
    for _ in range(5):
        await store.append("s", live, "w" * 4000, None)
    assert store.stored_bytes <= 10_000
    info = await store.stream_info("s", live)
    assert info.first_offset > 1
    with pytest.raises(CursorGone):
        await store.read("s", live, 0, 10)


async def test_purge_and_tombstone_drop_every_stream(make_store):
    store = make_store()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    await store.append("s", life, "a", None)
    await store.tombstone_session("s")
    assert await store.stream_info("s", life) is None
    assert (await store.get_session("s")).deleted
    await store.purge_session("s")
    assert store.stored_bytes == 0


async def test_session_refresh_flag(make_store):
    clock = Clock()
    store = MemoryStore(session_idle_ttl_s=10, clock=clock)
    await store.record_session("s", "2025-11-25")
    clock.now += 8
    assert await store.get_session("s", refresh=False) is not None
    clock.now += 3
    assert await store.get_session("s") is None


async def test_drop_stream_forgets_one_life(make_store):
    store = make_store()
    kept, dropped = new_life(), new_life()
    await store.create_stream("s", kept, kind="request", owner="r1")
    await store.create_stream("s", dropped, kind="request", owner="r1")
    await store.append("s", dropped, "a", None)
    await store.drop_stream("s", dropped)
    await store.drop_stream("s", dropped)
    await store.drop_stream("other", kept)
    assert await store.stream_info("s", dropped) is None
    assert await store.stream_info("s", kept) is not None
