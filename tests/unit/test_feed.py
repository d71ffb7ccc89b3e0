"""The local feed that carries a stream on through a store outage (mcp_sse_gateway.feed)."""

from __future__ import annotations

import asyncio

from mcp_sse_gateway.feed import FeedEvent, LocalFeed
from mcp_sse_gateway.store.base import StoredEvent


def _recent(first: int, last: int) -> list[StoredEvent]:
    return [StoredEvent(offset, f"e{offset}") for offset in range(first, last + 1)]


def test_a_reader_behind_gets_the_stored_events_it_missed_then_the_unstored_ones():
    feed = LocalFeed(_recent(5, 8))
    feed.push("new", "progress")
    position = feed.position_after(6)
    assert feed.read(position, 10) == [
        FeedEvent(7, "e7"),
        FeedEvent(8, "e8"),
        FeedEvent(None, "new", "progress"),
    ]


def test_a_reader_at_or_past_the_last_stored_event_starts_at_the_unstored_ones():
    feed = LocalFeed(_recent(5, 8))
    feed.push("new", None)
    assert feed.read(feed.position_after(8), 10) == [FeedEvent(None, "new")]
    assert feed.position_after(8) == feed.position_after(9)


def test_a_reader_further_behind_than_remembered_cannot_continue():
    feed = LocalFeed(_recent(5, 8))
    assert feed.position_after(4) == 0
    assert feed.position_after(3) is None


def test_an_empty_recent_window_starts_at_the_first_unstored_event():
    feed = LocalFeed([])
    feed.push("a", None)
    assert feed.read(feed.position_after(0), 10) == [FeedEvent(None, "a")]


def test_the_bound_drops_the_oldest_and_a_reader_behind_it_is_told():
    feed = LocalFeed(_recent(1, 2), max_events=3)
    for index in range(3):
        feed.push(f"n{index}", None)
    assert feed.read(0, 10) is None
    assert [e.data for e in feed.read(2, 10)] == ["n0", "n1", "n2"]
    assert feed.end == 5


async def test_wait_wakes_on_push_and_on_close_and_times_out_otherwise():
    feed = LocalFeed([])
    assert await feed.wait(0, 0.01) is False
    waiter = asyncio.ensure_future(feed.wait(0, 5))
    await asyncio.sleep(0)
    feed.push("a", None)
    assert await asyncio.wait_for(waiter, 5) is True
    waiter = asyncio.ensure_future(feed.wait(1, 5))
    await asyncio.sleep(0)
    feed.close()
    assert await asyncio.wait_for(waiter, 5) is True
    assert await feed.wait(1, 5) is True
