"""Who owns what: every background task (pumps, standalone streams) and every client attachment.

"Don't shield, track" (aiohttp docs): each task the gateway starts is held in a set here, so
shutdown can wait for pumps to finish their upstream requests (up to the drain timeout) and then
cancel what is left. A client connection attached to a stream is recorded per stream so a newer
connection replaces the older one (DESIGN D5, D6).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import structlog

log = structlog.get_logger("mcp_sse_gateway.registry")

#: Reasons an attachment ends before its stream does; sent as the cancel message.
SUPERSEDED = "superseded"
DRAINING = "draining"


class Attachment:
    """One client connection reading one stream; ends when another connection replaces it.

    Attributes:
        key: ``(session digest, stream life)``.
        reason: why it was told to stop (:data:`SUPERSEDED`, :data:`DRAINING`), else None.
    """

    def __init__(self, key: tuple[str, str], task: asyncio.Task[Any] | None) -> None:
        self.key = key
        self.reason: str | None = None
        self._task = task

    def stop(self, reason: str) -> None:
        """Ask the connection to end: its handler gets a CancelledError carrying *reason*."""
        if self.reason is None:
            self.reason = reason
            if self._task is not None and not self._task.done():
                self._task.cancel(reason)


class _SessionLock:
    """A session's standalone lock and how many tasks hold or await it."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class Registry:
    """Tracks background tasks and the attachment of each stream, for one app."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._attached: dict[tuple[str, str], Attachment] = {}
        self.standalone: dict[str, asyncio.Task[Any]] = {}
        #: The newest client GET of each session: its headers (credentials) re-open the
        #: upstream GET, so a refreshed token is used from the next re-open on.
        self.standalone_calls: dict[str, Any] = {}
        self._standalone_locks: dict[str, _SessionLock] = {}
        #: Streams whose pump lost the store mid-stream: their events from then on, for the
        #: attached connection (``(session digest, life)`` → LocalFeed; see mcp_sse_gateway.feed).
        self.feeds: dict[tuple[str, str], Any] = {}
        self.closing = False
        #: Other replicas seen alive lately: replica id → monotonic time until which that holds
        #: (shared by every reader of their streams on this replica).
        self.owners_alive_until: dict[str, float] = {}

    @property
    def tasks(self) -> int:
        """Background tasks running now."""
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, Any], *, name: str) -> asyncio.Task[Any]:
        """Run *coro* as a tracked task; it is forgotten when done and cancelled on close."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task.failed", task=task.get_name(), error=repr(task.exception()))

    @contextlib.asynccontextmanager
    async def standalone_lock(self, session_key: str) -> AsyncIterator[None]:
        """Hold the lock serialising the start of *session_key*'s standalone pump.

        One lock per session, kept only while someone holds or awaits it or a pump runs: the
        table stays bounded by the live standalone pumps (GETs with ever new session ids,
        refused, leave nothing behind).
        """
        entry = self._standalone_locks.get(session_key)
        if entry is None:
            entry = self._standalone_locks[session_key] = _SessionLock()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            self._prune_lock(session_key)

    def _prune_lock(self, session_key: str) -> None:
        entry = self._standalone_locks.get(session_key)
        if entry is not None and entry.users == 0 and session_key not in self.standalone:
            del self._standalone_locks[session_key]

    def forget_standalone(self, session_key: str) -> None:
        """Drop what is kept for a session's standalone stream once its pump has stopped."""
        self.standalone_calls.pop(session_key, None)
        self._prune_lock(session_key)

    def attach(self, key: tuple[str, str]) -> Attachment:
        """Record the current task as the reader of stream *key*, replacing the older one."""
        attachment = Attachment(key, asyncio.current_task())
        older = self._attached.get(key)
        self._attached[key] = attachment
        if older is not None:
            older.stop(SUPERSEDED)
        return attachment

    def detach(self, attachment: Attachment) -> None:
        """Forget *attachment* unless a newer one already replaced it."""
        if self._attached.get(attachment.key) is attachment:
            del self._attached[attachment.key]

    def attached(self, key: tuple[str, str]) -> bool:
        """Whether a connection reads stream *key* now."""
        return key in self._attached

    def attachments(self) -> list[Attachment]:
        """Every attachment now (a copy)."""
        return list(self._attached.values())

    async def close(self, timeout_s: float, *, force: asyncio.Event | None = None) -> int:
        """Let tasks finish, then cancel the rest.

        Waits up to *timeout_s* seconds, or until *force* is set (a second interrupt), for
        the request pumps; standalone streams never end by themselves and are cancelled at once.

        Returns:
            The number of tasks cancelled.
        """
        self.closing = True
        for task in self.standalone.values():
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
