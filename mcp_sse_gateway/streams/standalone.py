"""The standalone stream of a session (D5): one upstream GET per session across all replicas.

The first client GET of a resumable session takes the session's lease in the store and opens
the upstream GET; its pump (:mod:`~mcp_sse_gateway.streams.standalone_pump`) reads it into the
session's one standalone stream life for as long as the session lives, on that replica, even
when the client moves to another one. A client GET on any other replica attaches to the stored
life at its live end (a GET with ``Last-Event-ID`` replays from its cursor first), and stands
by: if the lease's holder dies (its lease expires), drains or is refused by the upstream (it
releases the lease), the standing-by replica takes the lease over and opens the upstream GET
with its client's headers, within ``lease_ttl_s`` plus one renewal period.

Every client connection claims the stream life in the store (:meth:`~mcp_sse_gateway.store.
base.EventStore.claim_reader`): the claim wakes the older connection wherever it is, and its
next read tells it that it was replaced (it closes with ``retry``): the newest GET wins.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import structlog

from mcp_sse_gateway.errors import GatewayBusy, StoreError
from mcp_sse_gateway.store.base import Lease, StreamInfo, session_digest
from mcp_sse_gateway.streams.context import StreamContext
from mcp_sse_gateway.streams.standalone_pump import StandalonePump, create_standalone
from mcp_sse_gateway.streams.upstream import (
    UpstreamCall,
    UpstreamResponse,
    is_event_stream,
)

log = structlog.get_logger("mcp_sse_gateway.managed")


R = TypeVar("R")
#: A stand-by ends after this many renewal periods in a row without a reader on this replica.
STANDBY_IDLE_TICKS = 2


def standalone_life(session_id: str) -> str:
    """The one stream life of a session's standalone GET stream (D5): stable for the session.

    Derived with a different hash key than :func:`session_digest`, so the digests in logs
    reveal nothing of it; it is only meaningful together with the session id anyway.
    """
    return hashlib.blake2b(
        session_id.encode("utf-8", "surrogatepass"), key=b"standalone-stream", digest_size=16
    ).hexdigest()


@dataclass(frozen=True, slots=True)
class Refused(Generic[R]):
    """A client GET that may not attach: the authorizer's refusal, or the upstream's answer.

    Attributes:
        refusal: what joining the open upstream GET was refused with (D8).
        response: the upstream's answer to opening the GET, not an event stream: relay it.
    """

    refusal: R | None = None
    response: UpstreamResponse | None = None


class _SessionLock:
    """A session's standalone lock and how many tasks hold or await it."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class StandaloneStreams:
    """The standalone streams of one app: one upstream GET per session, pumped into the store.

    Args:
        ctx: the app's stream layer.

    Attributes:
        pumps: session digest → the task pumping its upstream GET on this replica.
        calls: session digest → the newest client GET's call on this replica: its headers
            (credentials) open or re-open the upstream GET, so a refreshed token is used from
            the next re-open on (they never leave this replica: the store keeps no credentials).
    """

    def __init__(self, ctx: StreamContext) -> None:
        self._ctx = ctx
        self.pumps: dict[str, asyncio.Task[None]] = {}
        self.calls: dict[str, UpstreamCall] = {}
        self._locks: dict[str, _SessionLock] = {}
        #: session digest → the task standing by to take the session's lease over.
        self._standby: dict[str, asyncio.Task[None]] = {}

    def running(self, session_id: str) -> bool:
        """Whether this process pumps the session's upstream GET now."""
        task = self.pumps.get(session_digest(session_id))
        return task is not None and not task.done()

    async def ensure(
        self,
        session_id: str,
        call: UpstreamCall,
        authorize_join: Callable[[StreamInfo | None], Awaitable[R | None]],
    ) -> Refused[R] | None:
        """Keep one upstream GET open for the session on any replica (open it with *call*).

        Serialised per session on this replica, and by the session's lease across replicas, so
        concurrent client GETs never open two upstream GETs. A client GET joining the open one
        (here or on another replica) is authorized (*authorize_join*, given the stream's
        metadata; D8) before its headers are kept for re-opening it or taking it over; a GET
        that opens one is authorized by the upstream itself.

        Returns:
            None when the client may attach, else why not.

        Raises:
            GatewayBusy: this replica pumps ``server.max_pumps`` standalone streams already.
            UpstreamError: the upstream failed before its response headers (502).
            StoreUnavailable: the store cannot be asked.
        """
        key = session_digest(session_id)
        life = standalone_life(session_id)
        authorized = False
        if self.running(session_id):
            # Authorized before the session's lock: a flood of refused GETs must not queue the
            # creator's own behind their probes.
            refusal = await authorize_join(await self._ctx.store.stream_info(session_id, life))
            if refusal is not None:
                return Refused(refusal=refusal)
            authorized = True
        async with self._lock(key):
            if not self.running(session_id):
                lease = await self._ctx.store.acquire_lease(
                    session_id, self._ctx.replica_id, self._ctx.settings.store.lease_ttl_s
                )
                if lease is not None:
                    return await self._open(session_id, life, call, lease)
            # The upstream GET is open, here or on another replica: join it.
            if not authorized:
                info = await self._ctx.store.stream_info(session_id, life)
                refusal = await authorize_join(info)
                if refusal is not None:
                    return Refused(refusal=refusal)
            self.calls[key] = call
            if not self.running(session_id):
                self._stand_by(session_id)
            return None

    async def _open(
        self, session_id: str, life: str, call: UpstreamCall, lease: Lease
    ) -> Refused[R] | None:
        """Open the session's upstream GET with *call* and start its pump (under the lock)."""
        key = session_digest(session_id)
        store = self._ctx.store
        try:
            self._ctx.check_pump_capacity(standalone=True)
            response = await self._ctx.upstream.open("GET", call.url, call.headers, None)
        except BaseException:
            with contextlib.suppress(StoreError):
                await store.release_lease(session_id, lease)
            raise
        if not is_event_stream(response):
            with contextlib.suppress(StoreError):
                await store.release_lease(session_id, lease)
            return Refused(response=response)
        self.calls[key] = call
        try:
            if await store.get_session(session_id, refresh=False) is None:
                # A session the gateway has no record of (it predates this gateway, or its
                # record expired) but the upstream accepts: keep a record of unknown version,
                # so the stream's idle timeout applies to it like to any other session (D2, D5).
                await store.record_session(session_id, "", auth=call.auth)
            if await store.stream_info(session_id, life) is None:
                await create_standalone(self._ctx, session_id, life, call.auth)
        except BaseException:
            response.close()
            with contextlib.suppress(StoreError):
                await store.release_lease(session_id, lease)
            raise
        self._start_pump(session_id, life, lease, response)
        return None

    def _start_pump(
        self, session_id: str, life: str, lease: Lease, response: UpstreamResponse | None
    ) -> None:
        key = session_digest(session_id)
        pump = StandalonePump(
            self._ctx, session_id, life, lease, lambda: self.calls.get(key) or _no_call()
        )
        task = self._ctx.registry.spawn(pump.run(response), name="standalone.pump", endless=True)
        self.pumps[key] = task
        # On completion, not in the pump's own finally: a task cancelled before it first ran
        # (shutdown) never runs its body.
        task.add_done_callback(lambda done: self._forget(session_id, life, pump, done))

    def _forget(
        self, session_id: str, life: str, pump: StandalonePump, task: asyncio.Task[None]
    ) -> None:
        """A pump of this replica ended: what its attached client needs next."""
        key = session_digest(session_id)
        if self.pumps.get(key) is not task:
            return
        del self.pumps[key]
        stream = self._ctx.registry.find((key, life))
        reader = stream.reader if stream is not None else None
        if reader is not None and pump.stopped == "refused":
            # The upstream refuses the GET with the credentials this replica has: the client
            # reconnects with its own (a refreshed token), and gets the refusal relayed if any.
            reader.stop("upstream_refused")
        elif reader is not None and pump.stopped != "gone" and not self._ctx.registry.closing:
            self._stand_by(session_id)  # lost or unrenewable lease: take it again once free
        if key not in self._standby:
            self.calls.pop(key, None)
        self._prune_lock(key)

    # Standing by ----------------------------------------------------------------------------

    def _stand_by(self, session_id: str) -> None:
        """Take the session's lease over once it is free, while a client of this replica reads."""
        key = session_digest(session_id)
        if key in self._standby:
            return
        task = self._ctx.registry.spawn(
            self._standby_loop(session_id), name="standalone.standby", background=True
        )
        self._standby[key] = task
        task.add_done_callback(lambda done: self._standby_done(key, done))

    def _standby_done(self, key: str, task: asyncio.Task[None]) -> None:
        if self._standby.get(key) is task:
            del self._standby[key]
            if key not in self.pumps:
                self.calls.pop(key, None)
            self._prune_lock(key)

    async def _standby_loop(self, session_id: str) -> None:
        """Every renewal period: stop when no client here reads; take a free lease over."""
        key = session_digest(session_id)
        life = standalone_life(session_id)
        settings = self._ctx.settings.store
        period_s = settings.lease_ttl_s / 3
        idle_ticks = 0
        while True:
            await asyncio.sleep(period_s * random.uniform(0.8, 1.0))  # noqa: S311 - jitter
            registry = self._ctx.registry
            if registry.closing or self.running(session_id):
                return
            if not registry.attached((key, life)):
                # Nobody here reads the stream (twice in a row: a GET between joining and
                # attaching is not missed): nobody here needs the session's upstream GET.
                idle_ticks += 1
                if idle_ticks >= STANDBY_IDLE_TICKS:
                    return
                continue
            idle_ticks = 0
            try:
                lease = await self._ctx.store.acquire_lease(
                    session_id, self._ctx.replica_id, settings.lease_ttl_s
                )
            except StoreError:
                continue
            if lease is None:
                continue
            async with self._lock(key):
                if self.running(session_id) or key not in self.calls:
                    return
                try:
                    self._ctx.check_pump_capacity(standalone=True)
                except GatewayBusy:
                    with contextlib.suppress(StoreError):
                        await self._ctx.store.release_lease(session_id, lease)
                    continue  # another replica may take it; try again next period
                log.info("standalone.took_over", epoch=lease.epoch)
                self._ctx.metrics.standalone_takeovers.inc()
                self._start_pump(session_id, life, lease, None)
                return

    # Claims ---------------------------------------------------------------------------------

    async def claim(self, session_id: str, life: str) -> str:
        """Claim stream *life* for a new client connection; its reader token.

        The older connection, on any replica, is woken and closes with ``retry``.

        Raises:
            StoreUnavailable: the store cannot be asked.
        """
        token = secrets.token_hex(8)
        await self._ctx.store.claim_reader(session_id, life, token)
        return token

    @contextlib.asynccontextmanager
    async def _lock(self, key: str) -> AsyncIterator[None]:
        """Hold the lock serialising the start of session *key*'s standalone pump.

        One lock per session, kept only while someone holds or awaits it or a pump runs: the
        table stays bounded by the live standalone pumps (GETs with ever new session ids,
        refused, leave nothing behind).
        """
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = _SessionLock()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            self._prune_lock(key)

    def _prune_lock(self, key: str) -> None:
        entry = self._locks.get(key)
        if (
            entry is not None
            and entry.users == 0
            and key not in self.pumps
            and key not in self._standby
        ):
            del self._locks[key]


def _no_call() -> UpstreamCall:
    raise RuntimeError("a standalone pump runs only with a client's call recorded")
