"""Script calls of many streams sent together: one pipeline per flush (group commit).

Thousands of concurrent streams each append an event now and then. Sent one by one, every
append is a round trip of its own: a permit, a connection taken from the pool and given back, a
write and a read, and their event-loop turns, about 200 µs of redis-py CPU each, which at 5,000
events/s is a whole core. :class:`ScriptBatches` instead queues the calls of one kind and sends
what is queued as **one pipeline** (``EVALSHA`` after ``EVALSHA``, one write, the replies read in
order), under **one permit** of the store's queue
(:mod:`~mcp_sse_gateway.store.redis.calls`):

* a call of a pump (an append or a finish, :data:`LANE_OPERATIONS`) that finds nothing of its
  kind queued or in flight, a permit free and the store's :class:`Lane` idle, is sent at once
  from its caller's own task on the lane's connection (the common case of a paced stream: no
  task is started for it and no connection taken from the pool, one loop turn less);
* otherwise a call is queued, and a flusher is started unless one is already waiting for a
  permit;
* the flusher, once it holds its permit, takes what is queued then (at most
  :data:`MAX_BATCH` calls; the rest wait for the next flusher) and sends it;
* while its pipeline is in flight, new calls queue for the next flusher, which takes another
  permit; at most :data:`MAX_IN_FLIGHT` pipelines are in flight at once, and the calls queued
  meanwhile go together in the next one.

Under load, every call queued during a round trip shares the next one. A pipeline is written on
one pooled connection as hiredis packs it and its replies read one by one (:func:`_exchange`),
without a redis-py pipeline object, whose machinery cost about as much CPU as the round trip
itself. Each call is still one atomic script of one session; a pipeline is not a transaction,
so the calls apply independently and in order.

Outcomes, per call, as a direct call would have them: the script's reply, or
:class:`~mcp_sse_gateway.errors.StoreUnavailable` (Redis down or stalled: every call of the
pipeline; an error reply: that call only; a script Redis no longer knows, after a restart, is
loaded once and the calls that needed it sent again, together). A call cancelled before its
pipeline left is not sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from hiredis import pack_command  # redis[hiredis]; redis-py's asyncio connections pack in Python
from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection

from mcp_sse_gateway.errors import StoreBusy, StoreUnavailable
from mcp_sse_gateway.store.redis.calls import NEW, Calls
from mcp_sse_gateway.store.redis.keys import SessionKeys
from mcp_sse_gateway.store.redis.lane import Lane, LaneBroken, LaneConnection
from mcp_sse_gateway.store.redis.lua import Scripts

#: Calls sent in one pipeline at most ...
MAX_BATCH = 512
#: ... and their weights together at most (at least one call): the bytes they send, or for a
#: read the bytes its reply may carry, so a pipeline's round trip stays well within the stall
#: timeout whatever it carries.
MAX_BATCH_BYTES = 16 * 1024 * 1024
#: Pipelines of one kind in flight at once: one being run by Redis while the replies of the
#: other are read; more would only make the batches smaller (Redis runs scripts one at a time).
MAX_IN_FLIGHT = 2
#: Operations whose lone call may take the lane. Their callers are the pumps, tasks of the app
#: cancelled only when it stops: a call cut short leaves its connection with a reply unread, so
#: the lane then drops it and connects again; the calls of request handlers and client
#: connections, cancelled whenever a client goes away, keep the flusher, which finishes a call
#: whose caller left.
LANE_OPERATIONS = frozenset({"append", "finish"})


@dataclass(slots=True)
class _Call:
    name: str
    keys: SessionKeys
    extra_keys: Sequence[str]
    args: Sequence[str | int]
    refresh: bool
    future: asyncio.Future[Any]
    #: When it was queued (the event loop's clock), for the queue-wait metric.
    queued_at: float
    #: Bytes it sends or may receive (see MAX_BATCH_BYTES).
    weight: int


class Batches:
    """The store's :class:`ScriptBatches`, one per (operation, priority), made on first use.

    Args:
        client: the command client (not a Redis Cluster client).
        scripts: the store's scripts.
        calls: the store's call queue and outage state; its bound of queued calls counts the
            calls waiting in batches too.
    """

    def __init__(
        self, client: Redis, scripts: Scripts, calls: Calls, *, lane: Lane | None = None
    ) -> None:
        self._client, self._scripts, self._calls = client, scripts, calls
        self._batches: dict[tuple[str, int], ScriptBatches] = {}
        #: The connection of lone pump calls (None: every call goes to a pipeline).
        self.lane = lane
        # Calls waiting in batches count toward the queue's bound of new work; the flusher
        # waiting for their permit is already in the queue's own count.
        calls.also_queued = lambda: max(0, self.queued - self.flushers_waiting)

    def of(self, operation: str, priority: int) -> ScriptBatches:
        """The batches of *operation* at *priority*."""
        batches = self._batches.get((operation, priority))
        if batches is None:
            batches = self._batches[operation, priority] = ScriptBatches(
                self._client,
                self._scripts,
                self._calls,
                operation=operation,
                priority=priority,
                refuses_new=priority == NEW,
                lane=self.lane if operation in LANE_OPERATIONS else None,
            )
        return batches

    @property
    def queued(self) -> int:
        """Calls waiting in a batch now, all operations."""
        return sum(len(batches.queued) for batches in self._batches.values())

    @property
    def flushers_waiting(self) -> int:
        """Flushers started and not yet holding their permit, all operations."""
        return sum(batches.flusher_waiting for batches in self._batches.values())

    @property
    def pipelines(self) -> int:
        """Pipelines sent so far, all operations."""
        return sum(batches.pipelines for batches in self._batches.values())

    @property
    def calls(self) -> int:
        """Calls those pipelines carried."""
        return sum(batches.calls for batches in self._batches.values())

    @property
    def alone(self) -> int:
        """Calls sent alone on the lane (counted in :attr:`pipelines` and :attr:`calls` too)."""
        return sum(batches.alone for batches in self._batches.values())

    async def close(self) -> None:
        """Wait for every pipeline in flight, then close the lane."""
        for batches in list(self._batches.values()):
            await batches.close()
        if self.lane is not None:
            await self.lane.close()


class ScriptBatches:
    """Queue script calls of one kind and send them as pipelines (module docstring).

    Args:
        client: the command client (not a Redis Cluster client: its pipelines split by node).
        scripts: the store's scripts.
        calls: the store's call queue and outage state.
        operation: the store operation the pipelines count as (metrics, logs).
        priority: the permit priority of the pipelines
            (:data:`~mcp_sse_gateway.store.redis.calls.RUNNING` for running streams).
        refuses_new: the calls are new work: refused at once with
            :class:`~mcp_sse_gateway.errors.StoreBusy` while the store's queue is full
            (``store.max_queued_calls``, batched calls included).
        lane: where a lone call goes from its caller's task (None: every call is queued).
    """

    def __init__(
        self,
        client: Redis,
        scripts: Scripts,
        calls: Calls,
        *,
        operation: str,
        priority: int,
        refuses_new: bool = False,
        lane: Lane | None = None,
    ) -> None:
        self._refuses_new = refuses_new
        self._lane = lane
        self._client = client
        self._scripts = scripts
        self._calls = calls
        self._operation = operation
        self._priority = priority
        self._queued: list[_Call] = []
        #: A flusher has started and not yet taken the queue.
        self._flusher_waiting = False
        self._flushers: set[asyncio.Task[None]] = set()
        #: Pipelines sent, calls they carried, and calls sent alone on the lane (for tests and
        #: benchmarks; a lone call counts as a pipeline of one too).
        self.pipelines = 0
        self.calls = 0
        self.alone = 0

    async def run(
        self,
        name: str,
        keys: SessionKeys,
        extra_keys: Sequence[str] = (),
        args: Sequence[str | int] = (),
        *,
        refresh: bool = True,
        weight: int | None = None,
    ) -> Any:
        """Run script *name* as :meth:`~mcp_sse_gateway.store.redis.lua.Scripts.run` does, batched.

        *weight*: the bytes the reply may carry when more than what is sent (a read).

        Raises:
            StoreUnavailable: Redis cannot be reached, stalled, or refused this call.
            StoreBusy: new work, while ``store.max_queued_calls`` calls are queued already.
        """
        if self._refuses_new and self._calls.full:
            self._calls.queue_full()
            raise StoreBusy("too many event-store calls are waiting")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if weight is None:
            weight = sum(len(arg) for arg in args if isinstance(arg, str))
        call = _Call(name, keys, extra_keys, args, refresh, future, loop.time(), weight)
        lane = self._lane
        if lane is not None and not self._queued and not self._flushers:
            calls = self._calls
            if calls.permit_free and calls.healthy and not calls.closed:
                connection = lane.take()
                if connection is not None:
                    return await self._run_alone(call, lane, connection)
        self._queued.append(call)
        self._start_flusher()
        return await future

    async def _run_alone(self, call: _Call, lane: Lane, connection: LaneConnection) -> Any:
        """Send *call* alone on the *lane*'s *connection*, from the caller's task; its outcome.

        As a pipeline of one: the same permit, stall timeout and outcomes. A connection that
        broke (Redis closed it while idle, or restarted) sends the call to a pipeline instead,
        which repeats it on a pooled connection (scripts are safe to repeat).
        """
        reusable = False
        self.alone += 1
        try:
            async with self._calls.call(self._operation, self._priority, admitted=True) as held:
                held.refused = not await self._send([call], connection)
            reusable = True
        except LaneBroken:
            self._queued.append(call)
            self._start_flusher()
        except Exception as exc:  # noqa: BLE001 - every failure is the call's outcome, as in _flush
            if not call.future.done():
                call.future.set_exception(_failure(exc))
        finally:
            lane.give_back(connection, reusable=reusable)
        return await call.future

    @property
    def queued(self) -> list[_Call]:
        """The calls waiting for a pipeline."""
        return self._queued

    @property
    def flusher_waiting(self) -> bool:
        """A flusher started and does not hold its permit yet."""
        return self._flusher_waiting

    def _start_flusher(self) -> None:
        if self._flusher_waiting or not self._queued or len(self._flushers) >= MAX_IN_FLIGHT:
            return
        self._flusher_waiting = True
        task = asyncio.get_running_loop().create_task(self._flush())
        self._flushers.add(task)
        task.add_done_callback(self._flushed)

    def _flushed(self, task: asyncio.Task[None]) -> None:
        self._flushers.discard(task)
        self._start_flusher()  # what queued while the pipelines were in flight

    def _take(self) -> list[_Call]:
        """The queued calls still wanted, within the batch's bounds; the rest stay queued."""
        self._flusher_waiting = False
        wanted = [call for call in self._queued if not call.future.done()]
        size = weight = 0
        for call in wanted:
            if size and (size == MAX_BATCH or weight + call.weight > MAX_BATCH_BYTES):
                break
            size += 1
            weight += call.weight
        batch, self._queued = wanted[:size], wanted[size:]
        self._start_flusher()
        return batch

    async def _flush(self) -> None:
        batch: list[_Call] = []
        try:
            async with self._calls.call(
                self._operation, self._priority, observe_wait=False, admitted=True
            ) as held:
                batch = self._take()
                now = asyncio.get_running_loop().time()
                for call in batch:
                    # Each call's own wait: in its batch, then for the pipeline's permit.
                    self._calls.observe_wait(self._operation, now - call.queued_at)
                if batch:
                    held.refused = not await self._send(batch)
        except BaseException as exc:
            if not batch:
                batch = self._take()  # failed before taking (store down or closed): fail them
            for call in batch:
                if not call.future.done():
                    call.future.set_exception(_failure(exc))
            if not isinstance(exc, Exception):
                raise
        finally:
            # Out of flight now, not only once the task's callbacks ran: a caller woken by this
            # pipeline may send its next call alone at once.
            self._flushers.discard(asyncio.current_task())  # type: ignore[arg-type, unused-ignore]

    async def _send(self, batch: list[_Call], lane: LaneConnection | None = None) -> bool:
        """Send *batch* and settle its callers; False when Redis refused every call.

        On the *lane*'s connection if given (see :meth:`_pipeline`), else on a pooled one.
        """
        self.pipelines += 1
        self.calls += len(batch)
        replies = await self._pipeline(batch, lane)
        no_script = redis_errors.NoScriptError
        unknown = [i for i, reply in enumerate(replies) if isinstance(reply, no_script)]
        if unknown:
            # Redis (re)started without the scripts: those calls did not run. Load each script
            # once, then send them again, together.
            for name in dict.fromkeys(batch[i].name for i in unknown):
                await self._scripts.load(name)
            again = await self._pipeline([batch[i] for i in unknown], lane)
            for i, reply in zip(unknown, again, strict=True):
                replies[i] = reply
        answered = False
        for call, reply in zip(batch, replies, strict=True):
            refused = isinstance(reply, redis_errors.ResponseError)
            answered = answered or not refused
            if call.future.done():
                continue
            if refused:
                self._calls.refused(self._operation, reply)
                call.future.set_exception(
                    StoreUnavailable("the Redis event store refused the command")
                )
            else:
                call.future.set_result(reply)
        return answered

    async def _pipeline(self, calls: list[_Call], lane: LaneConnection | None = None) -> list[Any]:
        """Send *calls* as one pipeline; their replies in order (error replies as values).

        On the *lane*'s connection if given, without a repeat: a ``ConnectionError`` there
        raises :class:`LaneBroken` (the caller sends the calls again in a pipeline).

        On one connection of the client's pool, written at once and read reply by reply, as
        redis-py's own pipeline does, and repeated on a new connection after a
        ``ConnectionError`` as the connection's repeat policy says (every script is safe to
        repeat: see :mod:`~mcp_sse_gateway.store.redis.connections`). A read cut short (the
        stall timeout cancels it) closes the connection, so no reply is left unread on a pooled
        one. What it saves is measured in ``docs/decisions.md`` ("Cost at scale").
        """
        packed = [
            _pack(
                "EVALSHA",
                *self._scripts.evalsha_args(
                    call.name, call.keys, call.extra_keys, call.args, refresh=call.refresh
                ),
            )
            for call in calls
        ]
        if lane is not None:
            try:
                return await lane.exchange(packed)
            except redis_errors.ConnectionError as exc:
                raise LaneBroken from exc
        pool = self._client.connection_pool
        connection = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            replies = await connection.retry.call_with_retry(
                lambda: _exchange(connection, packed),
                lambda _error: connection.disconnect(),
            )
        finally:
            await pool.release(connection)
        return cast(list[Any], replies)

    async def close(self) -> None:
        """Wait for pipelines in flight (their callers get their outcome)."""
        if self._flushers:
            await asyncio.gather(*self._flushers, return_exceptions=True)


def _pack(*args: str | int) -> bytes:
    """One command in the Redis protocol, packed by hiredis (C)."""
    # hiredis's stub types the argument as a 1-tuple; a tuple of any length is packed.
    packed: bytes = pack_command(args)  # type: ignore[arg-type]
    return packed


async def _exchange(connection: AbstractConnection, packed: list[bytes]) -> list[Any]:
    """Write the *packed* commands and read their replies, error replies as values."""
    await connection.send_packed_command(packed)
    answers: list[Any] = []
    for _ in packed:
        try:
            answers.append(await connection.read_response())
        except redis_errors.ResponseError as exc:
            answers.append(exc)
    return answers


def _failure(exc: BaseException) -> BaseException:
    """What one caller of a failed pipeline gets: the store's error, chained to the cause."""
    if isinstance(exc, StoreUnavailable):
        failure = type(exc)(str(exc))
        failure.__cause__ = exc.__cause__
        return failure
    if isinstance(exc, asyncio.CancelledError):
        return StoreUnavailable("the event store was closed")
    failure = StoreUnavailable("the Redis event store cannot be reached")
    failure.__cause__ = exc
    return failure
