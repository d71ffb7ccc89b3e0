"""The memory store's session records: TTL, LRU bound, tombstones, digests."""

from __future__ import annotations

from mcp_sse_gateway.store.base import session_digest
from mcp_sse_gateway.store.memory import TOMBSTONE_TTL_S, MemoryStore


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_record_expires_after_idle_ttl_and_use_refreshes_it():
    clock = Clock()
    store = MemoryStore(session_idle_ttl_s=10, clock=clock)
    await store.record_session("a", "2025-11-25")
    clock.now = 9
    assert (await store.get_session("a")).protocol_version == "2025-11-25"
    clock.now = 18
    assert await store.get_session("a") is not None
    clock.now = 28.5
    assert await store.get_session("a") is None


async def test_bounded_number_of_sessions_evicts_least_recently_used():
    store = MemoryStore(session_idle_ttl_s=100, max_sessions=2)
    await store.record_session("a", "v")
    await store.record_session("b", "v")
    await store.get_session("a")
    await store.record_session("c", "v")
    assert await store.get_session("b") is None
    assert await store.get_session("a") is not None


async def test_tombstone_is_kept_then_expires():
    clock = Clock()
    store = MemoryStore(session_idle_ttl_s=10_000, clock=clock)
    await store.record_session("a", "2025-06-18")
    await store.tombstone_session("a")
    record = await store.get_session("a")
    assert record.deleted
    assert record.protocol_version == "2025-06-18"
    clock.now = TOMBSTONE_TTL_S + 1
    assert await store.get_session("a") is None


async def test_keys_are_digests_never_raw_ids():
    store = MemoryStore(session_idle_ttl_s=10)
    await store.record_session("secret-session", "v")
    record = await store.get_session("secret-session")
    assert record.key == session_digest("secret-session")
    assert "secret" not in record.key
    assert len(record.key) == 32
    await store.close()
    await store.close()
    assert await store.get_session("secret-session") is None
