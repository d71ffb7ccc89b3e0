"""Who owns what: every background task (pumps, standalone streams) and every stream life.

"Don't shield, track" (aiohttp docs): each task the gateway starts is held in a set here, so
shutdown can wait for pumps to finish their upstream requests (up to the drain timeout) and then
cancel what is left. Each stream life this process pumps or serves has one
:class:`~mcp_sse_gateway.streams.life.StreamLife` here, holding its feed and its one attached
reader, so a newer connection replaces the older one (DESIGN D5, D6).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Iterator
from typing import Any

import structlog

from mcp_sse_gateway.streams.life import Attachment, StreamLife

log = structlog.get_logger("mcp_sse_gateway.registry")


class Registry:
    """Tracks background tasks and the stream lives of one app.

    Attributes:
        closing: set when the app drains: nothing new is started or re-opened.
    """

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._lives: dict[tuple[str, str], StreamLife] = {}
        #: Tasks cancelled first on close (they never end by themselves): standalone pumps.
        self._endless: set[asyncio.Task[Any]] = set()
        self._background: set[asyncio.Task[Any]] = set()
        #: Background tasks that only retry a store call: the drain does not wait for them.
        self._retries: set[asyncio.Task[Any]] = set()
        self.closing = False

    @property
    def tasks(self) -> int:
        """Background tasks running now."""
        return len(self._tasks)

    @property
    def endless(self) -> int:
        """Endless tasks (standalone pumps) running now, counted in :attr:`tasks` too."""
        return len(self._endless)

    @property
    def request_pumps(self) -> int:
        """Tasks that are neither endless nor background: request pumps (and their openings)."""
        return len(self._tasks) - len(self._endless) - len(self._background)

    def spawn(
        self,
        coro: Coroutine[Any, Any, Any],
        *,
        name: str,
        endless: bool = False,
        background: bool = False,
        retry: bool = False,
    ) -> asyncio.Task[Any]:
        """Run *coro* as a tracked task; it is forgotten when done and cancelled on close.

        An *endless* task (a standalone pump: it never ends by itself) is cancelled at once on
        close. A *background* task (a stand-by, a retire) is no pump: :attr:`request_pumps`
        does not count it. A *retry* task (background too: it retries a store call while the
        store is down) is cancelled at once on close, and never runs if spawned once the
        app is closing: a drain waits for the upstream requests, not for the store, and what
        such a task would store is left to the other replicas' dead-owner check (DESIGN D7).
        """
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        if endless:
            self._endless.add(task)
        if background or retry:
            self._background.add(task)
        if retry:
            self._retries.add(task)
            if self.closing:
                task.cancel("shutdown")
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._endless.discard(task)
        self._background.discard(task)
        self._retries.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task.failed", task=task.get_name(), error=repr(task.exception()))

    # Stream lives ---------------------------------------------------------------------------

    def life(self, key: tuple[str, str], session_id: str, life: str) -> StreamLife:
        """The stream life *key* of this process, created on first use."""
        found = self._lives.get(key)
        if found is None:
            found = self._lives[key] = StreamLife(key, session_id, life)
        return found

    def adopt(self, stream: StreamLife) -> StreamLife:
        """The life of *stream*'s key: *stream* itself, registered again if it was released.

        For the connection of the request that started a pump, which may attach after the
        pump ended and released the life: it then reads the life's ended feed, not the store.
        A newer life registered under the key meanwhile (a resume) is the one returned.
        """
        found = self._lives.get(stream.key)
        if found is None:
            found = self._lives[stream.key] = stream
        return found

    def find(self, key: tuple[str, str]) -> StreamLife | None:
        """The stream life *key* if this process holds it."""
        return self._lives.get(key)

    def release(self, stream: StreamLife) -> None:
        """Forget *stream* once nothing holds it (no feed, no reader)."""
        if stream.idle and self._lives.get(stream.key) is stream:
            del self._lives[stream.key]

    @contextlib.contextmanager
    def reading(self, stream: StreamLife) -> Iterator[Attachment]:
        """Attach the current task as *stream*'s reader for the block (replacing an older one)."""
        attachment = stream.attach()
        try:
            yield attachment
        finally:
            stream.detach(attachment)
            self.release(stream)

    def attached(self, key: tuple[str, str]) -> bool:
        """Whether a connection reads stream *key* now."""
        stream = self._lives.get(key)
        return stream is not None and stream.reader is not None

    def attachments(self) -> list[Attachment]:
        """Every attachment now (a copy)."""
        return [s.reader for s in self._lives.values() if s.reader is not None]

    # Shutdown -------------------------------------------------------------------------------

    async def close(self, timeout_s: float, *, force: asyncio.Event | None = None) -> int:
        """Let tasks finish, then cancel the rest.

        Waits up to *timeout_s* seconds, or until *force* is set (a second interrupt), for
        the request pumps; endless tasks (standalone streams) and retry tasks are cancelled
        at once.

        Returns:
            The number of tasks cancelled.
        """
        self.closing = True
        for task in self._endless | self._retries:
            task.cancel("shutdown")
        pending = set(self._tasks)
        if pending:
            all_done = asyncio.ensure_future(asyncio.wait(pending))
            stops: set[asyncio.Future[Any]] = {all_done}
            if force is not None:
                stops.add(asyncio.ensure_future(force.wait()))
            await asyncio.wait(stops, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
            for stop in stops:
                stop.cancel()
            pending = {task for task in pending if not task.done()}
        for task in pending:
            task.cancel("shutdown")
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        return len(pending)
