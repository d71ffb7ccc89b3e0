"""The plumbing of the loopback TCP proxies in front of a gateway or a Redis (tests only).

A subclass says how bytes cross (:meth:`TcpProxy.relay`); this module accepts connections,
opens one to the target for each, aborts both when the relay ends, and tears everything down.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TypeVar

P = TypeVar("P", bound="TcpProxy")


class TcpProxy:
    """A proxy on a loopback port in front of *target_port*; see :func:`serving`.

    Attributes:
        port: the proxy's listening port (set by :func:`serving`).
        connections: client connections accepted.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.connections = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def relay(
        self,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        target: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        """Carry one connection's bytes both ways; both sides are aborted when it returns."""
        raise NotImplementedError

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        target_r, target_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        try:
            await self.relay((client_r, client_w), (target_r, target_w))
        except (ConnectionError, OSError):
            pass
        finally:
            for writer in (client_w, target_w):
                writer.transport.abort()

    def _track(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._handle(client_r, client_w))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy *reader* to *writer* until EOF."""
    while chunk := await reader.read(65536):
        writer.write(chunk)
        await writer.drain()


async def first_done(*coroutines: object) -> set[asyncio.Task[object]]:
    """Run *coroutines* until one ends; cancel the others. Returns the finished ones."""
    tasks = {asyncio.ensure_future(c) for c in coroutines}  # type: ignore[arg-type]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
    return done


@contextlib.asynccontextmanager
async def serving(proxy: P) -> AsyncIterator[P]:
    """Listen for *proxy* on a free loopback port while the block runs."""
    server = await asyncio.start_server(proxy._track, "127.0.0.1", 0)
    proxy.port = server.sockets[0].getsockname()[1]
    try:
        yield proxy
    finally:
        server.close()
        for task in list(proxy._tasks):
            task.cancel()
        await asyncio.gather(*proxy._tasks, return_exceptions=True)
        await server.wait_closed()
