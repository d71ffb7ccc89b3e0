"""Store calls: queued by priority, judged by their round trip, never by their wait (DESIGN D7).

*Slow is not down.* A call first waits for one of the store's connections (a permit), in a
queue per process: heartbeats and liveness first (:data:`LIVENESS`), then the calls of running
streams and of work an upstream already accepted (:data:`RUNNING`: appends, reads, waits,
session records and tombstones), then new work (:data:`NEW`: the session lookup of a client
request, new streams), which, once it waited :data:`NEW_PROMOTED_AFTER_S`, gets every
other permit, so it is never starved. A busy Redis makes the queue longer, never an outage: the
wait is measured (``queue_wait``) but not bounded in time, so a running stream loses nothing.
Only new work is refused, with :class:`~mcp_sse_gateway.errors.StoreBusy` (503 +
``Retry-After``), and only when more than ``max_queued_calls`` calls are waiting.

*Stalled is down.* Once a call holds its connection, Redis must answer within
``stall_timeout_s``: that is the time since its command left, which with one command in flight
per connection is the time since the connection's last reply. Past it (a SIGSTOPped or frozen
``redis-server``), or on refused or lost connections (:data:`TRANSPORT_ERRORS`), the store is
down: the call raises :class:`~mcp_sse_gateway.errors.StoreUnavailable`, every queued call fails
at once, and until a call succeeds again only one call at a time tries Redis (the others fail at
once), so an outage costs each caller one quick error, not a turn in a queue of timeouts. An
error *reply* of a reachable Redis (out of memory, read-only replica, ``TRYAGAIN``, a cluster
redirect loop) fails that call only, with StoreUnavailable. Outages and recoveries are logged
once each.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Final

import structlog
from redis import exceptions as redis_errors

from mcp_sse_gateway.config import DEFAULT_MAX_QUEUED_CALLS, DEFAULT_STALL_TIMEOUT_S
from mcp_sse_gateway.errors import StoreBusy, StoreUnavailable
from mcp_sse_gateway.store.redis.connections import UNAVAILABLE_ERRORS

#: Refusals: Redis answered with an error (read-only, out of memory, BUSY running a script,
#: LOADING, any other error reply): this call fails, the store is not down.
REFUSED_ERRORS: tuple[type[BaseException], ...] = (*UNAVAILABLE_ERRORS, redis_errors.ResponseError)
#: Failures of the connection itself (and the stall timeout, a TimeoutError): the store is down.
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    OSError,
)

log = structlog.get_logger("mcp_sse_gateway.store")

#: Priorities, most urgent first.
LIVENESS: Final = 0
RUNNING: Final = 1
NEW: Final = 2
#: New work that waited this long takes every other permit from then on (in arrival order), so
#: a store kept busy by running streams still lets new calls in, seconds.
NEW_PROMOTED_AFTER_S = 0.5
#: A full queue is logged at most this often, seconds.
FULL_LOG_INTERVAL_S = 1.0


def _ignore(_operation: str, _seconds: float) -> None:
    return None


class Held:
    """A call's hold on its permit; ``refused`` tells that Redis refused all it carried."""

    __slots__ = ("refused",)

    def __init__(self) -> None:
        self.refused = False


def _none_queued() -> int:
    return 0


class Calls:
    """The store's permits, queue, stall timeout and outage state.

    Args:
        permits: calls in flight at most (the command connections they use).
        url_for_logs: where Redis is, already redacted.
        stall_timeout_s: see the module docstring, seconds.
        max_queued_calls: see the module docstring.
        on_queue_wait: called with ``(operation, seconds waited)`` as each call gets its permit.
        on_round_trip: called with ``(operation, seconds)`` as each call returns its permit.
    """

    def __init__(
        self,
        permits: int,
        url_for_logs: str,
        *,
        stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
        max_queued_calls: int = DEFAULT_MAX_QUEUED_CALLS,
        on_queue_wait: Callable[[str, float], None] = _ignore,
        on_round_trip: Callable[[str, float], None] = _ignore,
    ) -> None:
        if permits < 1:
            raise ValueError("a store needs at least one command connection")
        self._free = permits
        self._url = url_for_logs
        self._stall_s = stall_timeout_s
        self._max_queued = max_queued_calls
        self._on_queue_wait = on_queue_wait
        self._on_round_trip = on_round_trip
        self._urgent: list[tuple[int, int, asyncio.Future[None]]] = []  # a heap
        self._new: collections.deque[tuple[float, asyncio.Future[None]]] = collections.deque()
        self._new_turn = False
        self._next_full_log = float("-inf")
        self._refusing = False  # an error reply was logged since the last success
        #: Calls waiting elsewhere for a permit (in batches), counted toward the queue's bound.
        self.also_queued: Callable[[], int] = _none_queued
        self._queued = 0
        self._order = itertools.count()
        self._in_flight = 0
        self._healthy = True
        #: Set by the store's ``close``: every later call raises StoreUnavailable.
        self.closed = False

    @property
    def healthy(self) -> bool:
        """False from a failed call until the next successful one."""
        return self._healthy

    @property
    def queued(self) -> int:
        """Calls waiting for a permit now."""
        return self._queued

    @property
    def permit_free(self) -> bool:
        """A call would get its permit at once (nobody waits for one)."""
        return self._free > 0

    @property
    def in_flight(self) -> int:
        """Calls holding a permit now."""
        return self._in_flight

    def observe_wait(self, operation: str, seconds: float) -> None:
        """Record how long one call waited before its command left (metrics)."""
        self._on_queue_wait(operation, seconds)

    @property
    def full(self) -> bool:
        """New work is refused now: ``max_queued_calls`` calls wait (batched ones included)."""
        return self._queued + self.also_queued() >= self._max_queued

    @contextlib.asynccontextmanager
    async def call(
        self, operation: str, priority: int, *, observe_wait: bool = True, admitted: bool = False
    ) -> AsyncIterator[Held]:
        """Hold a permit while the block runs Redis commands; map outages to StoreUnavailable.

        Args:
            operation: the store method, for logs and metrics.
            priority: :data:`LIVENESS`, :data:`RUNNING` or :data:`NEW` (only new work is
                refused, and only when the queue is full).
            observe_wait: record the wait for the permit (False: the caller records the waits
                of the calls it carries, a pipeline).
            admitted: new work already let in (the calls a pipeline carries were checked
                against the queue's bound as they were queued): never refused for it now.

        Yields:
            The hold: a pipeline sets ``refused`` when Redis refused every call it carried (the
            refusal is then not taken for a recovery).

        Raises:
            StoreBusy: new work, while more than ``max_queued_calls`` calls are queued.
            StoreUnavailable: the store is closed or down, or Redis did not answer within
                ``stall_timeout_s`` of the block's start (chained to the redis-py error).
        """
        if self.closed:
            raise StoreUnavailable("the event store is closed")
        if not self._healthy and self._in_flight:
            # Down, and a call is already finding out whether it is back: fail at once.
            raise StoreUnavailable("the Redis event store cannot be reached")
        loop = asyncio.get_running_loop()
        queued_at = loop.time()
        held = Held()
        await self._acquire(priority, admitted=admitted)
        started = loop.time()
        self._in_flight += 1
        try:
            if observe_wait:
                self._on_queue_wait(operation, started - queued_at)
            async with asyncio.timeout(self._stall_s):
                yield held
        except TRANSPORT_ERRORS as exc:
            self._down(operation, exc)
            raise StoreUnavailable("the Redis event store cannot be reached") from exc
        except REFUSED_ERRORS as exc:
            # Also BUSY (a script runs too long), LOADING and any other error reply: refused.
            self.refused(operation, exc)
            raise StoreUnavailable("the Redis event store refused the command") from exc
        finally:
            self._in_flight -= 1
            self._release()
            self._on_round_trip(operation, loop.time() - started)
        if not held.refused:
            self._refusing = False
        if not self._healthy and not held.refused:
            self._healthy = True
            log.info("store.redis_recovered", url=self._url, operation=operation)

    def queue_full(self, queued: int | None = None) -> None:
        """New work is refused as the queue is full (logged at most once a second)."""
        now = asyncio.get_running_loop().time()
        if now >= self._next_full_log:
            self._next_full_log = now + FULL_LOG_INTERVAL_S
            log.warning(
                "store.queue_full",
                queued=self._queued + self.also_queued() if queued is None else queued,
                limit=self._max_queued,
            )

    def refused(self, operation: str, exc: BaseException) -> None:
        """Redis answered a call with an error reply (logged once until a call succeeds)."""
        if not self._refusing:
            self._refusing = True
            log.warning("store.redis_refused", operation=operation, error=type(exc).__name__)

    def _down(self, operation: str, exc: BaseException) -> None:
        if self._healthy:
            self._healthy = False
            log.warning(
                "store.redis_unavailable",
                url=self._url,
                operation=operation,
                error="stalled" if isinstance(exc, TimeoutError) else type(exc).__name__,
            )
        # Queued calls would each wait for Redis in turn: they fail now.
        futures = [future for *_, future in self._urgent] + [future for _, future in self._new]
        self._urgent, self._new = [], collections.deque()
        for future in futures:
            if not future.done():
                self._queued -= 1
                future.set_exception(StoreUnavailable("the Redis event store cannot be reached"))

    async def _acquire(self, priority: int, *, admitted: bool = False) -> None:
        # A free permit means nobody is waiting: _release hands a returned permit to a pending
        # waiter before it ever counts it free (granted waiters already hold theirs).
        if self._free:
            self._free -= 1
            return
        loop = asyncio.get_running_loop()
        if priority == NEW and not admitted and self.full:
            self.queue_full()
            raise StoreBusy("too many event-store calls are waiting")
        future: asyncio.Future[None] = loop.create_future()
        if priority == NEW:
            self._new.append((loop.time(), future))
        else:
            heapq.heappush(self._urgent, (priority, next(self._order), future))
        # _queued counts pending futures only: whoever resolves one (a grant, a failure, the
        # waiter's own cancellation) takes it off, so a free permit never sits beside it.
        self._queued += 1
        try:
            await future
        except BaseException:
            if future.cancelled():
                self._queued -= 1  # cancelled while pending: nobody else counted it off
            elif future.exception() is None:
                self._release()  # granted, then cancelled before use: pass it on
            raise

    def _release(self) -> None:
        """Give the permit to the next waiter still waiting, else keep it free.

        The most urgent one, except that new work which waited :data:`NEW_PROMOTED_AFTER_S`
        gets every other permit.
        """
        while self._new and self._new[0][1].done():
            self._new.popleft()
        while self._urgent and self._urgent[0][2].done():
            heapq.heappop(self._urgent)
        if self._new:
            aged = asyncio.get_running_loop().time() - self._new[0][0] >= NEW_PROMOTED_AFTER_S
            if not self._urgent or (aged and self._new_turn):
                self._new_turn = False
                self._queued -= 1
                self._new.popleft()[1].set_result(None)
                return
            self._new_turn = aged
        if self._urgent:
            self._queued -= 1
            heapq.heappop(self._urgent)[2].set_result(None)
            return
        self._free += 1
