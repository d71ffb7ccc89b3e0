"""The lane: one Redis connection of the store's own for paced streams' lone calls.

A paced stream (one event per upstream read) makes every append a call of its own, which finds
nothing to batch with (:mod:`~mcp_sse_gateway.store.redis.batches`). Through redis-py, each such
round trip cost several times what Redis itself spends on it: the pool's lock, counters and
connection check on ``get_connection`` and ``release``, a task of its own for the write under
``socket_timeout`` (``asyncio.wait_for``), and the stream reader's and the parser's layers on
the read. The lane instead:

* connects with redis-py (address, credentials, database, TLS, client name, protocol: the
  pool's options, its handshake), then **takes the socket over**: the connection's transport
  is given a :class:`LaneConnection` as its protocol, which writes each call's packed commands
  with one ``transport.write`` and parses replies as they arrive with a hiredis reader of its
  own, in the transport's callback, resolving the caller's future there;
* serves one call at a time, from the caller's own task (a pump's), under the call's permit
  and stall timeout (:mod:`~mcp_sse_gateway.store.redis.calls`); nothing else ever writes to
  or reads from it;
* is dropped after any failed use (a stall, a cancellation, a connection Redis closed, a reply
  that answers nothing asked), so no reply is ever left unread on it, and made again in the
  background.

Closing a taken-over connection closes its transport; the original stream protocol is told the
connection was lost, so redis-py's view of it (``disconnect``) stays consistent.
"""

from __future__ import annotations

import asyncio
from typing import Any

import hiredis
import structlog
from redis import exceptions as redis_errors
from redis._parsers import BaseParser
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection

log = structlog.get_logger("mcp_sse_gateway.store")

#: After the lane failed to connect, it tries again this much later at the earliest, seconds.
LANE_RETRY_S = 1.0


class LaneBroken(Exception):
    """The lane's connection broke before its call was answered: the call goes to a pipeline."""


class LaneUnsupported(RuntimeError):
    """redis-py's connections expose no transport to take over: the lane is never used."""


class LaneConnection(asyncio.Protocol):
    """A connected redis-py connection whose socket the lane writes and reads itself.

    Made by :meth:`take_over`. One exchange at a time; replies are parsed in
    :meth:`data_received` (hiredis) and handed to the waiting exchange there, without a task or
    a stream reader in between.

    Args:
        connection: the redis-py connection, connected (its handshake done).
        transport: its transport, whose protocol this becomes.
        original: the transport's protocol before (told of the connection's loss).
        reader: the reply parser, configured as redis-py's own for this connection.
    """

    def __init__(
        self,
        connection: AbstractConnection,
        transport: asyncio.Transport,
        original: asyncio.BaseProtocol,
        reader: hiredis.Reader,
    ) -> None:
        self.connection = connection
        self._transport = transport
        self._original = original
        self._reader = reader
        self._waiter: asyncio.Future[list[Any]] | None = None
        self._expected = 0
        self._replies: list[Any] = []
        #: No exchange may use it any more: lost, or a reply went astray.
        self.closed = False

    @classmethod
    def take_over(cls, connection: AbstractConnection) -> LaneConnection:
        """Make the socket of the connected *connection* the lane's.

        Raises:
            LaneUnsupported: *connection* exposes no transport to take over (another redis-py
                connection class or version).
            redis.exceptions.ConnectionError: this connection cannot be taken over now: it is
                closing (Redis closed it as the handshake ended), or bytes were left unread on
                it (they would be taken for the first call's reply).
        """
        writer = getattr(connection, "_writer", None)
        stream = getattr(connection, "_reader", None)
        transport = getattr(writer, "transport", None)
        if not isinstance(transport, asyncio.Transport) or not isinstance(
            stream, asyncio.StreamReader
        ):
            raise LaneUnsupported("the redis-py connection exposes no transport")
        if transport.is_closing() or getattr(stream, "_buffer", None) or stream.at_eof():
            raise redis_errors.ConnectionError("the connection closed or left bytes unread")
        encoder = connection.encoder
        options: dict[str, Any] = {
            "protocolError": redis_errors.InvalidResponse,
            "replyError": BaseParser.parse_error,
        }
        if encoder.decode_responses:
            options["encoding"] = encoder.encoding
            options["errors"] = encoder.encoding_errors
        lane = cls(connection, transport, transport.get_protocol(), hiredis.Reader(**options))
        transport.set_protocol(lane)
        return lane

    async def exchange(self, packed: list[bytes]) -> list[Any]:
        """Write the *packed* commands and wait for their replies, error replies as values.

        Raises:
            redis.exceptions.ConnectionError: the connection is closed, broke, or answered out
                of turn (the lane then drops it); also a reply redis-py raises as one
                (``LOADING``, ``NOAUTH``). Cancelled: the connection is unusable from then on.
        """
        if self.closed or self._waiter is not None or self._transport.is_closing():
            raise redis_errors.ConnectionError("the lane's connection is closed")
        waiter: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._waiter, self._expected, self._replies = waiter, len(packed), []
        try:
            self._transport.write(packed[0] if len(packed) == 1 else b"".join(packed))
        except Exception as exc:  # whatever the transport raises, it is broken
            self._waiter = None  # no one will wait on it: the error is raised here
            self.abort()
            raise redis_errors.ConnectionError("the lane's connection failed to write") from exc
        try:
            replies = await waiter
        except BaseException:
            # Cut short (the stall timeout, a cancellation): a reply may still come.
            self.closed = True
            self._waiter = None
            raise
        for reply in replies:
            if isinstance(reply, redis_errors.ConnectionError):
                self.closed = True
                raise reply
        return replies

    def abort(self) -> None:
        """Close the socket at once, dropping what was not sent (no exchange may follow).

        A write still buffered (a large event), or a TLS close a frozen Redis never answers,
        must not hold a dropped connection open, nor the store's close. Idempotent.
        """
        self.closed = True
        self._transport.abort()

    # asyncio.Protocol ---------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        """Parse the replies in *data*; a complete exchange's resolves its caller's future."""
        self._reader.feed(data)
        while True:
            try:
                reply = self._reader.gets()
            except Exception as exc:  # noqa: BLE001 - a protocol error: the socket is unusable
                self._fail(redis_errors.ConnectionError(f"unreadable reply: {exc}"))
                return
            if reply is False:
                return
            if isinstance(reply, getattr(hiredis, "PushNotification", ())):
                continue  # RESP3 out-of-band data, not a reply
            waiter = self._waiter
            if waiter is None or waiter.done():
                self._fail(redis_errors.ConnectionError("a reply answered nothing asked"))
                return
            self._replies.append(reply)
            if len(self._replies) == self._expected:
                self._waiter = None
                waiter.set_result(self._replies)

    def eof_received(self) -> bool | None:
        """Redis closed its end: let the transport close (:meth:`connection_lost` follows)."""
        return None  # the transport closes itself; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        """Fail the exchange in flight; tell the stream protocol redis-py reads (its end)."""
        self._fail(redis_errors.ConnectionError("the lane's connection was closed"), close=False)
        self._original.connection_lost(exc)

    def _fail(self, error: Exception, *, close: bool = True) -> None:
        self.closed = True
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        if close:
            self._transport.abort()


class Lane:
    """One connection of the store's own, outside the pool, for lone calls of paced streams.

    The connection is redis-py's, made with the pool's options, and then taken over
    (:class:`LaneConnection`, module docstring). A redis-py whose connections expose no
    transport to take over leaves the lane unused (logged once): every call goes to a
    pipeline.

    It is connected in the background (never by a caller, so connecting never counts toward a
    call's stall timeout): first when a call wants it, again as soon as it was dropped, and after
    a failure to connect, :data:`LANE_RETRY_S` later at the earliest. A call that finds it busy,
    not connected or closed goes to a pipeline. A call whose use of it failed in any way (the
    stall timeout, a cancellation, a connection Redis closed) drops it, so no reply is ever left
    unread on it.
    It adds one client connection to Redis.

    Args:
        client: the command client; the lane's connection has its pool's options (address,
            credentials, TLS, client name).
        stall_timeout_s: bound on connecting, seconds.
    """

    def __init__(self, client: Redis, stall_timeout_s: float) -> None:
        self._pool = client.connection_pool
        self._stall_s = stall_timeout_s
        self._connection: LaneConnection | None = None
        #: The connections cannot be taken over: the lane is never used.
        self._unsupported = False
        #: A caller holds the connection (set: none does).
        self._idle = asyncio.Event()
        self._idle.set()
        self._connecting: asyncio.Task[None] | None = None
        self._retry_at = float("-inf")
        self._closed = False
        #: Closes under way (a reference keeps each task alive until it is done).
        self._closing: set[asyncio.Task[None]] = set()
        #: Connections made so far (for tests).
        self.connects = 0

    def take(self) -> LaneConnection | None:
        """The lane's connection, now the caller's, if it is connected and idle; else None.

        With no connection, or one Redis closed while it was idle, one is made in the
        background for later calls.
        """
        if not self._idle.is_set():
            return None
        connection = self._connection
        if connection is None or connection.closed:
            if connection is not None:
                self._close_soon(connection)
            self._connection = None
            self._connect_soon()
            return None
        self._idle.clear()
        return connection

    def give_back(self, connection: LaneConnection, *, reusable: bool) -> None:
        """End the caller's use of *connection*; unless *reusable*, it is dropped (closed)."""
        self._idle.set()
        if connection is self._connection and reusable and not (self._closed or connection.closed):
            return
        if self._connection is connection:
            self._connection = None
        self._close_soon(connection)
        if self._connection is None:
            self._connect_soon()  # a new one, for the next lone call

    def _connect_soon(self) -> None:
        if self._closed or self._unsupported or self._connecting is not None:
            return
        loop = asyncio.get_running_loop()
        if loop.time() < self._retry_at:
            return
        self._connecting = loop.create_task(self._connect())

    async def _connect(self) -> None:
        connection: AbstractConnection = self._pool.make_connection()  # type: ignore[no-untyped-call]
        try:
            async with asyncio.timeout(self._stall_s):
                await connection.connect()  # type: ignore[no-untyped-call]
        except BaseException as exc:
            # Any failure: pipelines go on, the lane tries again later (or never: closed).
            self._retry_at = asyncio.get_running_loop().time() + LANE_RETRY_S
            self._disconnect_soon(connection)
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            self._connecting = None
        try:
            lane = LaneConnection.take_over(connection)
        except LaneUnsupported as exc:
            self._unsupported = True
            self._disconnect_soon(connection)
            log.warning("store.lane_unavailable", reason=str(exc))
            return
        except redis_errors.ConnectionError:
            # This connection only (Redis closed it just now): tried again later, as a failed
            # connect is.
            self._retry_at = asyncio.get_running_loop().time() + LANE_RETRY_S
            self._disconnect_soon(connection)
            return
        self.connects += 1
        if self._closed or self._connection is not None:
            self._close_soon(lane)
        else:
            self._connection = lane

    def _close_soon(self, connection: LaneConnection) -> None:
        """Drop *connection* (after a failure, or not the lane's any more) at once."""
        connection.abort()
        self._disconnect_soon(connection.connection)

    def _disconnect_soon(self, connection: AbstractConnection) -> None:
        """Let redis-py forget *connection* without waiting for its socket to close."""
        task = asyncio.get_running_loop().create_task(connection.disconnect(nowait=True))
        self._closing.add(task)
        task.add_done_callback(self._closed_one)

    def _closed_one(self, task: asyncio.Task[None]) -> None:
        self._closing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # The connection is gone either way; nothing to tell but that it closed badly.
            log.debug("store.lane_close_failed", error=type(task.exception()).__name__)

    async def close(self) -> None:
        """Close the connection, once a call using it ended (within its stall timeout).

        Idempotent; later calls never take the lane.
        """
        self._closed = True
        connecting = self._connecting
        if connecting is not None:
            connecting.cancel()
            await asyncio.gather(connecting, return_exceptions=True)
        await self._idle.wait()
        connection, self._connection = self._connection, None
        if connection is not None:
            # At once, not orderly: a Redis that stopped answering (a TLS close is a round
            # trip) must not hold the store's close up, nor fail it.
            self._close_soon(connection)
        if self._closing:  # nothing adds to them now
            await asyncio.gather(*list(self._closing), return_exceptions=True)
