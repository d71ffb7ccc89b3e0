"""What only the Redis store must show (DESIGN D7): bounded connections, TTLs on every key, hash
tags, outages and restarts without silent gaps, lost-event detection, several replicas."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import BlockingConnectionPool
from redis.asyncio.connection import SSLConnection
from redis.crc import key_slot

from mcp_sse_gateway.config import Settings, StoreSettings
from mcp_sse_gateway.errors import (
    CursorGone,
    StoreError,
    StoreUnavailable,
    StreamError,
    UnknownStream,
)
from mcp_sse_gateway.event_ids import new_life
from mcp_sse_gateway.store.base import StoredEvent, session_digest
from mcp_sse_gateway.store.redis import (
    CLIENT_NAME,
    COMMAND_CONNECTIONS,
    DEFAULT_STALL_TIMEOUT_S,
    MAX_CONNECTIONS_PER_PROCESS,
    RedisStore,
)
from mcp_sse_gateway.store.redis.keys import SessionKeys, wake_channel
from mcp_sse_gateway.store.redis.replays import SMALL_EVENT_BYTES
from mcp_sse_gateway.streams.delivery import Delivery
from mcp_sse_gateway.streams.life import StreamLife
from tests.conftest import RedisServerProcess, redis_server_executable
from tests.support.fake_upstream import ListSink
from tests.support.waiting import DEADLINE_S, eventually, parked

PREFIX = "mcp-sse-gateway"


async def outcome(call: Callable[[], Awaitable[Any]]) -> Any:
    """The call's result, or the class of the store/stream error it raised."""
    try:
        return await call()
    except (StoreError, StreamError) as exc:
        return type(exc)


async def store_connections(admin: Any) -> int:
    return sum(1 for client in await admin.client_list() if client.get("name") == CLIENT_NAME)


# Bounded connections ----------------------------------------------------------------------------


@pytest.mark.redis
async def test_waiting_clients_hold_no_connections(redis_url):
    store = RedisStore.from_url(redis_url)
    admin = redis.asyncio.Redis.from_url(redis_url)
    peak = 0
    sampling = True

    async def sample() -> None:
        nonlocal peak
        while sampling:
            peak = max(peak, await store_connections(admin))
            await asyncio.sleep(0.002)

    sampler = asyncio.create_task(sample())
    try:
        lives = [(f"session-{i % 10}", new_life()) for i in range(50)]
        for session_id, life in lives:
            await store.create_stream(session_id, life, kind="request", owner="r1")
        waiters = [
            asyncio.create_task(store.wait(session_id, life, 0, 30))
            for session_id, life in lives
            for _ in range(5)
        ]
        await eventually(lambda: parked(store, 250, commands_idle=True))
        parked_connections = await store_connections(admin)
        assert not any(waiter.done() for waiter in waiters)
        # A burst: every stream appended to at once, plus 300 concurrent reads.
        await asyncio.gather(
            *(store.append(session_id, life, "x", None) for session_id, life in lives),
            *(store.read(session_id, life, 0, 10) for session_id, life in lives * 6),
        )
        assert await asyncio.wait_for(asyncio.gather(*waiters), DEADLINE_S) == [True] * 250
    finally:
        sampling = False
        await sampler
        await store.close()
        await admin.aclose()
    print(f"connections: parked={parked_connections} peak={peak}")
    assert 1 <= parked_connections <= MAX_CONNECTIONS_PER_PROCESS
    assert peak <= MAX_CONNECTIONS_PER_PROCESS == COMMAND_CONNECTIONS + 2


# Keys: TTLs and hash tags -----------------------------------------------------------------------


async def _scenario(backend) -> dict[str, list[str]]:
    """Use every operation; returns the sessions' raw ids by role."""
    store = backend(
        max_events_per_stream=5,
        max_streams_per_session=3,
        session_idle_ttl_s=120,
        finished_stream_ttl_s=60,
    )
    alive, deleted, other = "raw-session-alive", "raw-session-deleted", "raw-session-other"
    await store.record_session(alive, "2025-11-25")
    await store.record_session(deleted, "2025-06-18")
    trimmed, open_, orphan, fourth = new_life(), new_life(), new_life(), new_life()
    await store.create_stream(alive, trimmed, kind="request", owner="r1")
    for i in range(8):  # big ones among them: their index is trimmed with them
        await store.append(alive, trimmed, f"m{i}" * (600 if i % 3 == 0 else 1), None)
    await store.finish(alive, trimmed)
    await store.create_stream(alive, open_, kind="standalone", owner="r1")
    await store.append(alive, open_, "a", "custom")
    await store.append(alive, open_, "b" * (SMALL_EVENT_BYTES + 1), None)  # a big event
    await store.create_stream(alive, orphan, kind="request", owner="dead")
    await store.create_stream(alive, fourth, kind="request", owner="r1")  # evicts `trimmed`
    assert await store.end_orphaned(alive, orphan, ["error"])
    await store.get_session(alive)
    await store.read(alive, open_, 0, 10)
    await store.stream_info(alive, fourth)
    await store.heartbeat("r1")
    # A stream finished before its first event, then appended to: its events key is new.
    late = new_life()
    await store.create_stream(other, late, kind="request", owner="r1")
    await store.finish(other, late)
    await store.append(other, late, "late" * SMALL_EVENT_BYTES, None)  # big: its index is new
    dropped = new_life()
    await store.create_stream(other, dropped, kind="request", owner="r1")
    await store.drop_stream(other, dropped)
    gone = new_life()
    await store.create_stream(deleted, gone, kind="request", owner="r1")
    await store.append(deleted, gone, "x", None)
    await store.tombstone_session(deleted)
    assert await store.wait(alive, open_, 0, 1)
    return {"sessions": [alive, deleted, other]}


async def _all_keys(admin) -> list[str]:
    return sorted([key.decode() async for key in admin.scan_iter(count=1000)])


async def test_every_key_has_a_ttl(make_redis_store):
    await _scenario(make_redis_store)
    admin = make_redis_store.admin()
    keys = await _all_keys(admin)
    kinds = {key.split(":")[2] for key in keys if "{" in key} | {
        key.split(":")[1] for key in keys if "{" not in key
    }
    assert kinds == {"session", "streams", "fresh", "meta", "stream", "replica"}
    ttls = {key: await admin.pttl(key) for key in keys}
    assert all(ttl > 0 for ttl in ttls.values()), ttls


async def test_an_orphaned_stream_is_logged_with_the_short_session_digest(make_redis_store):
    # Every log line names a session by the same 12 hex digits (docs/operations.md, "Logs").
    store = make_redis_store()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="dead")
    with structlog.testing.capture_logs() as logs:
        assert await store.end_orphaned("s", life, ["error"]) is True
    (line,) = [entry for entry in logs if entry["event"] == "store.stream_orphaned"]
    assert line["session"] == session_digest("s")[:12]
    assert line["owner"] == "dead"


async def test_keys_of_a_session_share_one_hash_tag(make_redis_store):
    roles = await _scenario(make_redis_store)
    keys = await _all_keys(make_redis_store.admin())
    digests = {session_digest(session_id) for session_id in roles["sessions"]}
    for key in keys:
        assert "raw-session" not in key  # a raw session id never reaches Redis
        assert key.startswith(f"{PREFIX}:")
        if key.startswith(f"{PREFIX}:replica:"):
            continue
        tag = key[key.index("{") + 1 : key.index("}")]
        assert tag in digests
        assert key_slot(key.encode()) == key_slot(tag.encode())
    assert {key[key.index("{") + 1 : key.index("}")] for key in keys if "{" in key} <= digests


async def test_idle_session_streams_expire(make_redis_store):
    store = make_redis_store(session_idle_ttl_s=0.3)
    admin = make_redis_store.admin()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    await store.append("s", life, "a", None)
    keys = SessionKeys.of(PREFIX, "s")
    assert 0 < await admin.pttl(keys.meta(life)) <= 330  # at most 1.1 x the idle TTL
    await eventually(lambda: _no_keys(admin))
    with pytest.raises(UnknownStream):
        await store.read("s", life, 0, 10)


async def _no_keys(admin) -> bool:
    return not await _all_keys(admin)


# Wake-ups ---------------------------------------------------------------------------------------


async def test_a_wake_up_racing_the_check_is_not_missed(make_redis_store, monkeypatch):
    store = make_redis_store()
    writer = make_redis_store()  # another replica
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    assert await store.wait("s", life, 0, 0.01) is False
    await eventually(lambda: store.subscribed)
    check = store._has_news
    raced = []

    async def racing_check(keys, life_, after, wait_s, reader):
        news = await check(keys, life_, after, wait_s, reader)
        if not raced:  # the event lands right after the check said "nothing yet"
            raced.append(await writer.append("s", life, "a", None))
        return news

    monkeypatch.setattr(store, "_has_news", racing_check)
    assert await asyncio.wait_for(store.wait("s", life, 0, 30), DEADLINE_S) is True
    assert raced == [1]


async def test_only_watched_streams_publish_wake_ups(make_redis_store):
    """An append publishes a wake-up only while some reader waits through the store."""
    store = make_redis_store()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    client = store.clients.commands
    pubsub = client.pubsub()
    await pubsub.subscribe(wake_channel(PREFIX))
    try:
        await pubsub.get_message(timeout=1)  # the subscribe confirmation
        await store.append("s", life, "unwatched", None)
        assert await pubsub.get_message(timeout=0.2) is None
        waiter = asyncio.create_task(store.wait("s", life, 1, 30))
        await eventually(lambda: store.waiting == 1)
        await eventually(lambda: _watched(client, store, life))
        await store.append("s", life, "watched", None)
        assert await asyncio.wait_for(waiter, DEADLINE_S) is True
        message = await pubsub.get_message(timeout=DEADLINE_S)
        assert message is not None
        assert message["type"] in ("message", b"message")
    finally:
        await pubsub.aclose()


async def _watched(client, store, life) -> bool:
    keys = store._keys("s")
    return bool(await client.exists(keys.meta(life) + ":watch"))


async def test_replicas_share_streams_and_wake_ups(make_redis_store):
    first, second = make_redis_store(), make_redis_store()
    life = new_life()
    await first.create_stream("s", life, kind="request", owner="first")
    waiter = asyncio.create_task(second.wait("s", life, 0, 30))
    await eventually(lambda: parked(second, 1, commands_idle=True))
    await first.append("s", life, "a", None)
    assert await asyncio.wait_for(waiter, DEADLINE_S) is True
    assert [e.data for e in (await second.read("s", life, 0, 10)).events] == ["a"]
    # The owner is dead: readers on both replicas race to end the stream; one does.
    calls = [store.end_orphaned("s", life, ["err"]) for store in (first, second) for _ in range(10)]
    assert sorted(await asyncio.gather(*calls)) == [False] * 19 + [True]
    result = await first.read("s", life, 0, 10)
    assert ([e.data for e in result.events], result.finished) == (["a", "err"], True)


@pytest.mark.redis
async def test_a_killed_subscription_comes_back_by_itself_and_wakes_again(redis_url):
    """redis-py reconnects the dropped subscription and subscribes again (its own Retry); the
    waiters are woken to look, and later appends wake them by message again."""
    store = RedisStore.from_url(redis_url)
    admin = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)

    async def subscribers() -> list[str]:
        return [
            entry["id"]
            for entry in await admin.client_list()
            if entry.get("name") == CLIENT_NAME and "P" in entry.get("flags", "")
        ]

    try:
        life = new_life()
        await store.create_stream("s", life, kind="request", owner="r1")
        waiter = asyncio.create_task(store.wait("s", life, 0, 60))
        await eventually(lambda: parked(store, 1, commands_idle=True))
        [first] = await subscribers()
        with structlog.testing.capture_logs() as logs:
            await admin.client_kill_filter(_id=first)
            await store.append("s", life, "during", None)  # its wake-up may be lost
            assert await asyncio.wait_for(waiter, DEADLINE_S) is True

            async def resubscribed() -> bool:
                found = await subscribers()
                return len(found) == 1 and found[0] != first and store.subscribed

            await eventually(resubscribed)
            waiter = asyncio.create_task(store.wait("s", life, 1, 60))
            await eventually(lambda: parked(store, 1, commands_idle=True))
            await store.append("s", life, "after", None)
            assert await asyncio.wait_for(waiter, DEADLINE_S) is True
        # A dropped connection on a live Redis is not an outage: nothing to report.
        assert not [e for e in logs if e["event"].startswith("store.redis_")]
    finally:
        await store.close()
        await admin.aclose()


async def test_lost_events_end_the_stream_life_never_reusing_offsets(make_redis_store):
    store = make_redis_store()
    admin = make_redis_store.admin()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    for data in "abc":
        await store.append("s", life, data, None)
    waiter = asyncio.create_task(store.wait("s", life, 3, 30))
    await eventually(lambda: parked(store, 1, commands_idle=True))
    # Redis restored an older snapshot (or failed over to a lagging replica): events 2-3 are gone.
    keys = SessionKeys.of(PREFIX, "s")
    await admin.hset(keys.meta(life), "last", 1)
    await admin.xdel(keys.stream(life), "0-2", "0-3")
    with pytest.raises(CursorGone):  # a reader that had 3 is told, not served an empty replay
        await store.read("s", life, 3, 10)
    with pytest.raises(UnknownStream):  # the writer notices: the life ends (dropped)
        await store.append("s", life, "d", None)
    assert await asyncio.wait_for(waiter, DEADLINE_S) is True
    with pytest.raises(UnknownStream):
        await store.read("s", life, 1, 10)


async def test_large_events_are_read_in_bounded_replies(make_redis_store):
    store = make_redis_store()
    store._read_max_bytes = 2500
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    for i in range(10):
        await store.append("s", life, str(i) * 1000, None)
    await store.finish("s", life)
    sizes, cursor = [], 0
    while True:
        result = await store.read("s", life, cursor, 100)
        sizes.append(len(result.events))
        cursor = result.events[-1].offset
        if result.finished:
            break
    assert sizes == [2, 2, 2, 2, 2]
    store._read_max_bytes = 10  # smaller than one event: one at a time, never none
    assert [e.offset for e in (await store.read("s", life, 4, 100)).events] == [5]


# Replays of small events: one transaction with a raw XRANGE, no read script -------------------


def _fast_reads(store, monkeypatch) -> list[list[StoredEvent]]:
    """The events of each read served without the read script, as they happen."""
    served: list[list[StoredEvent]] = []
    replays = store._replays
    real = replays.read

    async def read(*args, **kwargs):
        result = await real(*args, **kwargs)
        served.append(result.events)
        return result

    monkeypatch.setattr(replays, "read", read)
    return served


def _size(event: StoredEvent) -> int:
    """What the append scripts count of an event (a type is stored after one marker byte)."""
    return len(event.data.encode()) + (0 if event.event is None else len(event.event) + 1)


async def test_a_replay_of_small_events_reads_them_raw_after_its_first_batch(
    make_redis_store, monkeypatch
):
    store = make_redis_store()
    served = _fast_reads(store, monkeypatch)
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    stored = [
        StoredEvent(i, json.dumps({"i": i, "pad": "é" * 40}), "progress" if i % 7 == 0 else None)
        for i in range(1, 2501)
    ]
    for start in range(0, len(stored), 100):
        batch = stored[start : start + 100]
        for event in batch:
            await store.append("s", life, event.data, event.event)
    await store.finish("s", life)
    read, cursor, finished = [], 0, False
    while not finished:
        result = await store.read("s", life, cursor, 1000)
        read += result.events
        cursor, finished = result.events[-1].offset, result.finished
    assert read == stored
    # The first read learns that every event is small; the next whole batch needs no script,
    # the last one (500 left) is the script's again.
    assert [len(events) for events in served] == [1000]
    assert served[0][0].offset == 1001


@pytest.mark.parametrize("budget", [1024 * 1024, 3000])
@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    events=st.lists(
        st.tuples(
            st.sampled_from([0, 1, 300, SMALL_EVENT_BYTES - 9, SMALL_EVENT_BYTES, 1025, 5000]),
            st.sampled_from([None, None, "", "t", "progress", "é"]),
        ),
        min_size=1,
        max_size=30,
    ),
    limits=st.lists(st.integers(1, 9), min_size=1, max_size=4),
)
async def test_replays_serve_each_event_once_and_big_ones_only_through_the_script(
    make_redis_store, monkeypatch, budget, events, limits
):
    store = make_redis_store()
    store._read_max_bytes = budget
    served = _fast_reads(store, monkeypatch)
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    stored = [
        StoredEvent(offset, "x" * size, event)
        for offset, (size, event) in enumerate(events, start=1)
    ]
    for event in stored:
        await store.append("s", life, event.data, event.event)
    await store.finish("s", life)
    read, cursor, finished, turn = [], 0, False, 0
    while not finished:
        # Each pass starts again from 0 once: what was learnt serves the second pass too.
        result = await store.read("s", life, cursor, limits[turn % len(limits)])
        read += result.events
        cursor, finished, turn = result.events[-1].offset, result.finished, turn + 1
    again, cursor = [], 0
    while cursor < len(stored):
        result = await store.read("s", life, cursor, limits[turn % len(limits)])
        again += result.events
        cursor, turn = result.events[-1].offset, turn + 1
    assert read == stored
    assert again == stored
    for events_served in served:
        assert all(_size(event) <= SMALL_EVENT_BYTES for event in events_served)
        assert len(events_served) <= budget // SMALL_EVENT_BYTES


async def test_a_raw_read_goes_on_after_redis_forgot_the_scripts(make_redis_store, monkeypatch):
    store = make_redis_store()
    admin = make_redis_store.admin()
    served = _fast_reads(store, monkeypatch)
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    for i in range(6):
        await store.append("s", life, f"e{i}", None)
    assert len((await store.read("s", life, 0, 2)).events) == 2
    await admin.script_flush()  # as after a restart of Redis with its data kept
    assert [e.data for e in (await store.read("s", life, 2, 2)).events] == ["e2", "e3"]
    assert [[e.offset for e in events] for events in served] == [[3, 4]]


async def test_events_an_older_replica_appended_are_read_by_the_script(
    make_redis_store, monkeypatch
):
    store = make_redis_store()
    admin = make_redis_store.admin()
    served = _fast_reads(store, monkeypatch)
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    for data in "abc":
        await store.append("s", life, data, None)
    # An older replica's append: the event is stored, but not listed among the big ones.
    keys = SessionKeys.of(PREFIX, "s")
    await admin.hincrby(keys.meta(life), "last", 1)
    await admin.xadd(keys.stream(life), {"d": "x" * 5000}, id="0-4")
    for data in "ef":
        await store.append("s", life, data, None)
    big = keys.meta(life) + ":big"
    assert await admin.zscore(big, "~") == 3  # listed up to it, never beyond
    assert [e.offset for e in (await store.read("s", life, 0, 100)).events] == [1, 2, 3, 4, 5, 6]
    assert [e.offset for e in (await store.read("s", life, 1, 2)).events] == [2, 3]
    assert [e.offset for e in (await store.read("s", life, 3, 2)).events] == [4, 5]
    assert [[e.offset for e in events] for events in served] == [[2, 3]]


async def test_offsets_beyond_fourteen_digits_are_compared_exactly(make_redis_store, monkeypatch):
    store = make_redis_store()
    served = _fast_reads(store, monkeypatch)
    start = 1_712_345_678_901_299  # Lua writes it as 1.7123456789013e+15 when concatenated
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1", start_after=start)
    await store.append("s", life, "big" * SMALL_EVENT_BYTES, None)
    for _ in range(4):
        await store.append("s", life, "small", None)
    assert [e.offset for e in (await store.read("s", life, start, 1)).events] == [start + 1]
    assert [e.offset for e in (await store.read("s", life, start, 2)).events] == [
        start + 1,
        start + 2,
    ]
    assert all(_size(event) <= SMALL_EVENT_BYTES for events in served for event in events)


async def test_big_events_are_never_read_raw_once_their_list_is_gone(make_redis_store, monkeypatch):
    store = make_redis_store()
    admin = make_redis_store.admin()
    served = _fast_reads(store, monkeypatch)
    keys = SessionKeys.of(PREFIX, "s")
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    for i in range(1, 21):
        await store.append("s", life, "big" * SMALL_EVENT_BYTES if i % 2 == 0 else "small", None)
    # The list expired or was evicted before its stream (an older replica refreshes only the
    # meta and stream keys; a maxmemory policy other than noeviction): nothing is known.
    await admin.delete(keys.meta(life) + ":big")
    await store.append("s", life, "big" * SMALL_EVENT_BYTES, None)  # lists nothing now
    assert await admin.exists(keys.meta(life) + ":big") == 0
    events = []
    for cursor in range(0, 21, 3):
        events += (await store.read("s", life, cursor, 3)).events
    assert [e.offset for e in events] == list(range(1, 22))
    assert served == []


async def test_a_raw_read_returns_the_batch_the_read_script_would(make_redis_store, monkeypatch):
    store = make_redis_store()
    served = _fast_reads(store, monkeypatch)
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    for i in range(1, 5001):
        await store.append("s", life, "x" * 2000 if i == 1500 else "s", None)
    await store.finish("s", life)
    batches = []
    cursor = 0
    while cursor < 5000:
        result = await store.read("s", life, cursor, 1000)
        batches.append(len(result.events))
        cursor = result.events[-1].offset
    assert batches == [1000] * 5  # one big event among small ones fits the budget whole
    # The script reads the batches up to and just after the big event; from its next read on,
    # everything after the cursor is known small.
    assert [events[0].offset for events in served] == [3001, 4001]
    # A delivery counts its full batches as before: the replay bound still closes it.
    bounded = Settings(store={"replay_batch_events": 1000, "replay_max_passes": 2})
    stream = StreamLife((session_digest("s"), life), "s", life)
    delivery = Delivery(ListSink(), store, stream, bounded, cursor=0, primes=False, resuming=True)
    assert await delivery.run() == "replay_bound"
    assert delivery.cursor.offset == 2000


async def test_a_standalone_life_created_again_over_learnt_offsets_is_never_read_raw(
    make_redis_store, monkeypatch
):
    reader, other = make_redis_store(), make_redis_store()
    served = _fast_reads(reader, monkeypatch)
    life = new_life()
    await reader.create_stream("s", life, kind="standalone", owner="a", start_after=1000)
    for _ in range(10):
        await reader.append("s", life, "small", None)
    await reader.read("s", life, 1000, 2)
    # Another replica, its clock behind, takes the stream over: the same life, the same start.
    await other.create_stream("s", life, kind="standalone", owner="b", start_after=1000)
    for _ in range(10):
        await other.append("s", life, "big" * SMALL_EVENT_BYTES, None)
    result = await reader.read("s", life, 1002, 2)
    assert [e.offset for e in result.events] == [1003, 1004]
    assert served == []  # a standalone stream is the read script's only


async def test_a_life_created_again_after_its_meta_was_lost_keeps_no_old_events(
    make_redis_store,
):
    # The meta hash evicted (a maxmemory policy other than noeviction) while the stream key
    # stayed: the standalone life created again under the same id holds its new events only,
    # within the bound.
    store = make_redis_store(max_events_per_stream=5)
    admin = make_redis_store.admin()
    keys = SessionKeys.of(PREFIX, "s")
    life = new_life()
    await store.create_stream("s", life, kind="standalone", owner="a", start_after=100)
    for _ in range(5):
        await store.append("s", life, "old", None)
    await admin.delete(keys.meta(life))
    await store.create_stream("s", life, kind="standalone", owner="b", start_after=200)
    for _ in range(5):
        await store.append("s", life, "new", None)
    read = await store.read("s", life, 200, 100)
    assert await admin.xlen(keys.stream(life)) == 5
    assert [(e.offset, e.data) for e in read.events] == [(201 + i, "new") for i in range(5)]


async def test_a_raw_read_of_a_trimmed_or_recreated_stream_is_told_its_cursor_is_gone(
    make_redis_store, monkeypatch
):
    store = make_redis_store(max_events_per_stream=5)
    admin = make_redis_store.admin()
    served = _fast_reads(store, monkeypatch)
    keys = SessionKeys.of(PREFIX, "s")
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    for i in range(5):
        await store.append("s", life, "big" * SMALL_EVENT_BYTES if i == 4 else "small", None)
    assert len((await store.read("s", life, 0, 2)).events) == 2  # learns: 1 to 4 are small
    for _ in range(3):
        await store.append("s", life, "more", None)  # trims 1 to 3, and the big event's index
    with pytest.raises(CursorGone):
        await store.read("s", life, 2, 2)
    assert served == []  # the transaction's checks refused it: nothing came back raw
    big = keys.meta(life) + ":big"
    assert await admin.zrange(big, 0, -1) == [b"5", b"~"]  # offset 5, still stored
    for _ in range(5):
        await store.append("s", life, "more", None)
    assert await admin.zrange(big, 0, -1) == [b"~"]  # trimmed with its event
    # A standalone stream life dropped, then created again after its old offsets, with big
    # events where a raw read would have looked: the checks see the old cursor gone.
    standalone = new_life()
    await store.create_stream("s", standalone, kind="standalone", owner="r1")
    for _ in range(5):
        await store.append("s", standalone, "small", None)
    assert len((await store.read("s", standalone, 0, 1)).events) == 1
    await store.drop_stream("s", standalone)
    await store.create_stream("s", standalone, kind="standalone", owner="r1", start_after=5)
    for _ in range(5):
        await store.append("s", standalone, "big" * SMALL_EVENT_BYTES, None)
    with pytest.raises(CursorGone):
        await store.read("s", standalone, 1, 100)
    assert served == []


def _lose_first_reply(store, monkeypatch, script: str, *, applied: bool) -> list[str]:
    """The next *script* call's connection drops, after (or before) Redis ran it.

    The drop happens below redis-py: its own repeat (on a new connection) is what is tested.
    """
    sha = store._scripts.sha(script).encode()
    connection_class = store.clients.commands.connection_pool.connection_class
    send, read = connection_class.send_packed_command, connection_class.read_response
    failures: list[str] = []
    armed: list[Any] = []

    async def flaky_send(self, command, *args, **kwargs):
        packed = command if isinstance(command, bytes | bytearray) else b"".join(command)
        if not failures and sha in packed:
            failures.append(script)
            if not applied:
                await self.disconnect()
                raise redis.ConnectionError("connection closed by server")  # never sent
            armed.append(self)
        return await send(self, command, *args, **kwargs)

    async def flaky_read(self, *args, **kwargs):
        reply = await read(self, *args, **kwargs)
        if armed and armed[0] is self:
            armed.clear()
            await self.disconnect()
            raise redis.ConnectionError("connection closed by server")  # the reply is lost
        return reply

    monkeypatch.setattr(connection_class, "send_packed_command", flaky_send)
    monkeypatch.setattr(connection_class, "read_response", flaky_read)
    return failures


@pytest.mark.parametrize("applied", [True, False])
async def test_append_repeated_after_a_dropped_connection_stores_once(
    make_redis_store, monkeypatch, applied
):
    store = make_redis_store()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    await store.append("s", life, "a", None)
    failures = _lose_first_reply(store, monkeypatch, "append", applied=applied)
    assert await store.append("s", life, "b", "custom") == 2
    assert failures == ["append"]
    assert await store.append("s", life, "c", None) == 3
    events = (await store.read("s", life, 0, 10)).events
    assert [(e.offset, e.data, e.event) for e in events] == [
        (1, "a", None),
        (2, "b", "custom"),
        (3, "c", None),
    ]


async def test_append_repeated_after_a_dropped_connection_by_any_writer(
    make_redis_store, monkeypatch
):
    owner, other = make_redis_store(), make_redis_store()
    life = new_life()
    await owner.create_stream("s", life, kind="request", owner="r1")
    _lose_first_reply(other, monkeypatch, "append", applied=True)
    assert await other.append("s", life, "x", None) == 1  # it never wrote this stream before
    assert await owner.append("s", life, "x", None) == 2  # same data, another append: stored
    assert [e.data for e in (await owner.read("s", life, 0, 10)).events] == ["x", "x"]


async def test_end_orphaned_repeated_after_a_lost_reply_still_reports_its_win(
    make_redis_store, monkeypatch
):
    store = make_redis_store()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="dead")
    _lose_first_reply(store, monkeypatch, "end_orphaned", applied=True)
    assert await store.end_orphaned("s", life, ["err"]) is True
    assert await store.end_orphaned("s", life, ["err"]) is False
    result = await store.read("s", life, 0, 10)
    assert ([e.data for e in result.events], result.finished) == (["err"], True)


# Outages and restarts (a private redis-server each) ---------------------------------------------


@pytest.mark.redis
async def test_restart_without_persistence_never_replays_silently(private_redis):
    store = RedisStore.from_url(private_redis.url)
    try:
        life = new_life()
        await store.create_stream("s", life, kind="request", owner="r1")
        for data in "abc":
            await store.append("s", life, data, None)
        waiter = asyncio.create_task(store.wait("s", life, 3, 60))
        await eventually(lambda: parked(store, 1, commands_idle=True))

        private_redis.stop()
        private_redis.start()

        # The parked reader is woken once the subscription is back: its stream is gone.
        assert await asyncio.wait_for(waiter, DEADLINE_S) is True
        seen: list[Any] = []

        async def settled() -> bool:
            seen.append(await outcome(lambda: store.read("s", life, 1, 10)))
            return seen[-1] is not StoreUnavailable

        await eventually(settled)
        assert set(seen) <= {StoreUnavailable, UnknownStream}
        assert seen[-1] is UnknownStream
        with pytest.raises(UnknownStream):
            await store.read("s", life, 3, 10)
        with pytest.raises(UnknownStream):
            await store.append("s", life, "d", None)
        assert await store.stream_info("s", life) is None
        # A new stream life works, wake-ups included.
        fresh = new_life()
        await store.create_stream("s", fresh, kind="request", owner="r1")
        waiter = asyncio.create_task(store.wait("s", fresh, 0, 60))
        await eventually(lambda: parked(store, 1, commands_idle=True))
        await store.append("s", fresh, "new", None)
        assert await asyncio.wait_for(waiter, DEADLINE_S) is True
    finally:
        await store.close()


@pytest.mark.redis
async def test_restart_with_persistence_continues_the_stream():
    server = RedisServerProcess(
        redis_server_executable(), ["--appendonly", "yes", "--appendfsync", "always"]
    )
    server.start()
    store = RedisStore.from_url(server.url)
    try:
        life = new_life()
        await store.create_stream("s", life, kind="request", owner="r1")
        # Several pooled connections, all of which the restart kills.
        await asyncio.gather(*(store.append("s", life, str(i), None) for i in range(20)))
        waiter = asyncio.create_task(store.wait("s", life, 20, 60))
        await eventually(lambda: parked(store, 1, commands_idle=True))

        server.stop()
        server.start()

        # Stale pooled connections are replaced on first use: no call fails.
        offsets = await asyncio.gather(*(store.append("s", life, "after", None) for _ in range(8)))
        assert sorted(offsets) == list(range(21, 29))
        assert await asyncio.wait_for(waiter, DEADLINE_S) is True
        result = await store.read("s", life, 0, 100)
        assert [e.offset for e in result.events] == list(range(1, 29))
    finally:
        await store.close()
        server.close()


def _operations(store: RedisStore, life: str) -> dict[str, Callable[[], Awaitable[Any]]]:
    return {
        "ping": store.ping,
        "record_session": lambda: store.record_session("s", "2025-11-25"),
        "get_session": lambda: store.get_session("s"),
        "tombstone_session": lambda: store.tombstone_session("t"),
        "create_stream": lambda: store.create_stream("s", new_life(), kind="request", owner="r1"),
        "append": lambda: store.append("s", life, "x", None),
        "finish": lambda: store.finish("s", life),
        "read": lambda: store.read("s", life, 0, 10),
        "wait": lambda: store.wait("s", life, 5, 10),
        "stream_info": lambda: store.stream_info("s", life),
        "drop_stream": lambda: store.drop_stream("s", new_life()),
        "purge_session": lambda: store.purge_session("u"),
        "heartbeat": lambda: store.heartbeat("r1"),
        "replica_alive": lambda: store.replica_alive("r1"),
        "end_orphaned": lambda: store.end_orphaned("s", life, ["e"]),
    }


@pytest.mark.redis
async def test_outage_raises_store_unavailable_quickly_and_recovers_by_itself(private_redis):
    store = RedisStore.from_url(private_redis.url)
    try:
        life = new_life()
        await store.create_stream("s", life, kind="request", owner="r1")
        await store.append("s", life, "a", None)
        await store.wait("s", life, 0, 1)  # the subscriber runs

        private_redis.stop()
        timings = {}
        with structlog.testing.capture_logs() as logs:
            for name, call in _operations(store, life).items():
                started = time.monotonic()
                with pytest.raises(StoreUnavailable):
                    await call()
                timings[name] = time.monotonic() - started
        print("outage timings (s):", {k: round(v, 4) for k, v in timings.items()})
        assert max(timings.values()) < DEFAULT_STALL_TIMEOUT_S
        assert [e["event"] for e in logs].count("store.redis_unavailable") == 1

        private_redis.start()
        await eventually(lambda: _reachable(store))
        await eventually(lambda: store.subscribed)
        fresh = new_life()
        await store.create_stream("s", fresh, kind="request", owner="r1")
        waiter = asyncio.create_task(store.wait("s", fresh, 0, 60))
        await eventually(lambda: parked(store, 1, commands_idle=True))
        await store.append("s", fresh, "back", None)
        assert await asyncio.wait_for(waiter, DEADLINE_S) is True
        assert [e.data for e in (await store.read("s", fresh, 0, 10)).events] == ["back"]
    finally:
        await store.close()
    with pytest.raises(StoreUnavailable):
        await store.ping()  # closed
    await store.close()


async def _reachable(store: RedisStore) -> bool:
    return await outcome(store.ping) is None


@pytest.mark.redis
async def test_acl_user_and_password_never_logged():
    secret = "s3cret-Pass-42"
    server = RedisServerProcess(
        redis_server_executable(),
        ["--user", "default", "off", "--user", "app", "on", f">{secret}", "~*", "&*", "+@all"],
    )
    server.start()
    good = RedisStore.from_url(f"redis://app:{secret}@127.0.0.1:{server.port}/0")
    bad = RedisStore.from_url(f"redis://app:wrong-{secret}@127.0.0.1:{server.port}/0")
    anonymous = RedisStore.from_url(server.url)
    try:
        life = new_life()
        await good.create_stream("s", life, kind="request", owner="r1")
        waiter = asyncio.create_task(good.wait("s", life, 0, 30))
        await eventually(lambda: parked(good, 1, commands_idle=True))
        await good.append("s", life, "a", None)
        assert await asyncio.wait_for(waiter, DEADLINE_S) is True
        with structlog.testing.capture_logs() as logs:
            for store in (bad, anonymous):
                with pytest.raises(StoreUnavailable):
                    await store.ping()
                with pytest.raises(StoreUnavailable):
                    await store.wait("s", life, 0, 1)
        unavailable = [entry for entry in logs if entry["event"] == "store.redis_unavailable"]
        assert len(unavailable) == 2
        assert unavailable[0]["url"] == f"redis://app:***@127.0.0.1:{server.port}/0"
        assert unavailable[0]["error"] == "AuthenticationError"
        for entry in logs:
            assert secret not in json.dumps(entry, default=str)
    finally:
        for store in (good, bad, anonymous):
            await store.close()
        server.close()


# Configuration ----------------------------------------------------------------------------------


@pytest.mark.redis
async def test_a_unix_socket_url_serves_streams_and_wake_ups():
    # A short directory: a unix socket's path is limited to about 100 bytes.
    socket_path = tempfile.mkdtemp(prefix="r") + "/redis.sock"
    server = RedisServerProcess(
        redis_server_executable(), ["--unixsocket", socket_path, "--unixsocketperm", "700"]
    )
    server.start()
    store = RedisStore.from_url(f"unix://{socket_path}?db=3")
    try:
        life = new_life()
        await store.create_stream("s1", life, kind="request", owner="r1")
        waiter = asyncio.create_task(store.wait("s1", life, 0, DEADLINE_S))
        await eventually(lambda: parked(store, 1))
        assert await store.append("s1", life, "a", "message") == 1
        assert await asyncio.wait_for(waiter, DEADLINE_S) is True
        assert (await store.read("s1", life, 0, 10)).events == [StoredEvent(1, "a", "message")]
        admin = redis.asyncio.Redis(unix_socket_path=socket_path, db=3)
        try:
            assert await admin.dbsize() > 0  # the database the URL named
        finally:
            await admin.aclose()
    finally:
        await store.close()
        server.close()
        shutil.rmtree(socket_path.rsplit("/", 1)[0], ignore_errors=True)


async def test_from_settings_builds_bounded_tls_connections():
    settings = StoreSettings(
        backend="redis",
        redis_url="rediss://app:pw@redis.example:6380/2?ssl_ca_certs=/etc/ca.pem&max_connections=500",
        key_prefix="gw",
        max_events_per_stream=7,
    )
    store = RedisStore.from_settings(settings)
    try:
        pool = store.clients.commands.connection_pool
        assert isinstance(pool, BlockingConnectionPool)
        assert pool.max_connections == COMMAND_CONNECTIONS  # the URL cannot raise the bound
        assert pool.connection_class is SSLConnection
        kwargs = pool.connection_kwargs
        assert (kwargs["ssl_ca_certs"], kwargs["username"], kwargs["db"]) == (
            "/etc/ca.pem",
            "app",
            2,
        )
        assert kwargs["socket_timeout"] is None
        assert store.clients.subscriber.connection_pool.max_connections == 1
        assert store._max_events == 7
        assert "pw" not in store.clients.url_for_logs
    finally:
        await store.close()  # nothing was connected


async def test_from_settings_needs_a_url():
    with pytest.raises(ValueError, match="redis_url"):
        RedisStore.from_settings(StoreSettings())


# Memory per stored event ------------------------------------------------------------------------

EVENTS = 10_000


def _event(i: int) -> str:
    message = {
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {"progressToken": "tok-1", "progress": i, "total": EVENTS, "message": ""},
    }
    base = len(json.dumps(message))
    message["params"]["message"] = "x" * (200 - base)
    return json.dumps(message)


@pytest.mark.redis
async def test_memory_per_stored_event(redis_url):
    store = RedisStore.from_url(redis_url, max_events_per_stream=EVENTS)
    admin = redis.asyncio.Redis.from_url(redis_url)
    try:
        assert len(_event(1)) == 200
        before = (await admin.info("memory"))["used_memory"]
        life = new_life()
        await store.create_stream("s", life, kind="request", owner="r1")
        for start in range(0, EVENTS, 200):
            await asyncio.gather(
                *(store.append("s", life, _event(i), None) for i in range(start, start + 200))
            )
        after = (await admin.info("memory"))["used_memory"]
        keys = SessionKeys.of(PREFIX, "s")
        stream_bytes = await admin.memory_usage(keys.stream(life), samples=0)
        meta_bytes = await admin.memory_usage(keys.meta(life), samples=0)
    finally:
        await store.close()
        await admin.aclose()
    per_event = stream_bytes / EVENTS
    print(
        f"200-byte events: stream key {per_event:.1f} B/event (MEMORY USAGE), "
        f"used_memory delta {(after - before) / EVENTS:.1f} B/event, metadata {meta_bytes} B"
    )
    assert 200 <= per_event < 300


@pytest.mark.redis
async def test_a_new_stream_at_the_session_bound_looks_at_its_oldest_streams_only(redis_url):
    """A long session's calls cost the same at its bound: one meta looked at, not every one."""
    bound = 50
    store = RedisStore.from_url(redis_url, max_streams_per_session=bound)
    admin = redis.asyncio.Redis.from_url(redis_url)

    async def hmgets() -> int:
        stats = await admin.info("commandstats")
        return int(stats.get("cmdstat_hmget", {}).get("calls", 0))

    try:
        for _ in range(bound):
            life = new_life()
            await store.create_stream("s", life, kind="request", owner="r1")
            await store.finish("s", life)
        looked_at = []
        for _ in range(5):
            before = await hmgets()
            await store.create_stream("s", new_life(), kind="request", owner="r1")
            looked_at.append(await hmgets() - before)
    finally:
        await store.close()
        await admin.aclose()
    assert looked_at == [1] * 5  # the oldest life, finished: evicted


async def test_a_life_created_again_after_its_meta_was_lost_is_listed_once(make_redis_store):
    store = make_redis_store(max_streams_per_session=2)
    admin = make_redis_store.admin()
    done, standalone = new_life(), new_life()
    await store.create_stream("s", done, kind="request", owner="r1")
    await store.finish("s", done)
    await store.create_stream("s", standalone, kind="standalone", owner="r1")
    keys = SessionKeys.of(PREFIX, "s")
    await admin.delete(keys.meta(standalone))  # lost (evicted under maxmemory, say)
    await store.create_stream("s", standalone, kind="standalone", owner="r1")
    assert await store.stream_info("s", done) is not None  # no eviction for its stale entry
    lives = [life.decode() for life in await admin.lrange(keys.index, 0, -1)]
    assert sorted(lives) == sorted([done, standalone])


# The replica's session cache (local_cache.py) --------------------------------------------------


async def test_a_delete_is_seen_at_once_here_and_within_the_cache_bound_elsewhere(
    make_redis_store,
):
    here, there = make_redis_store(), make_redis_store()  # two replicas
    await here.record_session("s", "2025-11-25")
    assert (await there.get_session("s")).deleted is False  # cached on the other replica
    await here.tombstone_session("s")
    assert (await here.get_session("s")).deleted is True  # at once on this replica
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def deleted_there() -> bool:
        record = await there.get_session("s")
        return record is not None and record.deleted

    await eventually(deleted_there)
    assert loop.time() - started <= 1.0 + 0.5  # the cache's bound, plus scheduling


async def test_client_traffic_refreshes_the_session_even_after_a_quiet_lookup(make_redis_store):
    store, creator = make_redis_store(session_idle_ttl_s=60), make_redis_store()
    admin = make_redis_store.admin()
    await creator.record_session("s", "2025-11-25")  # on another replica: nothing cached here
    key = SessionKeys.of(PREFIX, "s").session
    await admin.pexpire(key, 30_000)  # as if half the idle time had passed
    assert await store.get_session("s", refresh=False) is not None  # a watchdog's lookup
    assert await store.get_session("s", refresh=True) is not None  # a client request
    assert await admin.pttl(key) > 50_000


async def test_a_stall_timeout_beyond_the_heartbeat_slack_is_warned_about():
    settings = StoreSettings(
        backend="redis",
        redis_url="redis://127.0.0.1:1/0",
        heartbeat_s=1,
        heartbeat_expiry_s=3,
        stall_timeout_s=2.5,
    )
    with structlog.testing.capture_logs() as logs:
        store = RedisStore.from_settings(settings)
    await store.close()  # nothing was connected
    [warning] = [e for e in logs if e["event"] == "store.stall_timeout_exceeds_heartbeat_slack"]
    assert (warning["stall_timeout_s"], warning["heartbeat_slack_s"]) == (2.5, 2)
