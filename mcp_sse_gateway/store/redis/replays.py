"""Replay reads without the read script's work per event: known small events, read raw.

The read script (``read.lua``) counts the bytes of each event against its reply's budget, so a
batch of big events never becomes one huge reply. Doing so in Lua converts every entry into Lua
values and the reply back: most of what a long replay costs Redis (1.4 to 1.9 ms of server
time per 1,000 events of 300 B, of which the ``XRANGE`` itself is 0.4 ms). Yet most events are
small, and a read that knows the next *n* events are all small needs no count: *n* of them fit
the budget.

**What is known.** Every event of a request stream larger than :data:`SMALL_EVENT_BYTES` (data
and type) is listed by offset in the stream's sorted set of big events, created with the stream
and kept by the append scripts, with a member saying up to which offset the list is complete
(an older replica's append, which lists nothing, leaves it behind for good; without the set,
expired or evicted, nothing is known; ``prelude.lua``). Both read scripts return
``small_until``: every event after the read's cursor up to that offset is small. Stored events
never change (they are only trimmed or dropped, which a read's checks see), and a request
stream's life is never created again (its id is random), so what a read learns holds for later
reads of the same stream, on this replica: :class:`SmallEvents` keeps it, per stream life,
bounded, and forgets it when a read finds the stream or the cursor gone. A standalone stream
(created again under the same id) is read by the read script only.

**The fast read.** A read after a cursor inside a known small range is one transaction:
``MULTI``, ``EVALSHA read_head`` (the checks of ``read.lua``: stream known, cursor stored, TTL
refreshes, the newest reader, and ``small_until`` again), ``XRANGE`` of the *n* offsets after
the cursor, ``EXEC``. *n* is the read's whole batch, within the known range and at most
``READ_MAX_BYTES // SMALL_EVENT_BYTES``, so the reply stays within the budget and is what the
read script would return; else the read script serves the read. The replies are read raw (no
redis-py parsing into dicts). Redis Cluster clients keep the read script.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio import Redis

from mcp_sse_gateway.errors import CursorGone, StoreUnavailable, UnknownStream
from mcp_sse_gateway.store.base import ReadResult, StoredEvent
from mcp_sse_gateway.store.redis.calls import RUNNING, Calls
from mcp_sse_gateway.store.redis.keys import SessionKeys
from mcp_sse_gateway.store.redis.lua import Scripts
from mcp_sse_gateway.store.redis.replies import stored_events, text

#: An event of more than this many bytes (data and type) is a big one (``SMALL_BYTES`` in
#: ``prelude.lua``: the two must agree).
SMALL_EVENT_BYTES = 1024
#: Stream lives whose known small range is kept, at most (the oldest is forgotten first).
MAX_KNOWN = 4096

#: Fields of an entry with an event type: ``d``, the data, ``e``, the type.
TYPED = 4
#: Error replies of the read scripts.
UNKNOWN = -1
LOST = -2


class SmallEvents:
    """Per stream life, the range of offsets a read found all small: ``(after, until]``.

    Args:
        max_known: stream lives kept at most.
    """

    def __init__(self, max_known: int = MAX_KNOWN) -> None:
        self._known: dict[tuple[str, str], tuple[int, int]] = {}
        self._max = max_known

    def learn(self, digest: str, life: str, after: int, until: int) -> None:
        """A read after *after* found the events up to *until* small (until == after: none)."""
        key = (digest, life)
        if until <= after:
            self._known.pop(key, None)
            return
        self._known.pop(key, None)
        if len(self._known) >= self._max:
            del self._known[next(iter(self._known))]
        self._known[key] = (after, until)

    def forget(self, digest: str, life: str) -> None:
        """Forget what was learnt of a stream life (dropped, or its cursor gone)."""
        self._known.pop((digest, life), None)

    def until(self, digest: str, life: str, after: int) -> int:
        """The offset up to which the events after *after* are known small (*after*: none)."""
        known = self._known.get((digest, life))
        if known is None or not known[0] <= after < known[1]:
            return after
        return known[1]

    def __len__(self) -> int:
        return len(self._known)


class Replays:
    """Fast reads of known small events (module docstring), on one non-cluster client.

    Args:
        client: the command client; its connection pool is shared, under the store's permits.
        scripts: the store's scripts.
        calls: the store's call queue and outage state.
    """

    def __init__(self, client: Redis, scripts: Scripts, calls: Calls) -> None:
        # A client of its own on the same pool (its connections, and their repeat policy):
        # XRANGE replies stay raw here only.
        self._client = Redis(connection_pool=client.connection_pool)
        self._client.set_response_callback("XRANGE", _raw)
        self._scripts, self._calls = scripts, calls
        self.known = SmallEvents()

    def fast_count(
        self, keys: SessionKeys, life: str, after: int, limit: int, max_bytes: int
    ) -> int:
        """*limit* when a fast read may serve the read, else 0 (use the read script).

        *max_bytes* is the reply's budget (``READ_MAX_BYTES``): so many small events fit it.
        """
        known = self.known.until(keys.digest, life, after) - after
        # Only a whole batch: a read returns what the read script would (a shorter batch would
        # tell the delivery it caught up).
        return limit if limit <= min(max_bytes // SMALL_EVENT_BYTES, known) else 0

    async def read(
        self, keys: SessionKeys, life: str, after: int, count: int, *, refresh: bool
    ) -> ReadResult:
        """The *count* (from :meth:`fast_count`) events after *after*, in one transaction.

        Raises:
            UnknownStream: no such stream life under this session.
            CursorGone: the event at ``after + 1`` is no longer stored, or *after* is beyond
                the last offset.
            StoreUnavailable: Redis cannot be reached, stalled, or refused the call.
        """
        stream = keys.stream(life)
        args = self._scripts.evalsha_args(
            "read_head", keys, [keys.meta(life), stream], [after], refresh=refresh
        )
        async with self._calls.call("read", RUNNING):
            head, entries = await self._transaction(args, stream, after, count)
        if head[0] in {UNKNOWN, LOST}:
            self.known.forget(keys.digest, life)
            raise UnknownStream if head[0] == UNKNOWN else CursorGone
        finished, last, reader, small_until = head
        self.known.learn(keys.digest, life, after, int(small_until))
        events = _events(after + 1, entries)
        reached = events[-1].offset if events else after
        return ReadResult(events, bool(finished) and reached >= int(last), text(reader))

    async def _transaction(
        self, args: Sequence[str | int], stream: str, after: int, count: int
    ) -> tuple[Any, Any]:
        """``MULTI``, the checks, the ``XRANGE``, ``EXEC``; the script loaded once if needed."""
        for attempt in range(2):
            pipe = self._client.pipeline(transaction=True)
            pipe.execute_command("EVALSHA", *args)
            pipe.execute_command("XRANGE", stream, f"(0-{after}", f"0-{after + count}")
            head, entries = await pipe.execute(raise_on_error=False)
            if isinstance(head, redis_errors.NoScriptError) and attempt == 0:
                await self._scripts.load("read_head")  # Redis restarted since: load it again
                continue
            for reply in (head, entries):
                if isinstance(reply, BaseException):
                    raise reply
            return head, entries
        raise StoreUnavailable("the Redis event store lost its read script")  # pragma: no cover


def _raw(response: Any, **_options: Any) -> Any:
    return response


def _events(first: int, entries: Sequence[Any]) -> list[StoredEvent]:
    """The events of raw ``XRANGE`` entries ``[id, [b"d", data, (b"e", type)]]`` from *first*.

    Raises:
        StoreUnavailable: the entries are not consecutive from *first* (the transaction's
            checks make that impossible; a store changed by something else is not served).
    """
    if not entries:
        return []
    if text(entries[-1][0]) != f"0-{first + len(entries) - 1}":
        raise StoreUnavailable("the Redis stream does not hold consecutive events")
    fields = [entry[1] for entry in entries]
    types = [field[3] if len(field) == TYPED else None for field in fields]
    return stored_events(first, [field[1] for field in fields], types)
