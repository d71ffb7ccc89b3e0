"""A TCP proxy on loopback that adds latency to every reply: a slow, healthy Redis.

Bytes from the target to the client are held for ``delay_s`` each (order kept), bytes the other
way pass at once: every command is answered, ``delay_s`` late. Used to load the Redis store's
call queue without any outage (DESIGN D7, slow is not down).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class LatencyProxy:
    """Counts what it carried, for assertions.

    Attributes:
        port: the proxy's listening port.
        connections: client connections accepted.
        replies: chunks delivered late.
    """

    def __init__(self, target_port: int, delay_s: float) -> None:
        self.target_port = target_port
        self.delay_s = delay_s
        self.port = 0
        self.connections = 0
        self.replies = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()

    async def _late(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        due: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                at, chunk = await due.get()
                await asyncio.sleep(max(0.0, at - loop.time()))  # the latency being simulated
                writer.write(chunk)
                await writer.drain()
                self.replies += 1

        delivering = asyncio.create_task(deliver())
        try:
            while chunk := await reader.read(65536):
                due.put_nowait((loop.time() + self.delay_s, chunk))
        finally:
            delivering.cancel()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        target_r, target_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        tasks = {
            asyncio.create_task(self._forward(client_r, target_w)),
            asyncio.create_task(self._late(target_r, client_w)),
        }
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        except (ConnectionError, OSError):
            pass
        finally:
            for task in tasks:
                task.cancel()
            for writer in (client_w, target_w):
                writer.transport.abort()

    def _track(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._handle(client_r, client_w))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


@contextlib.asynccontextmanager
async def latency_proxy(target_port: int, *, delay_s: float) -> AsyncIterator[LatencyProxy]:
    """Run a :class:`LatencyProxy` on a free loopback port in front of *target_port*."""
    proxy = LatencyProxy(target_port, delay_s)
    server = await asyncio.start_server(proxy._track, "127.0.0.1", 0)
    proxy.port = server.sockets[0].getsockname()[1]
    try:
        yield proxy
    finally:
        server.close()
        for task in list(proxy._tasks):
            task.cancel()
        await asyncio.gather(*proxy._tasks, return_exceptions=True)
