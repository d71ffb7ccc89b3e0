"""Wait on a condition with a deadline (never a bare sleep to synchronise)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

POLL_S = 0.01


async def eventually(condition: Callable[[], bool], *, timeout_s: float = 10) -> None:
    """Return as soon as *condition()* is true; raise TimeoutError after *timeout_s* seconds."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(POLL_S)
