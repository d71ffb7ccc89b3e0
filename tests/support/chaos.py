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


class ChaosProxy:
    """Counts what it did, for assertions.

    Attributes:
        port: the proxy's listening port.
        cuts: connections it cut.
    """

    def __init__(self, target_port: int, cut_after_bytes: int, max_cuts: int | None) -> None:
        self.target_port = target_port
        self.cut_after_bytes = cut_after_bytes
        self.max_cuts = max_cuts
        self.port = 0
        self.cuts = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, limit: int | None
    ) -> bool:
        carried: int | None = None  # bytes since an event-stream response started
        while chunk := await reader.read(65536):
            if limit is not None and carried is None and b"text/event-stream" in chunk:
                carried = -chunk.index(b"text/event-stream")
            if limit is not None and carried is not None:
                if carried + len(chunk) > limit:
                    writer.write(chunk[: max(limit - carried, 0)])
                    await writer.drain()
                    return True
                carried += len(chunk)
            writer.write(chunk)
            await writer.drain()
        return False

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        upstream_r, upstream_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        up = asyncio.create_task(self._pipe(client_r, upstream_w, limit=None))
        exhausted = self.max_cuts is not None and self.cuts >= self.max_cuts
        limit = None if exhausted else self.cut_after_bytes
        down = asyncio.create_task(self._pipe(upstream_r, client_w, limit=limit))
        try:
            done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            if down in done and down.result():
                self.cuts += 1
        except (ConnectionError, OSError):
            pass
        finally:
            for task in (up, down):
                task.cancel()
            for writer in (client_w, upstream_w):
                writer.transport.abort()

    def _track(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._handle(client_r, client_w))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


@contextlib.asynccontextmanager
async def chaos_proxy(
    target_port: int, *, cut_after_bytes: int, max_cuts: int | None = None
) -> AsyncIterator[ChaosProxy]:
    """Run a :class:`ChaosProxy` on a free loopback port in front of *target_port*.

    Connections opened after *max_cuts* cuts pass untouched (None: cut every stream).
    """
    proxy = ChaosProxy(target_port, cut_after_bytes, max_cuts)
    server = await asyncio.start_server(proxy._track, "127.0.0.1", 0)
    proxy.port = server.sockets[0].getsockname()[1]
    try:
        yield proxy
    finally:
        server.close()
        for task in list(proxy._tasks):
            task.cancel()
        await server.wait_closed()
