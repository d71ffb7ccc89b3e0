"""The lease of a session's standalone stream, and its newest reader (DESIGN D5), on every backend.

One replica at a time holds a session's lease (it pumps the session's one upstream GET); the
lease expires unless renewed, another replica then takes it over with a new fencing epoch, and
appends under a stale epoch are refused. A client connection that attaches to a stream claims
it: the claim wakes every waiter, and reads name the newest reader, so an older connection on
any replica learns that it was replaced.
"""

from __future__ import annotations

import asyncio

import pytest

from mcp_sse_gateway.errors import LeaseLost
from mcp_sse_gateway.event_ids import new_life
from tests.support.waiting import eventually, parked

SHORT_TTL_S = 0.3
LONG_TTL_S = 30.0


async def test_one_replica_holds_a_sessions_lease_and_renews_it(make_store):
    store = make_store()
    lease = await store.acquire_lease("s", "r1", LONG_TTL_S)
    assert lease is not None
    assert lease.holder == "r1"
    assert await store.acquire_lease("s", "r2", LONG_TTL_S) is None
    assert await store.acquire_lease("s", "r1", LONG_TTL_S) == lease  # asked again: kept
    assert await store.renew_lease("s", lease, LONG_TTL_S) is True
    other = await store.acquire_lease("other-session", "r2", LONG_TTL_S)
    assert other is not None  # one lease per session


async def test_an_expired_lease_is_taken_over_under_a_new_epoch(make_store):
    store = make_store()
    old = await store.acquire_lease("s", "r1", SHORT_TTL_S)
    assert old is not None
    taken: list[object] = []

    async def take_over() -> bool:
        lease = await store.acquire_lease("s", "r2", LONG_TTL_S)
        taken.append(lease)
        return lease is not None

    await eventually(take_over)
    new = taken[-1]
    assert new.holder == "r2"
    assert new.epoch != old.epoch
    assert await store.renew_lease("s", old, LONG_TTL_S) is False  # the former holder lost it
    assert await store.renew_lease("s", new, LONG_TTL_S) is True


async def test_a_released_lease_is_free_at_once_and_only_its_holder_releases_it(make_store):
    store = make_store()
    first = await store.acquire_lease("s", "r1", LONG_TTL_S)
    assert first is not None
    await store.release_lease("s", first)
    second = await store.acquire_lease("s", "r2", LONG_TTL_S)
    assert second is not None
    await store.release_lease("s", first)  # stale: no effect
    assert await store.acquire_lease("s", "r3", LONG_TTL_S) is None
    assert await store.renew_lease("s", second, LONG_TTL_S) is True


async def test_appends_under_a_stale_lease_are_refused(make_store):
    store = make_store()
    life = new_life()
    await store.create_stream("s", life, kind="standalone", owner="r1")
    old = await store.acquire_lease("s", "r1", SHORT_TTL_S)
    assert old is not None
    assert await store.append_many("s", life, [("a", None)], lease=old) == 1
    await eventually(lambda: _acquired(store, "r2"))
    new = await store.acquire_lease("s", "r2", LONG_TTL_S)
    assert new is not None
    with pytest.raises(LeaseLost):
        await store.append_many("s", life, [("late", None)], lease=old)
    assert await store.append_many("s", life, [("b", None)], lease=new) == 2
    result = await store.read("s", life, 0, 10)
    assert [e.data for e in result.events] == ["a", "b"]  # nothing of the paused former holder


async def _acquired(store, holder: str) -> bool:
    lease = await store.acquire_lease("s", holder, LONG_TTL_S)
    if lease is None:
        return False
    await store.release_lease("s", lease)
    return True


async def test_a_claim_wakes_the_streams_waiters_and_reads_name_the_newest_reader(make_store):
    store = make_store()
    life = new_life()
    await store.create_stream("s", life, kind="standalone", owner="r1")
    assert (await store.read("s", life, 0, 10)).reader == ""
    await store.claim_reader("s", life, "older")
    waiter = asyncio.create_task(store.wait("s", life, 0, 10))
    await eventually(lambda: parked(store, 1))
    await store.claim_reader("s", life, "newer")
    assert await asyncio.wait_for(waiter, 5) is True
    result = await store.read("s", life, 0, 10)
    assert result.reader == "newer"
    assert result.events == []


async def test_a_claim_before_the_wait_is_news_to_a_reader_that_names_its_own(make_store):
    store = make_store()
    life = new_life()
    await store.create_stream("s", life, kind="standalone", owner="r1")
    await store.claim_reader("s", life, "older")
    # The older reader read (nothing new) ... a newer connection claims ... the older waits:
    await store.claim_reader("s", life, "newer")
    assert await asyncio.wait_for(store.wait("s", life, 0, 10, reader="older"), 5) is True
    assert await store.wait("s", life, 0, 0.05, reader="newer") is False
