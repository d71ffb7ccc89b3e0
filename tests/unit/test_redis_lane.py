"""The Redis store's lane (one connection of its own for paced streams' lone calls): who owns its
connection when, so that none is ever left open or used by two calls at once. Connections are
stand-ins here; the lane on a real Redis is tested in tests/store/test_redis_batches.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from mcp_sse_gateway.store.redis.batches import Lane
from tests.support.waiting import eventually


class _Reader:
    def __init__(self) -> None:
        self.eof = False

    def at_eof(self) -> bool:
        return self.eof


class _Connection:
    """What the lane uses of a redis-py connection."""

    def __init__(self) -> None:
        self._reader = _Reader()
        self.is_connected = False
        self.closed = False

    async def connect(self) -> None:
        self.is_connected = True

    async def disconnect(self) -> None:
        self.is_connected = False
        self.closed = True


class _Pool:
    def __init__(self) -> None:
        self.made: list[_Connection] = []

    def make_connection(self) -> _Connection:
        self.made.append(_Connection())
        return self.made[-1]


def _lane() -> tuple[Lane, _Pool]:
    pool = _Pool()
    return Lane(SimpleNamespace(connection_pool=pool), stall_timeout_s=1.0), pool  # type: ignore[arg-type]


async def _connected(lane: Lane) -> None:
    assert lane.take() is None  # none yet: one is made in the background
    await eventually(lambda: lane.connects == 1)


async def test_one_call_at_a_time_and_the_connection_is_kept_after_a_good_one() -> None:
    lane, pool = _lane()
    await _connected(lane)
    taken = lane.take()
    assert taken is pool.made[0]
    assert lane.take() is None  # busy
    lane.give_back(taken, reusable=True)
    assert lane.take() is taken
    assert not taken.closed


async def test_a_failed_use_drops_the_connection_and_a_new_one_is_made() -> None:
    lane, pool = _lane()
    await _connected(lane)
    taken = lane.take()
    lane.give_back(taken, reusable=False)
    await eventually(lambda: lane.connects == 2)
    assert pool.made[0].closed
    assert lane.take() is pool.made[1]


async def test_a_busy_lane_is_not_replaced_even_when_its_connection_looks_closed() -> None:
    # redis-py may close and reopen a connection inside a call: another call must neither take
    # it nor make a second one meanwhile.
    lane, pool = _lane()
    await _connected(lane)
    taken = lane.take()
    taken.is_connected = False
    assert lane.take() is None
    assert len(pool.made) == 1
    taken.is_connected = True
    lane.give_back(taken, reusable=True)
    assert lane.take() is taken


async def test_a_connection_given_back_that_is_no_longer_the_lanes_is_closed() -> None:
    lane, pool = _lane()
    await _connected(lane)
    stray = _Connection()
    stray.is_connected = True
    lane.give_back(stray, reusable=True)
    await eventually(lambda: stray.closed)
    assert lane.take() is pool.made[0]


async def test_a_connection_redis_closed_while_idle_is_not_taken_but_replaced() -> None:
    lane, pool = _lane()
    await _connected(lane)
    pool.made[0]._reader.eof = True  # Redis's idle timeout, or a restart
    assert lane.take() is None
    await eventually(lambda: lane.connects == 2 and pool.made[0].closed)
    assert lane.take() is pool.made[1]


async def test_close_waits_for_the_call_in_flight_then_closes_everything() -> None:
    lane, pool = _lane()
    await _connected(lane)
    taken = lane.take()
    closing = asyncio.ensure_future(lane.close())
    await eventually(lambda: lane._closed)  # close() started, and waits for the call
    assert not closing.done()
    assert not taken.closed
    lane.give_back(taken, reusable=True)
    await asyncio.wait_for(closing, 1.0)
    assert taken.closed
    assert lane.take() is None
    assert len(pool.made) == 1  # closed: no new connection either
