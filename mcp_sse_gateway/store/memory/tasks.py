"""Task records of the in-memory event store (DESIGN D11): a bounded table, compare-and-set writes.

The interface the Redis store shares (:meth:`~mcp_sse_gateway.store.base.EventStore.get_task`,
``put_task``): a record is kept with its version until its TTL ends; a write names the version
it read. Expired records are swept when the table is full, and a creation beyond the bound with
none expired is refused (a live task is never evicted).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mcp_sse_gateway.errors import StoreLimitExceeded
from mcp_sse_gateway.store.base import TASK_SCOPE, session_digest

#: Records kept at most (about 10 KiB each for a typical tool result: a few hundred MiB).
DEFAULT_MAX_TASKS = 20_000


@dataclass(slots=True)
class _Task:
    version: int
    record: str
    expires_at: float


class MemoryTasks:
    """The task table of one in-memory store.

    Args:
        clock: monotonic clock in seconds.
        max_tasks: records kept at most.
    """

    def __init__(self, clock: Callable[[], float], max_tasks: int = DEFAULT_MAX_TASKS) -> None:
        self._clock = clock
        self._max_tasks = max_tasks
        # digest of TASK_SCOPE + task id -> record
        self._tasks: dict[str, _Task] = {}

    def get(self, task_id: str) -> tuple[int, str] | None:
        """See :meth:`~mcp_sse_gateway.store.base.EventStore.get_task`."""
        key = session_digest(TASK_SCOPE + task_id)
        task = self._tasks.get(key)
        if task is None:
            return None
        if task.expires_at <= self._clock():
            del self._tasks[key]
            return None
        return task.version, task.record

    def put(self, task_id: str, record: str, *, version: int, ttl_ms: int) -> bool:
        """See :meth:`~mcp_sse_gateway.store.base.EventStore.put_task`."""
        current = self.get(task_id)
        key = session_digest(TASK_SCOPE + task_id)
        if version == 0:
            if current is not None:
                return False
            self._make_room()
            self._tasks[key] = _Task(1, record, self._clock() + ttl_ms / 1000)
            return True
        if current is None or current[0] != version:
            return False
        task = self._tasks[key]
        task.version, task.record = version + 1, record
        return True

    def clear(self) -> None:
        """Forget every record."""
        self._tasks.clear()

    def _make_room(self) -> None:
        if len(self._tasks) < self._max_tasks:
            return
        now = self._clock()
        for key in [k for k, t in self._tasks.items() if t.expires_at <= now]:
            del self._tasks[key]
        if len(self._tasks) >= self._max_tasks:
            raise StoreLimitExceeded(f"the store keeps {self._max_tasks} tasks already")
