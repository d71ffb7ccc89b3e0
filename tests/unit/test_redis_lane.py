"""The Redis store's lane (one connection of its own for paced streams' lone calls).

Who owns its connection when, so that none is ever left open or used by two calls at once, and
how the taken-over socket reads replies: what a reply split across reads, a pipeline, an error
reply, a reply nobody asked for, a cut call and a closed socket do. The connections here are
redis-py stand-ins over a socket pair (a real transport, a scripted "Redis" at the other end);
the lane on a real Redis is tested in tests/store/test_redis_batches.py.
"""

from __future__ import annotations

import asyncio
import gc
import socket
from types import SimpleNamespace

import pytest
from redis import exceptions as redis_errors

from mcp_sse_gateway.store.redis import lane as lane_module
from mcp_sse_gateway.store.redis.lane import Lane, LaneConnection
from tests.support.waiting import eventually

PING = b"*1\r\n$4\r\nPING\r\n"


class _Connection:
    """What the lane uses of a redis-py asyncio connection, over one end of a socket pair."""

    def __init__(self) -> None:
        self.encoder = SimpleNamespace(
            decode_responses=False, encoding="utf-8", encoding_errors="strict"
        )
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        #: The other end: what "Redis" reads and writes.
        self.server: socket.socket | None = None
        self.closed = False

    async def connect(self) -> None:
        mine, theirs = socket.socketpair()
        theirs.setblocking(False)
        self.server = theirs
        self._reader, self._writer = await asyncio.open_connection(sock=mine)

    async def disconnect(self, nowait: bool = False) -> None:
        if self._writer is not None:
            self._writer.close()
            if not nowait:
                await self._writer.wait_closed()
        self._reader = self._writer = None
        self.closed = True
        if self.server is not None:
            self.server.close()


class _Pool:
    """Makes connections of *kinds* in turn, then plain ones."""

    def __init__(self, *kinds: type[_Connection]) -> None:
        self.made: list[_Connection] = []
        self._kinds = list(kinds)

    def make_connection(self) -> _Connection:
        kind = self._kinds.pop(0) if self._kinds else _Connection
        self.made.append(kind())
        return self.made[-1]


def _lane(*kinds: type[_Connection]) -> tuple[Lane, _Pool]:
    pool = _Pool(*kinds)
    return Lane(SimpleNamespace(connection_pool=pool), stall_timeout_s=1.0), pool  # type: ignore[arg-type]


async def _connected(lane: Lane) -> None:
    assert lane.take() is None  # none yet: one is made in the background
    await eventually(lambda: lane.connects == 1)


async def _uses_then_closes(lane: Lane, connection: _Connection) -> None:
    """The lane's connection is now *connection*'s, and usable; then the lane closes."""
    taken = lane.take()
    assert taken is not None
    assert taken.connection is connection
    lane.give_back(taken, reusable=True)
    await lane.close()


async def _server_reads(connection: _Connection, size: int) -> bytes:
    assert connection.server is not None
    loop = asyncio.get_running_loop()
    got = b""
    while len(got) < size:
        got += await loop.sock_recv(connection.server, size - len(got))
    return got


async def _server_says(connection: _Connection, data: bytes) -> None:
    assert connection.server is not None
    await asyncio.get_running_loop().sock_sendall(connection.server, data)


async def _taken(lane: Lane, pool: _Pool) -> tuple[LaneConnection, _Connection]:
    await _connected(lane)
    taken = lane.take()
    assert taken is not None
    assert taken.connection is pool.made[0]
    return taken, pool.made[0]


# Ownership ------------------------------------------------------------------------------------


async def test_one_call_at_a_time_and_the_connection_is_kept_after_a_good_one() -> None:
    lane, pool = _lane()
    taken, _ = await _taken(lane, pool)
    assert lane.take() is None  # busy
    lane.give_back(taken, reusable=True)
    assert lane.take() is taken
    assert not taken.closed
    lane.give_back(taken, reusable=True)
    await lane.close()


async def test_a_failed_use_drops_the_connection_and_a_new_one_is_made() -> None:
    lane, pool = _lane()
    taken, _ = await _taken(lane, pool)
    lane.give_back(taken, reusable=False)
    await eventually(lambda: lane.connects == 2 and pool.made[0].closed)
    await _uses_then_closes(lane, pool.made[1])


async def test_a_connection_given_back_that_is_no_longer_the_lanes_is_closed() -> None:
    lane, pool = _lane()
    await _connected(lane)
    stray_connection = _Connection()
    await stray_connection.connect()
    stray = LaneConnection.take_over(stray_connection)  # type: ignore[arg-type]
    lane.give_back(stray, reusable=True)
    await eventually(lambda: stray_connection.closed)
    await _uses_then_closes(lane, pool.made[0])


async def test_a_connection_redis_closed_while_idle_is_not_taken_but_replaced() -> None:
    lane, pool = _lane()
    taken, connection = await _taken(lane, pool)
    lane.give_back(taken, reusable=True)
    assert connection.server is not None
    connection.server.close()  # Redis's idle timeout, or a restart
    await eventually(lambda: taken.closed)
    assert lane.take() is None
    await eventually(lambda: lane.connects == 2 and connection.closed)
    await _uses_then_closes(lane, pool.made[1])


async def test_close_waits_for_the_call_in_flight_then_closes_everything() -> None:
    lane, pool = _lane()
    taken, connection = await _taken(lane, pool)
    closing = asyncio.ensure_future(lane.close())
    await eventually(lambda: lane._closed)  # close() started, and waits for the call
    assert not closing.done()
    assert not taken.closed
    lane.give_back(taken, reusable=True)
    await asyncio.wait_for(closing, 1.0)
    assert taken.closed
    assert connection.closed
    assert lane.take() is None
    assert len(pool.made) == 1  # closed: no new connection either


async def test_connections_that_cannot_be_taken_over_leave_the_lane_unused() -> None:
    class _Opaque(_Connection):
        async def connect(self) -> None:
            await super().connect()
            # No transport to take over (another connection class keeps it elsewhere).
            self._hidden, self._writer = self._writer, None

        async def disconnect(self, nowait: bool = False) -> None:
            self._writer = self._hidden
            await super().disconnect(nowait)

    lane, pool = _lane(_Opaque, _Opaque)
    assert lane.take() is None
    await eventually(lambda: lane._connecting is None and len(pool.made) == 1)
    await eventually(lambda: pool.made[0].closed)
    assert lane.take() is None
    assert len(pool.made) == 1  # never tried again
    await lane.close()


async def test_a_connection_redis_closed_as_its_handshake_ended_is_replaced_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A TLS close can arrive with the handshake's last reply: that connection is dropped and
    # another made after LANE_RETRY_S; the lane is not taken for unsupported.
    monkeypatch.setattr(lane_module, "LANE_RETRY_S", 0.0)

    class _ClosedAtOnce(_Connection):
        async def connect(self) -> None:
            await super().connect()
            assert self.server is not None
            assert self._reader is not None
            self.server.close()
            await eventually(self._reader.at_eof)

    lane, pool = _lane(_ClosedAtOnce)
    assert lane.take() is None
    await eventually(lambda: lane._connecting is None and pool.made[0].closed)
    assert lane.connects == 0
    assert lane.take() is None  # wants one again: made now
    await eventually(lambda: lane.connects == 1)
    await _uses_then_closes(lane, pool.made[1])


# The taken-over socket ------------------------------------------------------------------------


async def test_a_reply_split_across_reads_and_a_pipeline_of_two_are_read_whole() -> None:
    lane, pool = _lane()
    taken, connection = await _taken(lane, pool)
    call = asyncio.ensure_future(taken.exchange([PING, PING]))
    assert await _server_reads(connection, 2 * len(PING)) == PING + PING
    await _server_says(connection, b"*2\r\n:1\r\n$3\r\nab")
    await asyncio.sleep(0)
    assert not call.done()
    await _server_says(connection, b"c\r\n+PONG\r\n")
    assert await asyncio.wait_for(call, 1.0) == [[1, b"abc"], b"PONG"]
    assert not taken.closed
    lane.give_back(taken, reusable=True)
    await lane.close()


async def test_error_replies_are_values_as_redis_py_makes_them() -> None:
    lane, pool = _lane()
    taken, connection = await _taken(lane, pool)
    call = asyncio.ensure_future(taken.exchange([PING, PING]))
    await _server_reads(connection, 2 * len(PING))
    await _server_says(connection, b"-NOSCRIPT No matching script.\r\n-ERR boom\r\n")
    first, second = await asyncio.wait_for(call, 1.0)
    assert isinstance(first, redis_errors.NoScriptError)
    assert type(second) is redis_errors.ResponseError
    assert str(second) == "boom"
    assert not taken.closed
    lane.give_back(taken, reusable=True)
    await lane.close()


async def test_a_reply_redis_py_raises_as_a_connection_error_breaks_the_lane() -> None:
    lane, pool = _lane()
    taken, connection = await _taken(lane, pool)
    call = asyncio.ensure_future(taken.exchange([PING]))
    await _server_reads(connection, len(PING))
    await _server_says(connection, b"-LOADING Redis is loading the dataset in memory\r\n")
    with pytest.raises(redis_errors.BusyLoadingError):
        await asyncio.wait_for(call, 1.0)
    assert taken.closed
    lane.give_back(taken, reusable=False)
    await lane.close()


async def test_a_reply_nobody_asked_for_closes_the_connection() -> None:
    lane, pool = _lane()
    taken, connection = await _taken(lane, pool)
    lane.give_back(taken, reusable=True)
    await _server_says(connection, b"+OK\r\n")
    await eventually(lambda: taken.closed)
    with pytest.raises(redis_errors.ConnectionError):
        await taken.exchange([PING])
    await lane.close()


async def test_a_cut_call_leaves_the_connection_unusable() -> None:
    # Its reply may still come: no later call may take it for its own.
    lane, pool = _lane()
    taken, connection = await _taken(lane, pool)
    call = asyncio.ensure_future(taken.exchange([PING]))
    await _server_reads(connection, len(PING))
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert taken.closed
    with pytest.raises(redis_errors.ConnectionError):
        await taken.exchange([PING])
    lane.give_back(taken, reusable=False)
    await lane.close()


async def test_a_connection_lost_mid_call_fails_it_and_redis_py_sees_the_end() -> None:
    lane, pool = _lane()
    taken, connection = await _taken(lane, pool)
    call = asyncio.ensure_future(taken.exchange([PING]))
    await _server_reads(connection, len(PING))
    await _server_says(connection, b"*2\r\n:1\r\n")  # half a reply, then the end
    assert connection.server is not None
    connection.server.close()
    with pytest.raises(redis_errors.ConnectionError):
        await asyncio.wait_for(call, 1.0)
    assert taken.closed
    assert connection._reader is not None
    assert connection._reader.at_eof()
    lane.give_back(taken, reusable=False)
    await eventually(lambda: connection.closed)  # redis-py's disconnect did not hang
    await lane.close()


async def test_a_connection_with_unread_bytes_is_not_taken_over() -> None:
    connection = _Connection()
    await connection.connect()
    await _server_says(connection, b"+OK\r\n")
    assert connection._reader is not None
    await eventually(lambda: connection._reader is not None and connection._reader._buffer)
    with pytest.raises(redis_errors.ConnectionError):
        LaneConnection.take_over(connection)  # type: ignore[arg-type]
    await connection.disconnect()


async def test_a_write_the_transport_refuses_breaks_the_lane_not_the_call(
    loop_errors: list[dict[str, object]],
) -> None:
    # A ConnectionError (the call then goes to a pipeline), never another exception, and no
    # future left failed with no one to read it.
    lane, pool = _lane()
    taken, _ = await _taken(lane, pool)

    def refuse(data: bytes) -> None:
        raise RuntimeError("broken transport")

    taken._transport.write = refuse  # type: ignore[method-assign]
    with pytest.raises(redis_errors.ConnectionError):
        await taken.exchange([PING])
    assert taken.closed
    lane.give_back(taken, reusable=False)
    await lane.close()
    gc.collect()
    assert loop_errors == []
