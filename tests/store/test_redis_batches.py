"""Appends of concurrent streams share pipelines (group commit), with each call's own outcome."""

from __future__ import annotations

import asyncio

import pytest

from mcp_sse_gateway.errors import StoreUnavailable, UnknownStream
from mcp_sse_gateway.event_ids import new_life
from mcp_sse_gateway.store.redis.keys import SessionKeys

PREFIX = "mcp-sse-gateway"
STREAMS = 200
EVENTS = 5


async def _streams(store, count: int) -> list[tuple[str, str]]:
    pairs = [(f"s{i}", new_life()) for i in range(count)]
    for session, life in pairs:
        await store.create_stream(session, life, kind="request", owner="r1")
    return pairs


async def test_concurrent_appends_share_pipelines_and_each_gets_its_offsets(make_redis_store):
    store = make_redis_store()
    pairs = await _streams(store, STREAMS)

    async def write(session: str, life: str) -> list[int]:
        return [
            await store.append_many(session, life, [(f"{session}-{n}", None)])
            for n in range(EVENTS)
        ]

    before = store._batches.pipelines, store._batches.calls
    offsets = await asyncio.gather(*(write(s, life) for s, life in pairs))
    pipelines = store._batches.pipelines - before[0]
    calls = store._batches.calls - before[1]
    assert offsets == [list(range(1, EVENTS + 1))] * STREAMS
    assert calls == STREAMS * EVENTS
    # Every turn's appends go together: far fewer round trips than calls.
    assert pipelines <= calls / 4, (pipelines, calls)
    for session, life in pairs:
        read = await store.read(session, life, 0, 100)
        assert [e.data for e in read.events] == [f"{session}-{n}" for n in range(EVENTS)]
        assert [e.offset for e in read.events] == list(range(1, EVENTS + 1))


async def test_an_error_reply_fails_only_its_own_call(make_redis_store):
    store = make_redis_store()
    admin = make_redis_store.admin()
    pairs = await _streams(store, 20)
    broken_session, broken_life = pairs[7]
    # The stream's metadata is no longer a hash: its script gets a WRONGTYPE error reply.
    meta = SessionKeys.of(PREFIX, broken_session).meta(broken_life)
    await admin.delete(meta)
    await admin.set(meta, "not a hash")

    outcomes = await asyncio.gather(
        *(store.append(s, life, "x", None) for s, life in pairs), return_exceptions=True
    )
    assert isinstance(outcomes[7], StoreUnavailable)
    assert outcomes[:7] + outcomes[8:] == [1] * 19
    # The store is not down: the next append of another stream goes through.
    assert await store.append(*pairs[0], "y", None) == 2


async def test_appends_go_on_after_redis_forgot_the_scripts(make_redis_store):
    store = make_redis_store()
    admin = make_redis_store.admin()
    pairs = await _streams(store, 30)
    await admin.script_flush()
    offsets = await asyncio.gather(*(store.append(s, life, "x", None) for s, life in pairs))
    assert offsets == [1] * 30
    for session, life in pairs:
        assert [e.data for e in (await store.read(session, life, 0, 10)).events] == ["x"]


async def test_an_unknown_stream_is_that_calls_error(make_redis_store):
    store = make_redis_store()
    pairs = await _streams(store, 5)
    outcomes = await asyncio.gather(
        *(store.append(s, life, "x", None) for s, life in pairs),
        store.append("s0", new_life(), "x", None),
        return_exceptions=True,
    )
    assert outcomes[:5] == [1] * 5
    assert isinstance(outcomes[5], UnknownStream)


@pytest.mark.redis
async def test_calls_fail_with_store_unavailable_once_the_store_is_closed(make_redis_store):
    store = make_redis_store()
    ((session, life),) = await _streams(store, 1)
    await store.close()
    with pytest.raises(StoreUnavailable):
        await store.append(session, life, "x", None)
