"""Task records of the Redis event store (DESIGN D11): one hash per task, compare-and-set writes.

A record lives under ``<prefix>:{<digest of the task id>}:task`` (the task id never appears in a
key) with the TTL of its ``ttlMs``; every write names the version it read, so two replicas that
settle the same task (a result and a cancellation, a death found twice) cannot both win.
"""

from __future__ import annotations

from mcp_sse_gateway.store.base import TASK_SCOPE
from mcp_sse_gateway.store.redis.calls import NEW, RUNNING
from mcp_sse_gateway.store.redis.leases import LeaseStore
from mcp_sse_gateway.store.redis.replies import text


class TaskStore(LeaseStore):
    """The task operations of a Redis event store (and, inherited, its leases' and streams')."""

    async def get_task(self, task_id: str) -> tuple[int, str] | None:
        """The task's version and record (JSON text), or None when unknown or expired.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        keys = self._keys(TASK_SCOPE + task_id)
        async with self._calls.call("get_task", RUNNING):
            found = await self._scripts.run("task", keys, [keys.task], ["get"], refresh=False)
        if not found:
            return None
        return int(found[0]), text(found[1])

    async def put_task(self, task_id: str, record: str, *, version: int, ttl_ms: int) -> bool:
        """Write the record if the task is still at *version* (0: create it, with *ttl_ms*).

        Returns:
            True when written (the task is then at ``version + 1``); False when another write
            came first, or the task expired.

        Raises:
            StoreUnavailable: Redis cannot be reached.
            StoreBusy: the call queue is full (a creation only: new work).
        """
        keys = self._keys(TASK_SCOPE + task_id)
        async with self._calls.call("put_task", NEW if version == 0 else RUNNING):
            written = await self._scripts.run(
                "task", keys, [keys.task], ["put", version, record, ttl_ms], refresh=False
            )
        return bool(written)
