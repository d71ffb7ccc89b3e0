"""Wait on a condition with a deadline (never a bare sleep to synchronise).

:func:`eventually` polls any condition, sync or async; :func:`until_status` polls an HTTP
status (a readiness probe, a resume refused until Redis is back); :func:`parked` is the
condition "N waiters are parked in the store".
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp

#: Every condition is met within this many seconds unless the caller says otherwise.
DEADLINE_S = 10.0
#: How often a condition is polled.
POLL_S = 0.01
#: How often an HTTP status is polled (each poll is a request).
HTTP_POLL_S = 0.05


async def eventually(
    condition: Callable[[], Awaitable[Any] | Any],
    *,
    timeout_s: float = DEADLINE_S,
    poll_s: float = POLL_S,
) -> None:
    """Return as soon as *condition()* (sync or async) is true; TimeoutError after *timeout_s*.

    The condition is checked first, then every *poll_s* seconds. An exception it raises ends
    the wait (it is not retried).
    """
    async with asyncio.timeout(timeout_s):
        while True:
            result = condition()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return
            await asyncio.sleep(poll_s)


async def until_status(
    url: str,
    status: int,
    *,
    timeout_s: float,
    http: aiohttp.ClientSession | None = None,
    headers: Mapping[str, str] | None = None,
    process: asyncio.subprocess.Process | None = None,
    retry_errors: bool = True,
    poll_s: float = HTTP_POLL_S,
) -> None:
    """Return once ``GET url`` answers *status*; TimeoutError after *timeout_s*.

    Args:
        url: what to GET.
        status: the status waited for.
        timeout_s: the deadline of the whole wait.
        http: the client (default: a client of this wait only).
        headers: the headers of each GET.
        process: the process serving *url*: RuntimeError as soon as it has exited.
        retry_errors: whether a refused or broken connection is polled again (else it raises).
        poll_s: the pause between two GETs.
    """

    async def answered(client: aiohttp.ClientSession) -> bool:
        if process is not None and process.returncode is not None:
            raise RuntimeError(f"exited with {process.returncode} before {url} answered {status}")
        try:
            async with client.get(url, headers=headers) as response:
                return response.status == status
        except aiohttp.ClientError:
            if not retry_errors:
                raise
            return False

    async with contextlib.AsyncExitStack() as stack:
        client: aiohttp.ClientSession = (
            http if http is not None else await stack.enter_async_context(aiohttp.ClientSession())
        )
        await eventually(lambda: answered(client), timeout_s=timeout_s, poll_s=poll_s)


def parked(store: Any, waiting: int, *, commands_idle: bool = False) -> bool:
    """Whether *waiting* calls of the store's ``wait()`` are parked on a wake-up.

    A condition for :func:`eventually`. With *commands_idle* (a Redis store on one server),
    no command is in flight either: only the subscription may hold a connection of the
    command pool.
    """
    if store.parked != waiting:
        return False
    if not commands_idle:
        return True
    pool = store.clients.commands.connection_pool
    # A store given one client runs its subscription on one of that client's connections.
    subscriber = 1 if store.clients.subscriber is store.clients.commands else 0
    return len(pool._in_use_connections) <= subscriber
