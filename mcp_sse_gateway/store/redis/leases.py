"""Standalone leases and stream claims of the Redis event store (DESIGN D5).

A session's lease (``<prefix>:{<digest>}:lease``: holder and epoch) says which replica pumps
the session's one upstream GET. It expires unless its holder renews it; the next acquisition
takes a new epoch from the session's counter, and the append script refuses a write under any
other lease (fencing), so a paused former holder cannot write after losing it. A claim records
a stream's newest reader in its metadata and wakes its waiters on every replica (Pub/Sub), so
an older connection learns from its next read that it was replaced.

Renewals and releases are liveness calls (they must not starve behind new work, or a healthy
holder would lose its lease under load); acquisitions are new work; claims running work.
"""

from __future__ import annotations

from mcp_sse_gateway.store.base import Lease
from mcp_sse_gateway.store.redis.calls import LIVENESS, NEW, RUNNING
from mcp_sse_gateway.store.redis.streams import StreamStore, ms

#: The lease script's answer to an acquisition while another replica holds the lease.
HELD_ELSEWHERE = -1


class LeaseStore(StreamStore):
    """The lease and claim operations of a Redis event store (and, inherited, its streams')."""

    async def acquire_lease(self, session_id: str, holder: str, ttl_s: float) -> Lease | None:
        """Take the session's lease for *ttl_s* seconds, or renew it if *holder* holds it.

        Returns:
            The lease, or None when another replica holds it.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        keys = self._keys(session_id)
        async with self._calls.call("acquire_lease", NEW):
            epoch = await self._scripts.run(
                "lease", keys, [keys.lease, keys.epoch], ["acquire", holder, "", ms(ttl_s)]
            )
        if int(epoch) == HELD_ELSEWHERE:
            return None
        return Lease(holder, int(epoch))

    async def renew_lease(self, session_id: str, lease: Lease, ttl_s: float) -> bool:
        """Extend *lease* by *ttl_s* seconds; False when it is no longer the session's.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        keys = self._keys(session_id)
        async with self._calls.call("renew_lease", LIVENESS):
            renewed = await self._scripts.run(
                "lease",
                keys,
                [keys.lease, keys.epoch],
                ["renew", lease.holder, lease.epoch, ms(ttl_s)],
            )
        return bool(renewed)

    async def release_lease(self, session_id: str, lease: Lease) -> None:
        """Give *lease* up at once; a stale one changes nothing.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        keys = self._keys(session_id)
        async with self._calls.call("release_lease", LIVENESS):
            await self._scripts.run(
                "lease", keys, [keys.lease, keys.epoch], ["release", lease.holder, lease.epoch, 1]
            )

    async def claim_reader(self, session_id: str, life: str, reader: str) -> None:
        """Record *reader* as the stream's newest connection; wake its waiters on every replica.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        keys = self._keys(session_id)
        async with self._calls.call("claim_reader", RUNNING):
            await self._scripts.run("claim_reader", keys, [keys.meta(life)], [life, reader])
