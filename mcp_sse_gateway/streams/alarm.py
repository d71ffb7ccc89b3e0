"""A deadline that moves on every event without a new timer each time.

A connection at the live end waits for the next event at most until its next keepalive (or
polling close, or owner check), and that deadline moves each time an event goes out. A fresh
``asyncio.timeout`` per wait schedules a timer and cancels it again per event (a cancelled timer
also stays in the loop's heap until it is due or swept). An :class:`Alarm` keeps one timer per
connection instead: moving the deadline later only records it, and a timer that comes due
before the recorded deadline sets itself again for it. So a connection that keeps getting events
schedules about one timer per deadline's length (``keepalive_s``, say), not one per event.
"""

from __future__ import annotations

import asyncio

#: A timer due this close before the deadline counts as at it, seconds (the loop runs timers
#: up to its clock resolution early; re-arming for less is pointless).
SLACK_S = 0.002


class Alarm:
    """One timer that resolves the waiter given to :meth:`arm` with False at its deadline.

    Only one waiter is armed at a time (a connection waits on one thing at a time); arming
    another replaces it. Times are the event loop's (``loop.time()``, seconds).
    """

    __slots__ = ("_deadline", "_handle", "_handle_at", "_loop", "_waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._handle: asyncio.TimerHandle | None = None
        self._handle_at = 0.0
        self._deadline = 0.0
        self._waiter: asyncio.Future[bool] | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop whose clock the deadlines are on."""
        return self._loop

    def arm(self, waiter: asyncio.Future[bool], deadline: float) -> None:
        """Resolve *waiter* with False at *deadline* unless something resolves it first."""
        self._waiter, self._deadline = waiter, deadline
        handle = self._handle
        if handle is not None:
            if self._handle_at <= deadline:
                return  # due earlier: it re-arms for the deadline then (see _ring)
            handle.cancel()
        self._handle = self._loop.call_at(deadline, self._ring)
        self._handle_at = deadline

    def disarm(self) -> None:
        """Forget the waiter (the timer stays, and does nothing when it comes due)."""
        self._waiter = None

    def close(self) -> None:
        """Cancel the timer. Idempotent; :meth:`arm` may be called again afterwards."""
        self._waiter = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _ring(self) -> None:
        self._handle = None
        waiter = self._waiter
        if waiter is None:
            return
        if self._loop.time() + SLACK_S < self._deadline:
            self._handle = self._loop.call_at(self._deadline, self._ring)
            self._handle_at = self._deadline
            return
        self._waiter = None
        if not waiter.done():
            waiter.set_result(False)
