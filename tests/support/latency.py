"""A TCP proxy on loopback that adds latency to every reply: a slow, healthy Redis.

Bytes from the target to the client are held for ``delay_s`` each (order kept), bytes the other
way pass at once: every command is answered, ``delay_s`` late. Used to load the Redis store's
call queue without any outage (DESIGN D7, slow is not down).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from tests.support.tcp_proxy import TcpProxy, first_done, pipe, serving


class LatencyProxy(TcpProxy):
    """Counts what it carried, for assertions.

    Attributes:
        port: the proxy's listening port.
        connections: client connections accepted.
        replies: chunks delivered late.
    """

    def __init__(self, target_port: int, delay_s: float) -> None:
        super().__init__(target_port)
        self.delay_s = delay_s
        self.replies = 0

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

    async def relay(
        self,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        target: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        await first_done(pipe(client[0], target[1]), self._late(target[0], client[1]))


@contextlib.asynccontextmanager
async def latency_proxy(target_port: int, *, delay_s: float) -> AsyncIterator[LatencyProxy]:
    """Run a :class:`LatencyProxy` on a free loopback port in front of *target_port*."""
    async with serving(LatencyProxy(target_port, delay_s)) as proxy:
        yield proxy
