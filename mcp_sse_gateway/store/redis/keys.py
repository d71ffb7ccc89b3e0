"""Every Redis key and channel name the Redis event store uses, in one place (DESIGN D7).

All names start with the configured ``key_prefix``. The keys of one session share one hash tag,
the session digest in braces, so a Lua script may touch several of them in Redis Cluster (one
slot)::

    <prefix>:{<digest>}:session          hash    protocol version ``v``, tombstone flag ``d``,
                                                 creator binding ``a``
    <prefix>:{<digest>}:streams          list    stream lives of the session, oldest first
    <prefix>:{<digest>}:fresh            string  set while the session's TTLs were refreshed lately
    <prefix>:{<digest>}:meta:<life>      hash    ``kind``, ``owner``, ``last``, ``fin`` (0/1),
                                                 creator ``auth`` binding and ``creator``
                                                 credential digest (keyed; DESIGN D8), newest
                                                 reader ``rdr`` (DESIGN D5)
    <prefix>:{<digest>}:meta:<life>:big  zset    a request stream's events over 1 KiB by offset,
                                                 and ``~``: listed up to this offset (see
                                                 ``replays.py``)
    <prefix>:{<digest>}:meta:<life>:watch string set while a reader waits through the store
    <prefix>:{<digest>}:stream:<life>    stream  the events, entry id ``0-<offset>``
    <prefix>:{<digest>}:lease            hash    the standalone lease: holder ``h``, epoch ``e``
                                                 (expires unless renewed; DESIGN D5)
    <prefix>:{<digest>}:epoch            string  the session's last lease epoch (INCR)
    <prefix>:{<task digest>}:task        hash    a task's version ``v`` and record ``r`` (JSON;
                                                 TTL ``ttlMs``; DESIGN D11). The digest is of
                                                 ``TASK_SCOPE`` + the task id
    <prefix>:replica:<replica id>        string  a replica's heartbeat (one key per replica)
    <prefix>:wake                        channel wake-up messages ``<digest> <life>``

*digest* is :func:`~mcp_sse_gateway.store.base.session_digest` (32 hex digits): a raw session id
never appears in a key. Sans-IO.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcp_sse_gateway.store.base import session_digest


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """The key names of one session.

    Attributes:
        digest: the session digest (32 hex digits), also the hash tag.
        base: ``<prefix>:{<digest>}``, the start of every key of the session.
    """

    digest: str
    base: str

    @classmethod
    def of(cls, prefix: str, session_id: str) -> SessionKeys:
        """The keys of the session *session_id* under *prefix*."""
        digest = session_digest(session_id)
        return cls(digest=digest, base=f"{prefix}:{{{digest}}}")

    @property
    def session(self) -> str:
        """The session record (hash)."""
        return f"{self.base}:session"

    @property
    def index(self) -> str:
        """The session's stream lives (list): open ones by creation, finished ones by finish."""
        return f"{self.base}:streams"

    @property
    def fresh(self) -> str:
        """Marker: present while the TTLs of all the session's streams were refreshed lately."""
        return f"{self.base}:fresh"

    @property
    def meta_prefix(self) -> str:
        """``meta(life)`` is this plus the life (Lua scripts build names of other lives so)."""
        return f"{self.base}:meta:"

    @property
    def stream_prefix(self) -> str:
        """``stream(life)`` is this plus the life."""
        return f"{self.base}:stream:"

    @property
    def lease(self) -> str:
        """The session's standalone lease (hash; expires unless renewed)."""
        return f"{self.base}:lease"

    @property
    def task(self) -> str:
        """A task's record (hash; the "session" is the task's scope, see ``TASK_SCOPE``)."""
        return f"{self.base}:task"

    @property
    def epoch(self) -> str:
        """The session's lease epoch counter (string, INCR)."""
        return f"{self.base}:epoch"

    def meta(self, life: str) -> str:
        """The metadata hash of one stream life."""
        return f"{self.meta_prefix}{life}"

    def stream(self, life: str) -> str:
        """The Redis stream holding one stream life's events."""
        return f"{self.stream_prefix}{life}"

    def wake_message(self, life: str) -> str:
        """The wake-up message published when *life* changes (appended, finished, dropped)."""
        return f"{self.digest} {life}"


def heartbeat_key(prefix: str, replica_id: str) -> str:
    """The heartbeat key of one replica (its own slot: it belongs to no session)."""
    return f"{prefix}:replica:{replica_id}"


def wake_channel(prefix: str) -> str:
    """The Pub/Sub channel carrying every wake-up of this key prefix."""
    return f"{prefix}:wake"


def parse_wake_message(message: str) -> tuple[str, str] | None:
    """``(digest, life)`` of a wake-up message, or None when it is not one."""
    digest, sep, life = message.partition(" ")
    if not sep or not digest or not life:
        return None
    return digest, life
