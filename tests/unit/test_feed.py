"""The local feed of a request stream (mcp_sse_gateway.feed): live tail and outage carrier."""

from __future__ import annotations

import asyncio

from mcp_sse_gateway.streams.alarm import SLACK_S, Alarm
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


def test_lost_mode_bounds_unstored_events_by_bytes_and_trims_what_the_reader_passed():
    """Unstored events of any size: the feed holds at most AHEAD_BYTES of them unread (a
    reader that needed the dropped ones is cut), and what its reader passed goes beyond the
    recent bounds, as for stored events."""
    feed = LocalFeed()
    feed.lose()
    big = "x" * (64 * 1024)
    pushed = 3 * AHEAD_BYTES // len(big)
    for _ in range(pushed):
        feed.push(big, None)
    held = feed.read(feed.end - pushed, 1)
    assert held is None  # the oldest are gone
    first_kept = next(p for p in range(feed.end) if feed.read(p, 1) is not None)
    assert (feed.end - first_kept) * len(big) <= AHEAD_BYTES
    assert feed.read(feed.end - 1, 1) == [FeedEvent(None, big)]  # the reader passed the rest
    for _ in range(RECENT_EVENTS):
        feed.push("small", None)
    assert feed.read(first_kept, 1) is None  # passed and trimmed: the big ones went first


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


async def test_a_waiter_is_resolved_by_the_next_change_and_forgotten_if_not():
    feed = LocalFeed()
    feed.add_stored(1, _pairs("a"))
    assert feed.waiter(0) is None  # an event at the position already
    first, second = feed.waiter(1), feed.waiter(1)
    assert first is not None
    assert second is not None
    second.cancel()  # a reader cancelled meanwhile: skipped, not an error
    feed.add_stored(2, _pairs("b"))
    assert first.result() is True
    timed_out = feed.waiter(2)
    assert timed_out is not None
    timed_out.set_result(False)  # its alarm rang
    feed.forget(timed_out)
    feed.forget(timed_out)  # idempotent
    assert feed._waiters == []
    feed.close()
    assert feed.waiter(2) is None  # closed: nothing to wait for


class _CountingLoop:
    """The running loop, counting the timers scheduled through it."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.timers = 0

    def call_at(self, when: float, callback, *args):
        self.timers += 1
        return self.loop.call_at(when, callback, *args)

    def time(self) -> float:
        return self.loop.time()


async def test_an_alarm_moved_later_schedules_no_new_timer_and_rings_at_the_last_deadline():
    counting = _CountingLoop()
    loop = counting.loop
    alarm = Alarm(counting)  # type: ignore[arg-type]
    started = loop.time()
    for step in range(100):  # a connection that gets an event every "step", its deadline moving
        waiter = loop.create_future()
        alarm.arm(waiter, started + 0.05 + step * 0.001)
        waiter.set_result(True)  # news came before the deadline
        alarm.disarm()
    last = loop.create_future()
    deadline = started + 0.2
    alarm.arm(last, deadline)
    assert await asyncio.wait_for(last, 5) is False
    assert loop.time() + SLACK_S >= deadline  # not at the first timer's due time
    assert counting.timers <= 3  # the first timer, and its re-arming for the last deadline
    alarm.close()


async def test_an_alarm_moved_earlier_rings_at_the_earlier_deadline():
    loop = asyncio.get_running_loop()
    alarm = Alarm(loop)
    alarm.arm(loop.create_future(), loop.time() + 60)
    early = loop.create_future()
    alarm.arm(early, loop.time() + 0.01)
    assert await asyncio.wait_for(early, 5) is False
    alarm.close()


async def test_a_closed_or_disarmed_alarm_resolves_nothing():
    loop = asyncio.get_running_loop()
    alarm = Alarm(loop)
    disarmed = loop.create_future()
    alarm.arm(disarmed, loop.time())
    alarm.disarm()
    closed = loop.create_future()
    alarm.arm(closed, loop.time())
    alarm.close()
    alarm.close()  # idempotent
    probe = loop.create_future()
    loop.call_later(0.02, probe.set_result, None)
    await asyncio.wait_for(probe, 5)  # well past both deadlines
    assert not disarmed.done()
    assert not closed.done()


# A reader parked at the end ----------------------------------------------------------------


async def test_a_parked_reader_takes_the_events_that_follow_it_and_is_not_woken():
    feed = LocalFeed()
    feed.add_stored(1, _pairs("a"))
    assert feed.read(1, 10) == []
    waiter = feed.waiter(1)
    assert waiter is not None
    taken: list[list[FeedEvent]] = []
    feed.park(1, waiter, lambda events: taken.append(list(events)) is None)
    assert feed.parked
    feed.add_stored(2, [("b", None), ("c", "progress")])
    assert taken == [[FeedEvent(2, "b"), FeedEvent(3, "c", "progress")]]
    assert not waiter.done()  # it took them itself: no wake-up
    assert feed.reader_at == feed.end == 3
    feed.add_stored(4, _pairs("d"))  # still parked, now at the new end
    assert taken[-1] == [FeedEvent(4, "d")]
    assert feed.read(2, 10) == [FeedEvent(3, "c", "progress"), FeedEvent(4, "d")]  # kept too
    feed.forget(waiter)
    assert not feed.parked
    feed.add_stored(5, _pairs("e"))
    assert len(taken) == 2  # unparked: nothing more is handed over


async def test_a_parked_reader_that_declines_or_fails_is_woken_and_the_events_kept():
    feed = LocalFeed()
    other = feed.waiter(0)  # another waiter on the feed is woken either way
    waiter = feed.waiter(0)
    assert waiter is not None
    assert other is not None
    feed.park(0, waiter, lambda _events: False)
    feed.add_stored(1, _pairs("a"))
    assert waiter.result() is True
    assert other.result() is True
    assert feed.reader_at == 0  # not taken: the reader reads it itself
    assert feed.read(0, 10) == [FeedEvent(1, "a")]

    def broken(events: object) -> bool:
        raise RuntimeError("a reader's bug")

    waiter = feed.waiter(1)
    assert waiter is not None
    feed.park(1, waiter, broken)
    feed.add_stored(2, _pairs("b"))  # the pump's call does not fail with it
    assert waiter.result() is True
    assert feed.read(1, 10) == [FeedEvent(2, "b")]


async def test_a_parked_reader_is_not_handed_events_it_is_not_right_before():
    feed = LocalFeed()
    feed.add_stored(1, _pairs("a"))
    calls: list[object] = []
    waiter = feed.waiter(1)
    assert waiter is not None
    feed.park(1, waiter, lambda events: calls.append(events) is None)
    feed.add_stored(5, _pairs("e"))  # a gap: the feed starts over, the reader reads the store
    assert calls == []
    assert waiter.result() is True
    waiter = feed.waiter(5)
    assert waiter is not None
    feed.park(5, waiter, lambda events: calls.append(events) is None)
    feed.lose()
    feed.push("f", None)  # unstored events always wake the reader
    assert calls == []
    assert waiter.result() is True
