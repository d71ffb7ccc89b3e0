"""Bounded reads of one stream from the event store, with one batch read ahead during a replay.

While a replay writes one batch to the client, the store already reads the next, so a long
replay costs one store round trip per batch in parallel with the writes, not in series.
"""

from __future__ import annotations

import asyncio

from mcp_sse_gateway.store.base import EventStore, ReadResult


class StoreReader:
    """Reads batches of one stream from the store, the next one possibly ahead of time.

    Args:
        store: the event store.
        session_id: the stream's session.
        life: the stream life.
        batch: events per read (``store.replay_batch_events``).
    """

    def __init__(self, store: EventStore, session_id: str, life: str, batch: int) -> None:
        self._store, self._session_id, self._life, self._batch = store, session_id, life, batch
        self._ahead: asyncio.Future[ReadResult] | None = None
        self._ahead_after = -1

    async def prefetch(self, after: int) -> None:
        """Start reading the batch after *after* now.

        Returns once the read has run up to its first wait (its request sent, or queued for a
        pipeline): the task would otherwise start only when the caller next waits, which a
        write that the socket takes at once never does, and the read would not overlap it.
        """
        self.cancel()
        self._ahead = asyncio.ensure_future(
            self._store.read(self._session_id, self._life, after, self._batch)
        )
        self._ahead_after = after
        await asyncio.sleep(0)

    def seed(self, after: int, read: asyncio.Future[ReadResult]) -> None:
        """Take *read*, of the batch after *after* (done or under way), as the read ahead."""
        self.cancel()
        self._ahead, self._ahead_after = read, after

    async def read(self, after: int) -> ReadResult:
        """The batch after *after* (the prefetched one if it was for the same cursor)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            if self._ahead_after == after:
                return await ahead
            ahead.cancel()
        return await self._store.read(self._session_id, self._life, after, self._batch)

    def cancel(self) -> None:
        """Drop a read ahead (its result, or failure, is not wanted)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.cancel()
            ahead.add_done_callback(_consume)


def _consume(future: asyncio.Future[ReadResult]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: no "exception was never retrieved" warning
