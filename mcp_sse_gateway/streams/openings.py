"""New streams opened a few at a time, so that running streams keep flowing (DESIGN D7).

Opening a stream is the costly part of its life: the store calls that create it, a new upstream
connection, the request sent and the response headers parsed, a few hundred microseconds of CPU
in all. Thousands of tool calls arriving at once (a reconnecting fleet, a load balancer moving
its clients here) would otherwise all open at once, each a step per event-loop turn, so every
turn of the loop would be long, and the events of streams already running would wait behind
them for seconds. :class:`Openings` lets at most ``server.max_opening_streams`` openings run at
once; the others wait their turn, in arrival order, cheaply. An opening gives its place back
when its upstream answered with headers, failed, or after :data:`HOLD_S` (an upstream slow to
answer costs the loop nothing meanwhile, so it does not hold the others up).

Only POSTs that carry JSON-RPC requests (those that start a stream) wait here; notifications,
answers to the server's requests and resumes never do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

#: An opening gives its place back after this long at most, seconds.
HOLD_S = 0.01


class Openings:
    """At most *limit* stream openings at once (module docstring).

    Args:
        limit: openings at once; 0 for no bound.
        hold_s: how long an opening holds its place at most, seconds.
    """

    def __init__(self, limit: int, *, hold_s: float = HOLD_S) -> None:
        self._semaphore = asyncio.Semaphore(limit) if limit > 0 else None
        self._hold_s = hold_s

    async def enter(self) -> Callable[[], None]:
        """Wait for a place; returns the (idempotent) call that gives it back.

        The place is given back by that call or after ``hold_s``, whichever comes first.
        Cancelling the wait takes no place.
        """
        semaphore = self._semaphore
        if semaphore is None:
            return _nothing
        await semaphore.acquire()
        timer: asyncio.TimerHandle | None = None

        def release() -> None:
            nonlocal timer
            if timer is not None:
                timer.cancel()
                timer = None
                semaphore.release()

        timer = asyncio.get_running_loop().call_later(self._hold_s, release)
        return release


def _nothing() -> None:
    return None
