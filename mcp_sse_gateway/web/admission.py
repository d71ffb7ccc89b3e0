"""Requests started a bounded number per event-loop turn, so running streams keep flowing.

A burst of requests (a fleet reconnecting, a load balancer moving its clients here) reaches the
gateway in one read of thousands of sockets; asyncio then starts every request's handler in the
same loop turn, and each does tens of microseconds of work (headers, the session, the body,
authorization) before its first real wait. At 5,000 requests that is one turn of a few hundred
milliseconds, during which no event of a stream already running is relayed.
:class:`Admission` lets at most ``server.max_requests_per_turn`` handlers start per turn; the
others wait, in arrival order, for the next turns. A turn with room costs nothing (no await);
an idle loop turns over in microseconds, so the bound costs a burst almost no throughput.

Health, readiness and metrics GETs never wait (:mod:`.middleware`).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars


class Admission:
    """About *per_turn* request handlers start per event-loop turn (module docstring).

    Handlers start in arrival order. The bound holds while requests wait; at the end of a burst,
    one turn may start up to twice as many (the last woken and the first new arrivals).

    Args:
        per_turn: handlers started per turn; 0 for no bound.

    Raises:
        ValueError: *per_turn* is negative.
    """

    def __init__(self, per_turn: int) -> None:
        if per_turn < 0:
            raise ValueError("per_turn must be 0 (no bound) or more")
        self._per_turn = per_turn
        self._loop: asyncio.AbstractEventLoop | None = None
        self._passed = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        # Waiters given up in the queue (compacted once they are half of it), and waiters woken
        # that have not started yet (no request passes them).
        self._dead = 0
        self._woken = 0
        self._turn_scheduled = False

    @property
    def waiting(self) -> int:
        """Handlers waiting for a later turn."""
        return len(self._waiters) - self._dead

    async def enter(self) -> None:
        """Return at once while this turn has room, else in a later turn, in arrival order.

        Cancelling the wait gives up the place (a later turn's room goes to the next waiter).
        """
        if not self._per_turn:
            return
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new loop (tests, an embedding app): nothing carries over
            self._loop, self._waiters, self._dead, self._woken = loop, collections.deque(), 0, 0
            self._passed, self._turn_scheduled = 0, False
        if self._passed < self._per_turn and not self._waiters and not self._woken:
            self._passed += 1
            self._schedule_turn(loop)
            return
        waiter = loop.create_future()
        self._waiters.append(waiter)
        self._schedule_turn(loop)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.cancelled():
                self._given_up()
            else:  # woken, then cancelled before it started
                self._woken -= 1
            raise
        self._woken -= 1

    def _given_up(self) -> None:
        self._dead += 1
        if self._dead * 2 > len(self._waiters):
            self._waiters = collections.deque(w for w in self._waiters if not w.done())
            self._dead = 0

    def _schedule_turn(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._turn_scheduled:
            self._turn_scheduled = True
            # A context of its own: not the one of the request that happened to schedule it.
            loop.call_soon(self._next_turn, context=contextvars.Context())

    def _next_turn(self) -> None:
        """A new turn: the first waiters woken into the next one, as many as it has room for."""
        self._turn_scheduled = False
        self._passed = 0
        waiters = self._waiters
        while waiters and self._passed + self._woken < self._per_turn:
            waiter = waiters.popleft()
            if waiter.done():
                self._dead -= 1
                continue
            waiter.set_result(None)
            self._woken += 1
            self._passed += 1
        if (waiters or self._woken or self._passed) and self._loop is not None:
            self._schedule_turn(self._loop)
