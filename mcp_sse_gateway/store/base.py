"""The event-store interface shared by every backend (DESIGN D7).

Records are keyed by a digest of the session id, never the raw id (it is a bearer credential
for some servers). Backends must behave identically; one contract test suite runs against each.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

StreamKind = Literal["request", "standalone"]


#: Task records are keyed like sessions, by the digest of this prefix plus the task id: a task
#: id never appears in a key, and never collides with a session id's digest.
TASK_SCOPE = "task\x00"


@functools.lru_cache(maxsize=4096)
def session_digest(session_id: str) -> str:
    """A stable, non-reversible key for a session: 32 lower-case hex digits (BLAKE2b-128).

    Cached (the hot path computes it per event batch); the cache holds 4,096 ids at most.
    """
    return hashlib.blake2b(session_id.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """What the gateway knows of one MCP session.

    Attributes:
        key: :func:`session_digest` of the ``Mcp-Session-Id``.
        protocol_version: the version negotiated by initialize (e.g. ``"2025-11-25"``).
        deleted: the session was ended by DELETE (a tombstone: requests get 404).
        auth: the encoded :class:`~mcp_sse_gateway.auth.Binding` of its creator's credentials
            (keyed digests, never a credential), or ``""`` when none was kept.
    """

    key: str
    protocol_version: str
    deleted: bool = False
    auth: str = ""


class StoredEvent(NamedTuple):
    """One event of a stream, as stored and replayed.

    Attributes:
        offset: position in its stream life (1, 2, …), the last part of its wire id.
        data: the SSE ``data`` (a JSON-RPC message; line breaks normalised to LF).
        event: the SSE ``event`` type, or None for the default ``message``.
    """

    offset: int
    data: str
    event: str | None = None


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """Metadata of one stream life.

    Attributes:
        life: the stream life id (32 hex digits).
        kind: ``request`` (the answer to a POST) or ``standalone`` (the session's GET stream).
        first_offset: oldest offset still stored (``last_offset + 1`` when none is).
        last_offset: newest offset appended, 0 before the first event.
        finished: the terminal marker was appended: no event will follow ``last_offset``.
        owner: the replica whose pump writes this stream.
        auth: the encoded :class:`~mcp_sse_gateway.auth.Binding` of the credentials that
            created it, or ``""``.
        trace: the W3C ``traceparent`` of the request that created it (tracing on), or ``""``:
            the span a resume on any replica links to.
    """

    life: str
    kind: StreamKind
    first_offset: int
    last_offset: int
    finished: bool
    owner: str
    auth: str = ""
    trace: str = ""


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Events read after a cursor.

    Attributes:
        events: oldest first, consecutive offsets, at most the *limit* asked for.
        finished: the stream is finished and *events* reach its last offset: nothing follows.
        reader: the newest connection that claimed the stream (:meth:`EventStore.claim_reader`),
            ``""`` when none did.
    """

    events: list[StoredEvent]
    finished: bool
    reader: str = ""


@dataclass(frozen=True, slots=True)
class Lease:
    """A session's standalone lease (DESIGN D5): who pumps its one upstream GET, under which epoch.

    Attributes:
        holder: the replica id holding it.
        epoch: the fencing epoch: a new one on every acquisition by a new holder, so appends
            under an older one are refused.
    """

    holder: str
    epoch: int


def _ignore(_operation: str, _seconds: float) -> None:
    return None


@dataclass(frozen=True, slots=True)
class StoreObserver:
    """What a store reports of its calls (the gateway turns these into metrics).

    Attributes:
        queue_wait: ``(operation, seconds)``: how long a call waited for a connection.
        round_trip: ``(operation, seconds)``: how long a call then held it (its commands and
            their replies).
    """

    queue_wait: Callable[[str, float], None] = _ignore
    round_trip: Callable[[str, float], None] = _ignore


class EventStore(Protocol):
    """Where sessions (and, for resumable streams, their events) are kept.

    Every method may raise :class:`~mcp_sse_gateway.errors.StoreUnavailable` when the backend
    cannot be reached. Every method is safe to cancel: nothing is half-written.
    """

    async def record_session(
        self, session_id: str, protocol_version: str, *, auth: str = ""
    ) -> None:
        """Record (or refresh) a session's negotiated protocol version.

        *auth* is the encoded binding of the creator's credentials (opaque ASCII, no secret).
        """

    async def get_session(self, session_id: str, *, refresh: bool = True) -> SessionRecord | None:
        """The session's record, or None when there is none (never recorded, or expired).

        With *refresh* (client traffic), the record's idle TTL restarts.
        """

    async def tombstone_session(self, session_id: str) -> None:
        """Mark a session deleted; its record then reads ``deleted=True`` until it expires."""

    async def create_stream(
        self,
        session_id: str,
        life: str,
        *,
        kind: StreamKind,
        owner: str,
        pending: Sequence[str] = (),
        start_after: int = 0,
        auth: str = "",
        creator: str = "",
        trace: str = "",
    ) -> None:
        """Store a new stream life's metadata (before its priming event leaves).

        *auth* is the encoded binding of the creating request's credentials, read back in
        :attr:`StreamInfo.auth` (*trace*, a ``traceparent``, in :attr:`StreamInfo.trace`).
        *creator* is their digest: to make room, a new stream evicts
        only finished streams of the same *creator* (any, when ``""``), so a request nobody
        has authorized yet cannot push another user's stored answers out.

        *pending* are the SSE datas (JSON-RPC error responses, one per request id still waiting
        for its response) that :meth:`end_orphaned` appends if the owner dies first. The first
        event gets offset ``start_after + 1``: a stream life created again under the same id
        (the standalone stream's) starts after every offset it used before, so an old cursor
        gets :class:`~mcp_sse_gateway.errors.CursorGone`, never events it did not miss.

        Raises:
            StoreLimitExceeded: the session holds ``max_streams_per_session`` streams none of
                which is a finished one this creator may evict.
        """

    async def append(
        self,
        session_id: str,
        life: str,
        data: str,
        event: str | None,
        *,
        pending: Sequence[str] | None = None,
    ) -> int:
        """Append one event and wake its readers, atomically.

        With *pending* (an event that answered requests), the stream's pending error datas are
        replaced by it in the same atomic step.

        Returns:
            The event's offset (one more than the previous one).

        Raises:
            UnknownStream: the stream life does not exist (expired, or the session was purged).
        """

    async def append_many(
        self,
        session_id: str,
        life: str,
        events: Sequence[tuple[str, str | None]],
        *,
        pending: Sequence[str] | None = None,
        lease: Lease | None = None,
        finish: bool = False,
    ) -> int:
        """Append ``(data, event)`` pairs in order, atomically, waking readers once.

        With *lease*, the append is fenced: refused unless *lease* is still the session's.
        With *finish*, the terminal marker follows the events in the same step (as
        :meth:`finish` right after): the pump's last append, when the upstream body had ended.

        Returns:
            The offset of the last event.

        Raises:
            UnknownStream: as :meth:`append`.
            LeaseLost: *lease* is no longer the session's; nothing was stored.
            ValueError: *events* is empty.
        """

    async def finish(self, session_id: str, life: str) -> None:
        """Append the terminal marker: readers reaching the last offset then close. Idempotent."""

    async def read(self, session_id: str, life: str, after: int, limit: int) -> ReadResult:
        """Events with offsets after *after*, oldest first, at most *limit*.

        Raises:
            UnknownStream: no such stream life under this session.
            CursorGone: the event at ``after + 1`` was trimmed: a gap would be silent.
        """

    async def wait(
        self, session_id: str, life: str, after: int, timeout_s: float, *, reader: str | None = None
    ) -> bool:
        """Wait until an event after *after* is stored, the stream finished, was dropped or claimed.

        With *reader* (the caller's claim), a stream already claimed by another reader is news
        at once: a claim that landed between the caller's read and this wait is not missed.

        Returns:
            True when woken by one of those, False when *timeout_s* seconds passed first.
            Safe to cancel.
        """

    async def acquire_lease(self, session_id: str, holder: str, ttl_s: float) -> Lease | None:
        """Take the session's standalone lease for *ttl_s* seconds (DESIGN D5).

        Free or expired: *holder* gets it under a new epoch. Held by *holder* already: the same
        lease, renewed.

        Returns:
            The lease, or None when another replica holds it.
        """

    async def renew_lease(self, session_id: str, lease: Lease, ttl_s: float) -> bool:
        """Extend *lease* by *ttl_s* seconds from now; False when it is no longer the session's."""

    async def release_lease(self, session_id: str, lease: Lease) -> None:
        """Give *lease* up at once (drain, refused upstream GET); a stale one changes nothing."""

    async def claim_reader(self, session_id: str, life: str, reader: str) -> None:
        """Record *reader* as the newest connection of stream *life* and wake its waiters.

        Reads name it (:attr:`ReadResult.reader`), so an older connection to the same stream,
        on any replica, learns that it was replaced (DESIGN D5: the newest GET wins). A no-op
        on an unknown stream.
        """

    @property
    def parked(self) -> int:
        """Calls of :meth:`wait` in this process now waiting for a wake-up.

        Each has looked at its stream and will see any later append, finish or drop; tests
        wait on this count instead of yielding to the event loop and hoping.
        """

    async def stream_info(self, session_id: str, life: str) -> StreamInfo | None:
        """The stream life's metadata, or None when it does not exist under this session."""

    async def drop_stream(self, session_id: str, life: str) -> None:
        """Forget one stream life (its request was answered without a stream). Idempotent."""

    async def purge_session(self, session_id: str) -> None:
        """Drop every stream of the session (after DELETE). Idempotent."""

    async def heartbeat(self, replica_id: str) -> None:
        """Mark this replica alive for ``heartbeat_expiry_s`` seconds (one key per replica)."""

    async def replica_alive(self, replica_id: str) -> bool:
        """Whether *replica_id*'s heartbeat has not expired."""

    async def end_orphaned(
        self, session_id: str, life: str, error_datas: Sequence[str] | None = None
    ) -> bool:
        """End an unfinished stream whose owner's heartbeat expired, exactly once.

        Appends *error_datas* (JSON-RPC error responses; None: the stream's stored pending ones)
        then the terminal marker, as one compare-and-set. Returns True only for the caller that
        did it.
        """

    async def get_task(self, task_id: str) -> tuple[int, str] | None:
        """A task's version and record (JSON text), or None when unknown or expired (D11)."""

    async def put_task(self, task_id: str, record: str, *, version: int, ttl_ms: int) -> bool:
        """Write a task's record if it is still at *version* (0: create it, TTL *ttl_ms*).

        A compare-and-set: of two writers that read the same version, one wins. The record
        keeps the TTL it was created with.

        Returns:
            True when written (the task is then at ``version + 1``); False when another write
            came first, or the task expired.

        Raises:
            StoreLimitExceeded: a creation beyond the store's bound on tasks (memory).
        """

    async def ping(self) -> None:
        """Return when the store is reachable; raise ``StoreUnavailable`` otherwise."""

    async def close(self) -> None:
        """Release connections. Idempotent."""
