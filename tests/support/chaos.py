"""A TCP proxy on loopback that cuts connections: a flaky network between client and gateway.

Every client connection is forwarded to the target. Once a connection has carried
``cut_after_bytes`` bytes of an event-stream response, both sides are closed abruptly (mid-event,
mid-chunk), as a load balancer's timeout or a network blip would. Other responses (JSON, 202)
pass untouched, so only streams are cut.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from tests.support.tcp_proxy import TcpProxy, first_done, pipe, serving


class ChaosProxy(TcpProxy):
    """Counts what it did, for assertions.

    Attributes:
        port: the proxy's listening port.
        cuts: connections it cut.
    """

    def __init__(self, target_port: int, cut_after_bytes: int, max_cuts: int | None) -> None:
        super().__init__(target_port)
        self.cut_after_bytes = cut_after_bytes
        self.max_cuts = max_cuts
        self.cuts = 0

    async def _cutting(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: int
    ) -> bool:
        """Copy until EOF (False) or until *limit* bytes of an event stream passed (True)."""
        carried: int | None = None  # bytes since an event-stream response started
        while chunk := await reader.read(65536):
            if carried is None and b"text/event-stream" in chunk:
                carried = -chunk.index(b"text/event-stream")
            if carried is not None:
                if carried + len(chunk) > limit:
                    writer.write(chunk[: max(limit - carried, 0)])
                    await writer.drain()
                    return True
                carried += len(chunk)
            writer.write(chunk)
            await writer.drain()
        return False

    async def relay(
        self,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        target: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        exhausted = self.max_cuts is not None and self.cuts >= self.max_cuts
        down = (
            pipe(target[0], client[1])
            if exhausted
            else self._cutting(target[0], client[1], self.cut_after_bytes)
        )
        for task in await first_done(pipe(client[0], target[1]), down):
            if not task.cancelled() and task.exception() is None and task.result() is True:
                self.cuts += 1


@contextlib.asynccontextmanager
async def chaos_proxy(
    target_port: int, *, cut_after_bytes: int, max_cuts: int | None = None
) -> AsyncIterator[ChaosProxy]:
    """Run a :class:`ChaosProxy` on a free loopback port in front of *target_port*.

    Connections opened after *max_cuts* cuts pass untouched (None: cut every stream).
    """
    async with serving(ChaosProxy(target_port, cut_after_bytes, max_cuts)) as proxy:
        yield proxy
