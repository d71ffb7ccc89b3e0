"""What this process appended, to tell lost events from a stream that moved on (DESIGN D7).

A writer remembers, per stream life, the last offset it appended. When the stream's offsets went
backwards behind its back (a restore or failover lost acknowledged events), the ``append``
script sees the stored offset below the remembered one and drops the unfinished stream life, so
its readers get ``UnknownStream`` instead of reused offsets. Sans-IO, bounded.
"""

from __future__ import annotations

#: Stream lives remembered at most; the oldest sessions are forgotten first.
MAX_TRACKED_STREAMS = 100_000


class WrittenOffsets:
    """The last offset appended per (session digest, stream life), at most *limit* lives.

    A life never tracked (or forgotten) has no expectation: ``expected`` is -1 and the append
    script then checks nothing.
    """

    def __init__(self, limit: int = MAX_TRACKED_STREAMS) -> None:
        self._limit = limit
        # digest -> life -> offset; sessions in insertion order, so the oldest goes first.
        self._written: dict[str, dict[str, int]] = {}
        self._tracked = 0

    def __len__(self) -> int:
        return self._tracked

    def expected(self, digest: str, life: str) -> int:
        """The last offset this process appended to the life, or -1 when not tracked."""
        return self._written.get(digest, {}).get(life, -1)

    def track(self, digest: str, life: str, offset: int) -> None:
        """Remember *offset* (never lowering it: concurrent appends complete out of order)."""
        lives = self._written.setdefault(digest, {})
        if life not in lives:
            self._tracked += 1
        lives[life] = max(offset, lives.get(life, 0))
        while self._tracked > self._limit:
            oldest = next(iter(self._written))
            self._tracked -= len(self._written.pop(oldest))

    def forget(self, digest: str, life: str | None = None) -> None:
        """Forget one life, or every life of the session when *life* is None."""
        lives = self._written.get(digest)
        if lives is None:
            return
        if life is None:
            self._tracked -= len(lives)
            del self._written[digest]
        elif lives.pop(life, None) is not None:
            self._tracked -= 1
            if not lives:
                del self._written[digest]
