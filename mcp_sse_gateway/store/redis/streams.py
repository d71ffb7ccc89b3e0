"""Stream reads and writes of the Redis event store: one script per call (DESIGN D7).

:class:`StreamStore` is the stream half of :class:`~mcp_sse_gateway.store.redis.RedisStore`:
creating a stream life (bounded per session, evicting only the creator's finished streams),
appending (idempotent on repeat, lost events detected), finishing, reading (bounded replies;
events known small in one transaction, :mod:`~mcp_sse_gateway.store.redis.replays`) and
metadata. The scripts are in ``scripts/`` (:mod:`~mcp_sse_gateway.store.redis.lua`).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any, cast

import structlog

from mcp_sse_gateway.errors import CursorGone, LeaseLost, StoreLimitExceeded, UnknownStream
from mcp_sse_gateway.store.base import Lease, ReadResult, StreamInfo, StreamKind
from mcp_sse_gateway.store.redis.batches import Batches
from mcp_sse_gateway.store.redis.calls import NEW, RUNNING, Calls
from mcp_sse_gateway.store.redis.keys import SessionKeys
from mcp_sse_gateway.store.redis.local_cache import Refreshes
from mcp_sse_gateway.store.redis.lua import Scripts
from mcp_sse_gateway.store.redis.offsets import WrittenOffsets
from mcp_sse_gateway.store.redis.replays import Replays
from mcp_sse_gateway.store.redis.replies import stored_events, text

log = structlog.get_logger("mcp_sse_gateway.store")

#: Bytes of event data one ``read`` returns at most (always at least one event, whatever its size):
#: reads share pipelines (:mod:`~mcp_sse_gateway.store.redis.batches`), 16 at most of this size.
READ_MAX_BYTES = 1024 * 1024

#: Replies of the append and read scripts.
UNKNOWN = -1
LOST = -2
#: The append's lease is no longer the session's (fencing; DESIGN D5).
LEASE_LOST = -3


def join_datas(datas: Sequence[str]) -> str:
    """Datas as one field value, LF-separated (each is single-line JSON)."""
    if any("\n" in data for data in datas):
        raise ValueError("pending error datas must be single lines")
    return "\n".join(datas)


def ms(seconds: float) -> int:
    """Seconds as whole milliseconds, at least 1 (a TTL of 0 would delete the key)."""
    return max(1, round(seconds * 1000))


class StreamStore:
    """The stream operations of a Redis event store.

    Args:
        scripts: the store's scripts.
        calls: the store's call queue and outage state.
        written: the store's offsets.
        prefix: the key prefix.
        max_events: events kept per stream.
        max_streams: stream lives kept per session.
        finished_ms: a finished stream's TTL, ms.
        refresh_period_s: a stream's TTLs are refreshed at most this often, seconds.
    """

    def __init__(
        self,
        scripts: Scripts,
        calls: Calls,
        written: WrittenOffsets,
        *,
        prefix: str,
        max_events: int,
        max_streams: int,
        finished_ms: int,
        refresh_period_s: float,
    ) -> None:
        self._scripts = scripts
        self._calls = calls
        self._written = written
        self._prefix = prefix
        self._max_events = max_events
        self._max_streams = max_streams
        self._finished_ms = finished_ms
        self._read_max_bytes = READ_MAX_BYTES
        self._refreshes = Refreshes(refresh_period_s)
        #: Concurrent calls of one kind share pipelines (None: one round trip each).
        self._batches: Batches | None = None
        #: Reads of events known to be small, without the read script (None: Redis Cluster).
        self._replays: Replays | None = None

    async def _script(
        self,
        name: str,
        priority: int,
        keys: SessionKeys,
        extra_keys: Sequence[str] = (),
        args: Sequence[str | int] = (),
        *,
        refresh: bool = True,
        operation: str | None = None,
        weight: int | None = None,
    ) -> Any:
        """Run script *name* as one store call of *operation* (default: *name*), batched.

        *weight*: the bytes its reply may carry, when more than it sends (a read).

        Raises:
            StoreUnavailable: Redis cannot be reached, stalled, or refused the call.
            StoreBusy: new work (*priority* NEW) while the call queue is full.
        """
        operation = operation or name
        if self._batches is None:
            async with self._calls.call(operation, priority):
                return await self._scripts.run(name, keys, extra_keys, args, refresh=refresh)
        batches = self._batches.of(operation, priority)
        return await batches.run(name, keys, extra_keys, args, refresh=refresh, weight=weight)

    def _keys(self, session_id: str) -> SessionKeys:
        return SessionKeys.of(self._prefix, session_id)

    async def drop_stream(self, session_id: str, life: str) -> None:
        """Forget one stream life; its waiters are woken. Idempotent.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        keys = self._keys(session_id)
        await self._script("drop_stream", RUNNING, keys, (), [life])
        self._written.forget(keys.digest, life)
        if self._replays is not None:
            self._replays.known.forget(keys.digest, life)

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

        Args:
            session_id: the raw session id.
            life: the new stream life (32 hex digits); an existing one is replaced.
            kind: ``request`` or ``standalone``.
            owner: the replica whose pump writes the stream (see :meth:`end_orphaned`).
            pending: error datas :meth:`end_orphaned` appends if the owner dies first (one
                JSON-RPC error response per request id; single-line JSON).
            start_after: the first event gets offset ``start_after + 1`` (a re-created stream
                life starts after every offset its earlier incarnation used).
            auth: the encoded binding of the creating request's credentials (no secret).
            creator: their digest: only finished streams of the same creator are evicted to
                make room (any, when ``""``).
            trace: the creating request's ``traceparent`` (tracing on), or ``""``.

        Raises:
            StoreLimitExceeded: the session already holds ``max_streams_per_session``
                streams and none is a finished one of this creator (those are evicted to make
                room first, oldest first).
            StoreUnavailable: Redis cannot be reached.
        """
        keys = self._keys(session_id)
        created = await self._script(
            "create_stream",
            NEW,
            keys,
            [keys.meta(life), keys.stream(life)],
            [
                life,
                kind,
                owner,
                self._max_streams,
                join_datas(pending),
                start_after,
                auth,
                creator,
                trace,
            ],
        )
        if not created:
            log.warning("store.streams_per_session_limit", limit=self._max_streams)
            raise StoreLimitExceeded("too many open streams in this session")
        self._written.track(keys.digest, life, 0)

    async def append(
        self,
        session_id: str,
        life: str,
        data: str,
        event: str | None,
        *,
        pending: Sequence[str] | None = None,
    ) -> int:
        """Append one event: :meth:`append_many` with one event; returns its offset."""
        return await self.append_many(session_id, life, [(data, event)], pending=pending)

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
        """Append events in order and wake their readers, atomically (one script, one wake-up).

        Args:
            session_id: the raw session id.
            life: the stream life.
            events: ``(data, event type or None)`` pairs, at least one (each data's size is
                bounded upstream by ``max_event_bytes``).
            pending: when given, replaces the stream's pending error datas in the same script
                (the events answered requests; see :meth:`end_orphaned`).
            lease: when given, the append is refused unless it is still the session's (the
                same script checks it: fencing).
            finish: the terminal marker follows the events in the same script (as
                :meth:`finish` right after: one round trip less for the pump's last append).

        Returns:
            The offset of the last event (the first one's is ``len(events) - 1`` less).

        Raises:
            UnknownStream: the stream life does not exist (expired, purged, or lost by Redis),
                or events this process appended were lost (the life is then dropped).
            LeaseLost: *lease* is no longer the session's; nothing was stored.
            StoreUnavailable: Redis cannot be reached (the events may or may not be stored).
        """
        if not events:
            raise ValueError("append_many needs at least one event")
        keys = self._keys(session_id)
        expected = self._written.expected(keys.digest, life)
        # A repeat after a lost reply carries the same token: the script recognises an applied
        # first attempt (unless another append to the stream came in between), never storing
        # the events twice.
        token = secrets.token_hex(8)
        args: list[Any] = [
            life,
            self._max_events,
            expected,
            token,
            "0" if pending is None else "1",
            "" if pending is None else join_datas(pending),
            "" if lease is None else lease.holder,
            "" if lease is None else lease.epoch,
            "1" if finish else "0",
            self._finished_ms,
        ]
        for data, event in events:
            args += (data, "" if event is None else "=" + event)
        offset, trimmed = await self._script(
            "append",
            RUNNING,
            keys,
            [keys.meta(life), keys.stream(life), keys.lease],
            args,
            refresh=self._refreshes.due(keys.digest, life),
        )
        if offset == LEASE_LOST:
            raise LeaseLost("the session's lease was taken over")
        if offset == LOST:
            log.error("store.stream_lost", session=keys.digest, expected_offset=expected)
            self._written.forget(keys.digest, life)
            raise UnknownStream("events of this stream life were lost by the store")
        if offset == UNKNOWN:
            self._written.forget(keys.digest, life)
            raise UnknownStream
        if trimmed:
            log.warning("store.stream_trimmed", limit_events=self._max_events)
        if finish:
            self._written.forget(keys.digest, life)
        elif expected >= 0:
            self._written.track(keys.digest, life, offset)
        return int(offset)

    async def finish(self, session_id: str, life: str) -> None:
        """Append the terminal marker and wake readers. Idempotent; no-op on unknown streams.

        The stream then stays replayable ``finished_stream_ttl_s`` seconds.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        keys = self._keys(session_id)
        await self._script(
            "finish",
            RUNNING,
            keys,
            [keys.meta(life), keys.stream(life)],
            [life, self._finished_ms],
            refresh=self._refreshes.due(keys.digest, life),
        )
        self._written.forget(keys.digest, life)

    async def read(self, session_id: str, life: str, after: int, limit: int) -> ReadResult:
        """Events with offsets after *after*, oldest first, at most *limit*.

        One script, or a transaction for events known small
        (:mod:`~mcp_sse_gateway.store.redis.replays`). Fewer than *limit* may come back while
        more are stored: a reply carries at most :data:`READ_MAX_BYTES` of event data (but
        always one event). Read again from the last offset returned.

        Raises:
            UnknownStream: no such stream life under this session.
            CursorGone: the event at ``after + 1`` is no longer stored (trimmed, evicted, lost),
                or *after* is beyond the last offset.
            StoreUnavailable: Redis cannot be reached.
        """
        keys = self._keys(session_id)
        refresh = self._refreshes.due(keys.digest, life)
        replays = self._replays
        if replays is not None:
            count = replays.fast_count(keys, life, after, limit, self._read_max_bytes)
            if count > 0:
                return await replays.read(keys, life, after, count, refresh=refresh)
        reply = await self._script(
            "read",
            RUNNING,
            keys,
            [keys.meta(life), keys.stream(life)],
            [after, max(0, limit), self._read_max_bytes],
            weight=self._read_max_bytes,
            refresh=refresh,
        )
        if reply[0] in {UNKNOWN, LOST}:
            if replays is not None:
                replays.known.forget(keys.digest, life)
            raise UnknownStream if reply[0] == UNKNOWN else CursorGone
        finished, last, datas, types, reader, small_until = reply
        if replays is not None:
            replays.known.learn(keys.digest, life, after, int(small_until))
        events = stored_events(after + 1, datas, _kinds(types, len(datas)))
        reached = events[-1].offset if events else after
        return ReadResult(events, bool(finished) and reached >= last, text(reader))

    async def stream_info(self, session_id: str, life: str) -> StreamInfo | None:
        """The stream life's metadata, or None when it does not exist under this session.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        keys = self._keys(session_id)
        reply = await self._script(
            "stream_info",
            RUNNING,
            keys,
            [keys.meta(life), keys.stream(life)],
            refresh=self._refreshes.due(keys.digest, life),
        )
        if reply is None:
            return None
        kind, owner, last, finished, stored, binding, trace = reply
        return StreamInfo(
            life=life,
            kind=cast("StreamKind", text(kind)),
            first_offset=int(last) - int(stored) + 1,
            last_offset=int(last),
            finished=bool(finished),
            owner=text(owner),
            auth=text(binding),
            trace=text(trace),
        )


def _kinds(runs: Sequence[Any], count: int) -> list[bytes | str | None] | None:
    """Each of *count* events' type from the read script's runs (``index, '=' type or ''``).

    None when no event is typed. Built a run at a time (C-level list repetition).
    """
    if not any(runs[1::2]):
        return None
    kinds: list[bytes | str | None] = []
    for at in range(0, len(runs), 2):
        start = int(runs[at]) - 1
        stop = int(runs[at + 2]) - 1 if at + 2 < len(runs) else count
        kind = runs[at + 1]
        kinds += [kind[1:] if kind else None] * (stop - start)
    return kinds
