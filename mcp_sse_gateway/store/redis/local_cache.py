"""What one replica remembers to save Redis round trips (DESIGN D2, D7: slow is not down).

* **TTL refreshes**: a stream's keys (and its session's list) are refreshed by the scripts at
  most once per :data:`REFRESH_PERIOD_S` (or a twentieth of ``session_idle_ttl_s`` when that is
  shorter) per replica, not on every append or read. Their TTLs are 1.1 times
  ``session_idle_ttl_s``, so a stream still lives at least ``session_idle_ttl_s`` after the
  session's last use.
* **Session records**: a record read from Redis is served from here for
  :data:`SESSION_CACHE_S`, and its idle TTL is refreshed then at most once per that period.
  The staleness bound: a DELETE on another replica is seen here within :data:`SESSION_CACHE_S`
  (then the record reads ``deleted`` and the session answers 404, DESIGN D3); on this replica at
  once (the entry is replaced). Absent sessions are never cached: a session created on another
  replica is found at once.

Both are bounded (:data:`MAX_ENTRIES`, oldest first out). Sans-IO; the clock is injectable.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from mcp_sse_gateway.store.base import SessionRecord

#: A replica refreshes one stream's TTLs at most this often, seconds.
REFRESH_PERIOD_S = 30.0
#: A session record is served from memory this long after it was read, seconds (the bound on
#: how late this replica sees a DELETE made on another one).
SESSION_CACHE_S = 1.0
#: Entries kept per table at most.
MAX_ENTRIES = 100_000


class _Expiring:
    """Values with an expiry, oldest first out beyond *limit*."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._entries: dict[object, tuple[float, object]] = {}

    def get(self, key: object, now: float) -> object | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] <= now:
            del self._entries[key]
            return None
        return entry[1]

    def put(self, key: object, value: object, until: float) -> None:
        self._entries.pop(key, None)  # re-inserted last: the oldest stay first
        self._entries[key] = (until, value)
        while len(self._entries) > self._limit:
            del self._entries[next(iter(self._entries))]

    def drop(self, key: object) -> None:
        self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)


class Refreshes:
    """Which streams this replica refreshed less than *period_s* ago."""

    def __init__(
        self,
        period_s: float = REFRESH_PERIOD_S,
        *,
        limit: int = MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._period_s = period_s
        self._clock = clock
        self._recent = _Expiring(limit)

    def due(self, digest: str, life: str) -> bool:
        """Whether this call should refresh the stream's TTLs (and then counts as having)."""
        now = self._clock()
        if self._recent.get((digest, life), now) is not None:
            return False
        self._recent.put((digest, life), True, now + self._period_s)
        return True

    def __len__(self) -> int:
        return len(self._recent)


class SessionCache:
    """Session records read lately, by session digest.

    An entry remembers whether its read refreshed the session's TTLs: a client request
    (``refresh``) is served from memory only by an entry that did. A record read while the
    session was forgotten here (its DELETE or initialize ran meanwhile) is not kept.
    """

    def __init__(
        self,
        ttl_s: float = SESSION_CACHE_S,
        *,
        limit: int = MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._records = _Expiring(limit)
        self._reading: dict[str, int] = {}  # digest -> reads in flight
        self._stale: set[str] = set()  # digests forgotten while a read was in flight

    def get(self, digest: str, *, refresh: bool) -> SessionRecord | None:
        """The record read less than ``ttl_s`` ago (by a refreshing read, if *refresh*)."""
        entry = self._records.get(digest, self._clock())
        if not isinstance(entry, tuple):
            return None
        record, refreshed = entry
        return record if refreshed or not refresh else None

    def start_read(self, digest: str) -> None:
        """A read of the record from Redis begins (see :meth:`finish_read`)."""
        self._reading[digest] = self._reading.get(digest, 0) + 1

    def finish_read(self, digest: str, record: SessionRecord | None, *, refreshed: bool) -> None:
        """The read begun by :meth:`start_read` ended: keep *record* unless it may be stale."""
        left = self._reading.get(digest, 1) - 1
        stale = digest in self._stale
        if left:
            self._reading[digest] = left
        else:
            self._reading.pop(digest, None)
            self._stale.discard(digest)
        if record is not None and not stale:
            self.put(record, refreshed=refreshed)

    def put(self, record: SessionRecord, *, refreshed: bool = True) -> None:
        """Remember *record* (just read from, or written to, Redis)."""
        self._records.put(record.key, (record, refreshed), self._clock() + self._ttl_s)

    def forget(self, digest: str) -> None:
        """Drop what is remembered of the session (it changed here)."""
        self._records.drop(digest)
        if digest in self._reading:
            self._stale.add(digest)

    def __len__(self) -> int:
        return len(self._records)
