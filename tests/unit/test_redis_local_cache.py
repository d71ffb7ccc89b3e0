"""What one replica remembers to save Redis round trips: bounded, never stale past its bound."""

from __future__ import annotations

from mcp_sse_gateway.store.base import SessionRecord
from mcp_sse_gateway.store.redis.local_cache import Refreshes, SessionCache


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_stream_is_refreshed_at_most_once_per_period():
    clock = Clock()
    refreshes = Refreshes(30.0, clock=clock)
    assert refreshes.due("d", "life") is True
    clock.now += 29.9
    assert refreshes.due("d", "life") is False
    assert refreshes.due("d", "other") is True
    clock.now += 0.2
    assert refreshes.due("d", "life") is True


def test_refreshes_are_bounded():
    refreshes = Refreshes(30.0, limit=10)
    for index in range(100):
        refreshes.due("d", str(index))
    assert len(refreshes) == 10


def test_a_record_is_served_for_its_ttl_then_read_again():
    clock = Clock()
    cache = SessionCache(1.0, clock=clock)
    record = SessionRecord("d", "2025-11-25")
    cache.put(record)
    assert cache.get("d", refresh=True) is record
    clock.now += 1.0
    assert cache.get("d", refresh=True) is None


def test_a_read_that_refreshed_nothing_does_not_answer_client_traffic():
    cache = SessionCache(1.0)
    cache.start_read("d")
    cache.finish_read("d", SessionRecord("d", "v"), refreshed=False)
    assert cache.get("d", refresh=False) is not None
    assert cache.get("d", refresh=True) is None  # the session's TTLs must be refreshed


def test_a_record_read_while_the_session_changed_here_is_not_kept():
    cache = SessionCache(1.0)
    cache.start_read("d")
    cache.forget("d")  # a DELETE (or initialize) on this replica, while the read was in flight
    cache.finish_read("d", SessionRecord("d", "v"), refreshed=True)
    assert cache.get("d", refresh=False) is None
    cache.start_read("d")  # the next read is kept again
    cache.finish_read("d", SessionRecord("d", "v"), refreshed=True)
    assert cache.get("d", refresh=True) is not None


def test_absent_sessions_are_not_cached_and_the_table_is_bounded():
    cache = SessionCache(1.0, limit=5)
    cache.start_read("gone")
    cache.finish_read("gone", None, refreshed=True)
    assert cache.get("gone", refresh=False) is None
    for index in range(50):
        cache.put(SessionRecord(str(index), "v"))
    assert len(cache) == 5
