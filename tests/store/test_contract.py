"""The event-store contract: every backend must pass these same behavioural tests (DESIGN D7).

``make_store`` (tests/store/conftest.py) is parametrized over ``memory``, ``fakeredis``,
``redis`` (a real server) and ``cluster`` (a loopback Redis Cluster of three masters; both marker
``redis``). Expiry is tested in real time with short TTLs and
condition waits with deadlines; the memory store's injected clock is tested on its own.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import structlog

from mcp_sse_gateway.errors import CursorGone, StoreLimitExceeded, UnknownStream
from mcp_sse_gateway.event_ids import new_life
from mcp_sse_gateway.store.memory import MemoryStore
from mcp_sse_gateway.store.memory.streams import CAP_LOG_INTERVAL_S, EVENT_OVERHEAD_BYTES
from tests.store.conftest import raises
from tests.support.waiting import eventually, parked

#: Short real TTLs (seconds) for expiry tests on every backend.
SHORT_TTL_S = 0.3


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


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


async def test_an_append_that_finishes_stores_the_events_then_the_end(make_store):
    store = make_store(finished_stream_ttl_s=SHORT_TTL_S)
    life, other = new_life(), new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    await store.create_stream("s", other, kind="request", owner="r1")
    waiter = asyncio.create_task(store.wait("s", life, 0, 10))
    await eventually(lambda: parked(store, 1))
    assert await store.append_many("s", life, [("a", None), ("b", "t")], finish=True) == 2
    assert await asyncio.wait_for(waiter, 5)
    read = await store.read("s", life, 0, 10)
    assert [(e.data, e.event) for e in read.events] == [("a", None), ("b", "t")]
    assert read.finished
    info = await store.stream_info("s", life)
    assert (info.first_offset, info.last_offset, info.finished) == (1, 2, True)
    await store.finish("s", life)  # a finish after it changes nothing
    assert (await store.stream_info("s", life)).last_offset == 2
    await store.append("s", other, "c", None)
    assert not (await store.read("s", other, 0, 10)).finished  # the other stream runs on
    # Finished as by finish(): replayable for its grace period, then gone.
    await eventually(lambda: raises(lambda: store.read("s", life, 0, 10), UnknownStream))


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
    await eventually(lambda: parked(store, 1))
    assert not waiter.done()
    await store.append("s", life, "a", None)
    assert await asyncio.wait_for(waiter, 5) is True
    assert await store.wait("s", life, 0, 10) is True  # already past the cursor


async def test_wait_wakes_on_finish(make_store):
    store = make_store()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    waiter = asyncio.create_task(store.wait("s", life, 0, 10))
    await eventually(lambda: parked(store, 1))
    await store.finish("s", life)
    assert await asyncio.wait_for(waiter, 5) is True


async def test_many_waiters_one_append(make_store):
    store = make_store()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    waiters = [asyncio.create_task(store.wait("s", life, 0, 10)) for _ in range(200)]
    await eventually(lambda: parked(store, 200))
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


async def test_a_long_session_at_its_bound_evicts_its_oldest_finished_streams_in_turn(make_store):
    store = make_store(max_streams_per_session=3)
    running = new_life()
    await store.create_stream("s", running, kind="request", owner="r1")  # the oldest: open
    lives = [running]
    for _ in range(6):  # each new call finds the session at its bound once it is reached
        life = new_life()
        await store.create_stream("s", life, kind="request", owner="r1")
        await store.finish("s", life)
        lives.append(life)
    kept = [life for life in lives if await store.stream_info("s", life) is not None]
    assert kept == [running, *lives[-2:]]  # the open one stays; the newest finished ones too
    for _ in range(2):  # new calls, still running, take the finished ones' places
        await store.create_stream("s", new_life(), kind="request", owner="r1")
    with pytest.raises(StoreLimitExceeded):  # then nothing finished is left to evict
        await store.create_stream("s", new_life(), kind="request", owner="r1")
    assert await store.stream_info("s", running) is not None


async def test_at_the_bound_streams_that_finished_first_go_first(make_store):
    store = make_store(max_streams_per_session=2)
    first, second = new_life(), new_life()
    await store.create_stream("s", first, kind="request", owner="r1")
    await store.create_stream("s", second, kind="request", owner="r1")
    await store.finish("s", second)
    await store.finish("s", first)  # created first, finished last: its answer is the newest
    await store.create_stream("s", new_life(), kind="request", owner="r1")
    assert await store.stream_info("s", second) is None
    assert await store.stream_info("s", first) is not None


async def test_a_long_call_that_just_finished_outlives_short_ones_that_expired(make_store):
    store = make_store(max_streams_per_session=4, finished_stream_ttl_s=SHORT_TTL_S)
    long_call = new_life()
    await store.create_stream("s", long_call, kind="request", owner="r1")
    short = [new_life() for _ in range(3)]
    for life in short:
        await store.create_stream("s", life, kind="request", owner="r1")
        await store.finish("s", life)
    for life in short:  # their answers were read long ago; their grace period ran out
        await eventually(
            lambda life=life: raises(lambda: store.read("s", life, 0, 1), UnknownStream)
        )
    await store.append("s", long_call, "answer", None)
    await store.finish("s", long_call)
    await store.create_stream("s", new_life(), kind="request", owner="r1")  # at the bound
    read = await store.read("s", long_call, 0, 10)  # its client resumes for the answer
    assert [e.data for e in read.events] == ["answer"]


async def test_finished_stream_expires_after_its_grace_period(make_store):
    store = make_store(finished_stream_ttl_s=SHORT_TTL_S)
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    await store.append("s", life, "a", None)
    await store.finish("s", life)
    assert (await store.read("s", life, 0, 10)).finished
    await eventually(lambda: raises(lambda: store.read("s", life, 0, 10), UnknownStream))
    assert await store.stream_info("s", life) is None


async def test_finished_stream_expires_after_its_grace_period_memory_clock():
    """The exact boundary, with the memory store's injected clock."""
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


async def test_memory_cap_evicts_finished_streams_then_trims():
    """Memory store only: Redis is bounded by events per stream, TTLs and its own maxmemory."""
    store = MemoryStore(max_bytes=10_000)
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


async def test_memory_cap_evicts_the_oldest_finished_stream_of_any_session_first():
    """A stream that just finished (its client may still be reading it behind the pump) is the
    last to go, whichever session holds it; not every finished stream of the first session."""
    store = MemoryStore(max_bytes=20_000)
    finished = []
    for session in ("s1", "s2", "s1", "s2"):  # finished in this order, across two sessions
        life = new_life()
        await store.create_stream(session, life, kind="request", owner="r1")
        await store.append(session, life, "x" * 4000, None)
        await store.finish(session, life)
        finished.append((session, life))
    live = new_life()
    await store.create_stream("s3", live, kind="request", owner="r1")
    await store.append("s3", live, "y" * 8000, None)  # two finished streams must go

    held = [await store.stream_info(session, life) is not None for session, life in finished]
    assert held == [False, False, True, True]
    assert store.stored_bytes <= 20_000
    assert (await store.read("s3", live, 0, 10)).events[0].data == "y" * 8000


async def test_memory_cap_evicts_streams_read_to_their_end_before_unread_ones():
    """A finished stream no read reached the end of (its client has not resumed yet) outlives
    one that finished later but was read out; a partial read does not count."""
    store = MemoryStore(max_bytes=20_000)
    unread, partly, read_out = new_life(), new_life(), new_life()
    for life in (unread, partly, read_out):  # finished in this order
        await store.create_stream("s", life, kind="request", owner="r1")
        await store.append("s", life, "x" * 2000, None)
        await store.append("s", life, "x" * 2000, None)
        await store.finish("s", life)
    assert not (await store.read("s", partly, 0, 1)).finished
    assert (await store.read("s", read_out, 0, 10)).finished
    live = new_life()
    await store.create_stream("s", live, kind="request", owner="r1")
    await store.append("s", live, "y" * 8000, None)  # one stream of three must go
    assert await store.stream_info("s", read_out) is None
    assert await store.stream_info("s", unread) is not None
    assert await store.stream_info("s", partly) is not None
    await store.append("s", live, "y" * 4000, None)  # then the oldest finish among the rest
    assert await store.stream_info("s", unread) is None
    assert await store.stream_info("s", partly) is not None


async def test_memory_cap_logs_once_per_interval_with_what_it_evicted():
    clock = Clock()
    store = MemoryStore(max_bytes=10_000, clock=clock)
    live = new_life()
    await store.create_stream("s", live, kind="request", owner="r1")
    with structlog.testing.capture_logs() as logs:
        for _ in range(20):  # every append past the cap trims the live stream
            await store.append("s", live, "z" * 4000, None)
        clock.now += CAP_LOG_INTERVAL_S
        await store.append("s", live, "z" * 4000, None)
    lines = [line for line in logs if line["event"] == "store.memory_cap_reached"]
    assert len(lines) == 2
    assert lines[0]["limit_bytes"] == 10_000
    # The third append reached the cap (two events fit) and logged the first line; the second
    # counts what was done since: one trim for each of the 18 appends after it.
    assert lines[0]["events_trimmed"] == 1
    assert lines[1]["events_trimmed"] == 18
    assert lines[0]["streams_evicted"] == lines[1]["streams_evicted"] == 0


async def test_memory_cap_evictions_after_the_last_line_are_logged_by_a_later_sweep():
    clock = Clock()
    store = MemoryStore(max_bytes=10_000, clock=clock)
    lives = []
    with structlog.testing.capture_logs() as logs:
        for _ in range(5):  # 5 finished streams of about 4 KiB under a 10 KB cap
            life = new_life()
            await store.create_stream("s", life, kind="request", owner="r1")
            await store.append("s", life, "x" * 4000, None)
            await store.finish("s", life)
            lives.append(life)
        evicted = sum([await store.stream_info("s", life) is None for life in lives])
        assert evicted == 3  # one line came with the first; the other two wait for the next
        clock.now += CAP_LOG_INTERVAL_S
        await store.create_stream("s", new_life(), kind="request", owner="r1")  # sweeps
        first = [line for line in logs if line["event"] == "store.memory_cap_reached"]
        await store.close()
    lines = [line for line in logs if line["event"] == "store.memory_cap_reached"]
    assert len(first) == len(lines) == 2  # the sweep wrote it; close had nothing left to say
    assert sum(line["streams_evicted"] for line in lines) == evicted


async def test_memory_cap_evictions_held_back_are_logged_by_a_later_append():
    """Evictions inside the interval after a line are written by the next append once the
    interval passed, though the cap is not reached again and no stream is created."""
    clock = Clock()
    store = MemoryStore(max_bytes=10_000, clock=clock)
    running = new_life()
    await store.create_stream("s", running, kind="request", owner="r1")
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):  # the third append reaches the cap: the first line (1 evicted)
            life = new_life()
            await store.create_stream("s", life, kind="request", owner="r1")
            await store.append("s", life, "x" * 4000, None)
            await store.finish("s", life)
        clock.now += 1
        await store.append("s", running, "y" * 4000, None)  # evicts one more: held back
        held_back = [line for line in logs if line["event"] == "store.memory_cap_reached"]
        clock.now += CAP_LOG_INTERVAL_S
        await store.append("s", running, "z", None)  # below the cap
    lines = [line for line in logs if line["event"] == "store.memory_cap_reached"]
    assert len(held_back) == 1
    assert [line["streams_evicted"] for line in lines] == [1, 1]


async def test_memory_cap_evictions_not_yet_logged_are_logged_on_close():
    clock = Clock()
    store = MemoryStore(max_bytes=10_000, clock=clock)
    with structlog.testing.capture_logs() as logs:
        for _ in range(4):
            life = new_life()
            await store.create_stream("s", life, kind="request", owner="r1")
            await store.append("s", life, "x" * 4000, None)
            await store.finish("s", life)
        await store.close()
    lines = [line for line in logs if line["event"] == "store.memory_cap_reached"]
    assert [line["streams_evicted"] for line in lines] == [1, 1]


async def test_a_life_created_again_at_the_session_limit_replaces_itself(make_store):
    """The life being created again is dropped before the session's streams are counted."""
    store = make_store(max_streams_per_session=2)
    standalone, call = new_life(), new_life()
    await store.create_stream("s", standalone, kind="standalone", owner="r1")
    await store.create_stream("s", call, kind="request", owner="r1")  # running
    await store.create_stream("s", standalone, kind="standalone", owner="r1", start_after=10)
    info = await store.stream_info("s", standalone)
    assert info is not None
    assert info.first_offset == 11
    assert await store.stream_info("s", call) is not None


async def test_a_life_created_again_does_not_evict_another_finished_stream(make_store):
    store = make_store(max_streams_per_session=2)
    standalone, done = new_life(), new_life()
    await store.create_stream("s", standalone, kind="standalone", owner="r1")
    await store.append("s", standalone, "old", None)
    await store.create_stream("s", done, kind="request", owner="r1")
    await store.append("s", done, "answer", None)
    await store.finish("s", done)
    await store.create_stream("s", standalone, kind="standalone", owner="r1", start_after=10)
    assert await store.stream_info("s", done) is not None  # still replayable
    assert (await store.read("s", standalone, 10, 10)).events == []  # the old events went
    if isinstance(store, MemoryStore):
        assert store.stored_bytes == len("answer") + EVENT_OVERHEAD_BYTES


async def test_purge_and_tombstone_drop_every_stream(make_store):
    store = make_store()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    await store.append("s", life, "a", None)
    await store.tombstone_session("s")
    assert await store.stream_info("s", life) is None
    assert (await store.get_session("s")).deleted
    await store.purge_session("s")
    with pytest.raises(UnknownStream):
        await store.read("s", life, 0, 10)
    if isinstance(store, MemoryStore):
        assert store.stored_bytes == 0


async def test_purge_drops_streams_but_keeps_the_session_record(make_store):
    store = make_store()
    first, second = new_life(), new_life()
    await store.record_session("s", "2025-11-25")
    await store.create_stream("s", first, kind="request", owner="r1")
    await store.create_stream("s", second, kind="standalone", owner="r1")
    await store.append("s", first, "a", None)
    await store.purge_session("s")
    await store.purge_session("s")
    assert await store.stream_info("s", first) is None
    assert await store.stream_info("s", second) is None
    record = await store.get_session("s")
    assert (record.protocol_version, record.deleted) == ("2025-11-25", False)


async def test_session_record_round_trips_and_tombstone_keeps_the_version(make_store):
    store = make_store()
    assert await store.get_session("s") is None
    await store.record_session("s", "2025-06-18")
    record = await store.get_session("s", refresh=False)
    assert (record.protocol_version, record.deleted) == ("2025-06-18", False)
    await store.tombstone_session("s")
    record = await store.get_session("s")
    assert (record.protocol_version, record.deleted) == ("2025-06-18", True)
    assert await store.get_session("other") is None


async def test_session_refresh_flag(make_store):
    store = make_store(session_idle_ttl_s=SHORT_TTL_S)
    await store.record_session("s", "2025-11-25")
    # Used with refresh for three TTLs: it stays.
    loop = asyncio.get_running_loop()
    until = loop.time() + 3 * SHORT_TTL_S
    while loop.time() < until:
        assert await store.get_session("s") is not None
        await asyncio.sleep(SHORT_TTL_S / 10)
    # Only looked at without refresh (polled): it expires.
    await eventually(lambda: _session_gone(store, "s"))


async def _session_gone(store, session_id: str) -> bool:
    return await store.get_session(session_id, refresh=False) is None


async def test_open_streams_of_a_used_session_stay(make_store):
    # A TTL long enough that a loaded machine never leaves a gap of it between two uses (1 s
    # was not, once), and a use twice as long as the idle stream would live unrefreshed.
    ttl_s = 2.0
    store = make_store(session_idle_ttl_s=ttl_s)
    idle, used = new_life(), new_life()
    await store.create_stream("s", idle, kind="standalone", owner="r1")
    await store.append("s", idle, "kept", None)
    await store.create_stream("s", used, kind="request", owner="r1")
    loop = asyncio.get_running_loop()
    until = loop.time() + 2 * ttl_s
    while loop.time() < until:
        await store.append("s", used, "x", None)
        await asyncio.sleep(ttl_s / 20)
    assert [e.data for e in (await store.read("s", idle, 0, 10)).events] == ["kept"]


async def test_session_refresh_flag_memory_clock():
    """The exact boundary, with the memory store's injected clock."""
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


async def test_wait_on_an_unknown_stream_returns_at_once(make_store):
    store = make_store()
    assert await asyncio.wait_for(store.wait("s", new_life(), 0, 10), 5) is True


async def test_wait_wakes_when_the_stream_is_dropped(make_store):
    store = make_store()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    waiter = asyncio.create_task(store.wait("s", life, 0, 10))
    await eventually(lambda: parked(store, 1))
    await store.purge_session("s")
    assert await asyncio.wait_for(waiter, 5) is True
    with pytest.raises(UnknownStream):
        await store.read("s", life, 0, 10)


async def test_wait_is_safe_to_cancel(make_store):
    store = make_store()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    # Cancelled at every point of its first steps (checking the stream, subscribing, waiting):
    # the cancellation always propagates, and nothing is left behind.
    for steps in range(12):
        waiter = asyncio.create_task(store.wait("s", life, 0, 10))
        for _ in range(steps):
            await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
    if hasattr(store, "waiting"):
        assert store.waiting == 0
    await store.append("s", life, "a", None)
    assert await asyncio.wait_for(store.wait("s", life, 0, 10), 5) is True
    # The append's own wake-up may still be on its way (Pub/Sub) and wake the next waiter once;
    # after that, a wait with nothing new times out.
    late = await store.wait("s", life, 1, 0.05)
    assert late is False or await store.wait("s", life, 1, 0.05) is False


async def test_data_round_trips_exactly(make_store):
    store = make_store()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    datas = ["", "é ☃ 𝄞", "line1\nline2", json.dumps({"x": "y" * 100_000}), "a\rb"]
    for data in datas:
        await store.append("s", life, data, None)
    await store.append("s", life, "typed", "")
    events = (await store.read("s", life, 0, 100)).events
    assert [e.data for e in events] == [*datas, "typed"]
    assert [e.event for e in events] == [None] * len(datas) + [""]


async def test_read_in_batches_reaches_the_end(make_store):
    store = make_store()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    for i in range(25):
        await store.append("s", life, str(i), None)
    await store.finish("s", life)
    cursor, seen, finished = 0, [], False
    while not finished:
        result = await store.read("s", life, cursor, 10)
        seen += [int(e.data) for e in result.events]
        cursor = result.events[-1].offset if result.events else cursor
        finished = result.finished
    assert seen == list(range(25))


# Liveness (DESIGN D7): replica heartbeats and orphaned streams ---------------------------------

ERRORS = ['{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"replica died"}}', "e2"]


async def test_heartbeat_makes_a_replica_alive_until_it_expires(make_store):
    store = make_store(heartbeat_expiry_s=SHORT_TTL_S)
    assert await store.replica_alive("r1") is False
    await store.heartbeat("r1")
    assert await store.replica_alive("r1") is True
    assert await store.replica_alive("r2") is False
    await eventually(lambda: _dead(store, "r1"))


async def _dead(store, replica: str) -> bool:
    return not await store.replica_alive(replica)


async def test_end_orphaned_ends_a_dead_owners_stream_exactly_once(make_store):
    store = make_store()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="dead")
    await store.append("s", life, "a", None)
    waiter = asyncio.create_task(store.wait("s", life, 1, 10))
    await eventually(lambda: parked(store, 1))
    results = await asyncio.gather(*(store.end_orphaned("s", life, ERRORS) for _ in range(20)))
    assert sorted(results) == [False] * 19 + [True]
    assert await asyncio.wait_for(waiter, 5) is True
    result = await store.read("s", life, 0, 10)
    assert [e.data for e in result.events] == ["a", *ERRORS]
    assert [e.offset for e in result.events] == [1, 2, 3]
    assert result.finished
    info = await store.stream_info("s", life)
    assert (info.last_offset, info.finished) == (3, True)
    assert await store.end_orphaned("s", life, ERRORS) is False


async def test_end_orphaned_leaves_a_live_owners_stream(make_store):
    store = make_store(heartbeat_expiry_s=SHORT_TTL_S)
    life = new_life()
    await store.heartbeat("r1")
    await store.create_stream("s", life, kind="request", owner="r1")
    assert await store.end_orphaned("s", life, ERRORS) is False
    assert not (await store.stream_info("s", life)).finished
    # Once its heartbeat expired, the stream is ended.
    await eventually(lambda: store.end_orphaned("s", life, ERRORS))
    result = await store.read("s", life, 0, 10)
    assert [e.data for e in result.events] == ERRORS
    assert result.finished


async def test_end_orphaned_ignores_finished_unknown_and_foreign_streams(make_store):
    store = make_store()
    done, live = new_life(), new_life()
    await store.create_stream("s", done, kind="request", owner="dead")
    await store.finish("s", done)
    await store.create_stream("s", live, kind="request", owner="dead")
    assert await store.end_orphaned("s", done, ERRORS) is False
    assert await store.end_orphaned("s", new_life(), ERRORS) is False
    assert await store.end_orphaned("other", live, ERRORS) is False
    assert not (await store.stream_info("s", live)).finished
    assert await store.end_orphaned("s", live, []) is True
    result = await store.read("s", live, 0, 10)
    assert (result.events, result.finished) == ([], True)


async def test_end_orphaned_appends_the_pending_errors_the_writer_left(make_store):
    store = make_store()
    life = new_life()
    first, second = ERRORS[0], '{"jsonrpc":"2.0","id":"b","error":{"code":-32003}}'
    await store.create_stream("s", life, kind="request", owner="dead", pending=[first, second])
    await store.append("s", life, "progress", None)
    # The response to request 1 arrived: only the second request is still pending.
    await store.append("s", life, "answer 1", None, pending=[second])
    await store.append("s", life, "more progress", None)
    assert await store.end_orphaned("s", life) is True
    result = await store.read("s", life, 0, 10)
    assert [e.data for e in result.events] == ["progress", "answer 1", "more progress", second]
    assert result.finished


async def test_end_orphaned_with_nothing_pending_only_finishes(make_store):
    store = make_store()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="dead", pending=[ERRORS[0]])
    await store.append("s", life, "answer", None, pending=[])
    assert await store.end_orphaned("s", life) is True
    result = await store.read("s", life, 0, 10)
    assert ([e.data for e in result.events], result.finished) == (["answer"], True)


async def test_a_stream_created_again_starts_after_the_offsets_it_used(make_store):
    store = make_store()
    life = new_life()
    base = 1_800_000_000_000_000  # microseconds since 1970, as the standalone stream uses
    await store.create_stream("s", life, kind="standalone", owner="r1")
    for data in ("a", "b", "c"):
        await store.append("s", life, data, None)
    await store.drop_stream("s", life)
    await store.create_stream("s", life, kind="standalone", owner="r1", start_after=base)
    assert await store.append("s", life, "new", None) == base + 1
    info = await store.stream_info("s", life)
    assert (info.first_offset, info.last_offset) == (base + 1, base + 1)
    # A cursor of the earlier incarnation is before the first stored event: never replayed.
    with pytest.raises(CursorGone):
        await store.read("s", life, 2, 10)
    result = await store.read("s", life, base, 10)
    assert [(e.offset, e.data) for e in result.events] == [(base + 1, "new")]


async def test_append_many_stores_in_order_with_consecutive_offsets(make_store):
    store = make_store()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1", pending=["p1"])
    assert await store.append("s", life, "first", None) == 1
    last = await store.append_many(
        "s", life, [("a", None), ("b", "progress"), ("c", None)], pending=[]
    )
    assert last == 4
    result = await store.read("s", life, 0, 10)
    assert [(e.offset, e.data, e.event) for e in result.events] == [
        (1, "first", None),
        (2, "a", None),
        (3, "b", "progress"),
        (4, "c", None),
    ]
    # pending replaced by the batch: nothing left for end_orphaned to append
    assert await store.end_orphaned("s", life) is True
    assert [e.data for e in (await store.read("s", life, 4, 10)).events] == []
    with pytest.raises(ValueError, match="at least one"):
        await store.append_many("s", life, [])


async def test_creator_bindings_round_trip_on_sessions_and_streams(make_store):
    """The encoded credential bindings (DESIGN D8) are kept as given, and default to none."""
    store = make_store()
    binding = "a1." + "c" * 64 + "." + "p" * 64 + ".1700000000000.-"
    await store.record_session("s", "2025-11-25", auth=binding)
    assert (await store.get_session("s")).auth == binding
    await store.record_session("t", "2025-11-25")
    assert (await store.get_session("t")).auth == ""
    life, other = new_life(), new_life()
    await store.create_stream("s", life, kind="request", owner="r1", auth=binding)
    await store.create_stream("s", other, kind="standalone", owner="r1")
    assert (await store.stream_info("s", life)).auth == binding
    assert (await store.stream_info("s", other)).auth == ""


# Task records (DESIGN D11) -------------------------------------------------------------------


async def test_a_task_record_is_created_once_and_written_by_compare_and_set(make_store):
    store = make_store()
    assert await store.get_task("t1") is None
    assert await store.put_task("t1", '{"status": "working"}', version=0, ttl_ms=60_000)
    assert not await store.put_task("t1", "{}", version=0, ttl_ms=60_000)  # exists
    assert await store.get_task("t1") == (1, '{"status": "working"}')
    # Two writers read version 1: the first wins, the second must read again.
    assert await store.put_task("t1", '{"status": "completed"}', version=1, ttl_ms=1)
    assert not await store.put_task("t1", '{"status": "cancelled"}', version=1, ttl_ms=1)
    assert await store.get_task("t1") == (2, '{"status": "completed"}')
    assert not await store.put_task("unknown", "{}", version=1, ttl_ms=60_000)
    assert await store.get_task("unknown") is None


async def test_a_task_record_expires_with_its_creation_ttl(make_store):
    store = make_store()
    ttl_ms = int(SHORT_TTL_S * 1000)
    assert await store.put_task("t2", "a", version=0, ttl_ms=ttl_ms)
    assert await store.put_task("t2", "b", version=1, ttl_ms=3_600_000)  # keeps its TTL
    await eventually(lambda: _gone(store, "t2"))
    assert not await store.put_task("t2", "c", version=2, ttl_ms=ttl_ms)


async def _gone(store, task_id):
    return await store.get_task(task_id) is None


def test_the_memory_store_refuses_a_task_beyond_its_bound_and_never_evicts_a_live_one():
    clock = Clock()
    store = MemoryStore(max_tasks=2, clock=clock)

    async def run() -> None:
        assert await store.put_task("a", "1", version=0, ttl_ms=10_000)
        assert await store.put_task("b", "1", version=0, ttl_ms=20_000)
        with pytest.raises(StoreLimitExceeded):
            await store.put_task("c", "1", version=0, ttl_ms=10_000)
        assert await store.get_task("a") == (1, "1")
        clock.now += 10  # "a" expired: its room is taken
        assert await store.put_task("c", "1", version=0, ttl_ms=10_000)
        assert await store.get_task("a") is None
        assert await store.get_task("b") == (1, "1")

    asyncio.run(run())
