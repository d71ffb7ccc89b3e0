"""Standalone leases and stream claims of the in-memory event store (DESIGN D5).

One process is one replica here, so the lease is local, with the interface the Redis store
shares: a session's lease is held until it expires (``ttl_s`` after its last renewal) or is
released; every acquisition by a new holder takes a new epoch (unique in the process), and an
append under any other lease is refused. A claim records a stream's newest reader and wakes the
stream's waiters.
"""

from __future__ import annotations

import itertools
from typing import Any

from mcp_sse_gateway.errors import LeaseLost, UnknownStream
from mcp_sse_gateway.store.base import Lease, session_digest
from mcp_sse_gateway.store.memory.streams import MemoryStreams

#: Beyond this many lease entries, expired ones are swept on the next acquisition.
SWEEP_LEASES_ABOVE = 1024


class MemoryLeases(MemoryStreams):
    """The lease and claim operations of the in-memory store (and, inherited, its streams').

    Args:
        **streams: :class:`~mcp_sse_gateway.store.memory.streams.MemoryStreams`'s arguments.
    """

    def __init__(self, **streams: Any) -> None:
        super().__init__(**streams)
        # session digest -> (lease, monotonic time it expires)
        self._leases: dict[str, tuple[Lease, float]] = {}
        self._epochs = itertools.count(1)

    def _current(self, key: str) -> Lease | None:
        entry = self._leases.get(key)
        if entry is None:
            return None
        if entry[1] <= self._clock():
            del self._leases[key]
            return None
        return entry[0]

    async def acquire_lease(self, session_id: str, holder: str, ttl_s: float) -> Lease | None:
        """Take the session's lease for *ttl_s* seconds, or renew it if *holder* holds it.

        Returns:
            The lease, or None when another holder has it.
        """
        key = session_digest(session_id)
        current = self._current(key)
        if current is not None and current.holder != holder:
            return None
        if len(self._leases) > SWEEP_LEASES_ABOVE:
            now = self._clock()
            for stale in [k for k, (_, until) in self._leases.items() if until <= now]:
                del self._leases[stale]
        lease = current or Lease(holder, next(self._epochs))
        self._leases[key] = (lease, self._clock() + ttl_s)
        return lease

    async def renew_lease(self, session_id: str, lease: Lease, ttl_s: float) -> bool:
        """Extend *lease*; False when it is no longer the session's."""
        key = session_digest(session_id)
        if self._current(key) != lease:
            return False
        self._leases[key] = (lease, self._clock() + ttl_s)
        return True

    async def release_lease(self, session_id: str, lease: Lease) -> None:
        """Give *lease* up; a stale one changes nothing."""
        key = session_digest(session_id)
        if self._current(key) == lease:
            del self._leases[key]

    async def claim_reader(self, session_id: str, life: str, reader: str) -> None:
        """Record *reader* as the stream's newest connection and wake its waiters."""
        try:
            stream = self._stream(session_id, life)
        except UnknownStream:
            return
        stream.reader = reader
        stream.wake()

    def _check_lease(self, session_id: str, lease: Lease) -> None:
        """Fencing for :meth:`MemoryStreams.append_many`.

        Raises:
            LeaseLost: *lease* is no longer the session's.
        """
        if self._current(session_digest(session_id)) != lease:
            raise LeaseLost("the session's lease was taken over")
