"""One connection's place in its stream, and what it delivered (:mod:`.delivery`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class DeliveryCursor:
    """Where a connection is in its stream: one position for store and feed alike.

    Attributes:
        offset: the last offset sent with an id (the starting cursor before that).
        unstored: events sent after it without an id (lost mode: they were never stored).
    """

    offset: int
    unstored: int = 0

    @property
    def position(self) -> int:
        """The feed position of the next event (offset *n* is at *n* - 1)."""
        return self.offset + self.unstored


@dataclass(slots=True)
class Delivered:
    """What one connection delivered, for the canonical log line.

    Attributes:
        events: events written.
        cursor: the last offset written (or the starting cursor).
        ended: why the connection ended: ``finished``, ``poll``, ``replay_bound``,
            ``store_lost``, ``finished_unstored``, ``superseded``, ``draining``,
            ``stream_dropped``, ``error``, ``slow_reader`` or ``client_gone``.
    """

    events: int
    cursor: int
    ended: str = ""
