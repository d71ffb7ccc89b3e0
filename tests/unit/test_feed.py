"""The local feed of a request stream (mcp_sse_gateway.feed): live tail and outage carrier."""

from __future__ import annotations

import asyncio

from mcp_sse_gateway.streams.feed import AHEAD_BYTES, RECENT_EVENTS, FeedEvent, LocalFeed


def _pairs(*datas: str) -> list[tuple[str, str | None]]:
    return [(data, None) for data in datas]


def test_stored_events_are_read_by_position_offset_minus_one():
    feed = LocalFeed()
    feed.add_stored(1, _pairs("a", "b"))
    feed.add_stored(3, [("c", "progress")])
    assert feed.read(0, 10) == [FeedEvent(1, "a"), FeedEvent(2, "b"), FeedEvent(3, "c", "progress")]
    assert feed.read(2, 10) == [FeedEvent(3, "c", "progress")]
    assert feed.read(3, 10) == []  # caught up
    assert feed.read(1, 1) == [FeedEvent(2, "b")]


def test_events_the_reader_passed_are_trimmed_to_the_recent_bounds():
    feed = LocalFeed()
    feed.add_stored(1, _pairs(*(str(i) for i in range(RECENT_EVENTS + 10))))
    assert feed.read(0, 1) == [FeedEvent(1, "0")]  # nothing trimmed before the reader passed
    assert feed.read(RECENT_EVENTS + 10, 1) == []  # the reader is at the end
    feed.add_stored(feed.end + 1, _pairs("new"))
    assert feed.read(10, 1) is None  # passed, beyond the recent bound: read from the store
    assert feed.read(11, 1) == [FeedEvent(12, "11")]


def test_events_ahead_of_the_reader_are_kept_up_to_the_hard_bound():
    feed = LocalFeed()
    big = "x" * (AHEAD_BYTES // 2 + 1)
    feed.add_stored(1, _pairs("a", big, big))
    assert feed.read(0, 1) is None  # beyond the hard bound even though not read yet
    assert feed.read(2, 5) == [FeedEvent(3, big)]


def test_a_gap_in_offsets_restarts_the_window():
    feed = LocalFeed()
    feed.add_stored(1, _pairs("a"))
    feed.add_stored(5, _pairs("e"))
    assert feed.read(0, 10) is None
    assert feed.read(4, 10) == [FeedEvent(5, "e")]


def test_lost_mode_keeps_unstored_events_after_the_stored_ones():
    feed = LocalFeed(max_lost_events=3)
    feed.add_stored(1, _pairs("a", "b"))
    feed.lose()
    feed.push("c", None)
    assert feed.lost
    assert feed.read(1, 10) == [FeedEvent(2, "b"), FeedEvent(None, "c")]
    feed.push("d", None)
    feed.push("e", None)  # the bound drops the oldest: a reader that needed it is told
    assert feed.read(0, 10) is None
    assert [e.data for e in feed.read(2, 10)] == ["c", "d", "e"]


async def test_wait_wakes_on_new_events_and_on_close_and_times_out_otherwise():
    feed = LocalFeed()
    assert await feed.wait(0, 0.01) is False
    waiter = asyncio.ensure_future(feed.wait(0, 5))
    await asyncio.sleep(0)
    feed.add_stored(1, _pairs("a"))
    assert await asyncio.wait_for(waiter, 5) is True
    waiter = asyncio.ensure_future(feed.wait(1, 5))
    await asyncio.sleep(0)
    feed.close()
    assert await asyncio.wait_for(waiter, 5) is True
    assert await feed.wait(1, 5) is True
