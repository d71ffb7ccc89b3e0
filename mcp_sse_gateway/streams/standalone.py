"""The standalone stream of a session (D5): one upstream GET per session, kept open, stored.

The first client GET of a resumable session opens the upstream GET; its pump reads it into the
session's one standalone stream life for as long as the session lives, re-opening it (with the
newest client GET's headers) when the upstream closes it. Every client GET attaches to that life
at its live end; a newer one replaces the older connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

import structlog

from mcp_sse_gateway.errors import StoreError, UpstreamError
from mcp_sse_gateway.store.base import StreamInfo, session_digest
from mcp_sse_gateway.streams.context import StreamContext
from mcp_sse_gateway.streams.pump import run_pump
from mcp_sse_gateway.streams.upstream import (
    UpstreamCall,
    UpstreamResponse,
    is_event_stream,
)

log = structlog.get_logger("mcp_sse_gateway.managed")

#: Longest interval between two checks that a standalone stream's session still lives, seconds.
STANDALONE_CHECK_MAX_S = 60.0
#: Bounds of the delay between two re-opens of a standalone stream's upstream GET, seconds.
STANDALONE_BACKOFF_MIN_S = 0.1
STANDALONE_BACKOFF_MAX_S = 30.0
#: Upstream statuses after which the standalone stream is not re-opened (D5).
_STANDALONE_STOP = frozenset({400, 401, 403, 404, 405})

R = TypeVar("R")
#: How one upstream GET body ended: the session is gone, the store lost events, or it ended.
_BodyEnd = Literal["gone", "store_lost", "ended"]


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
        pumps: session digest → the task pumping its upstream GET.
        calls: session digest → the newest client GET's call: its headers (credentials)
            re-open the upstream GET, so a refreshed token is used from the next re-open on.
    """

    def __init__(self, ctx: StreamContext) -> None:
        self._ctx = ctx
        self.pumps: dict[str, asyncio.Task[None]] = {}
        self.calls: dict[str, UpstreamCall] = {}
        self._locks: dict[str, _SessionLock] = {}

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
        """Keep one upstream GET open for the session, opened with *call* if none is.

        Serialised per session, so concurrent client GETs never open two upstream GETs. A
        client GET joining the open one is authorized (*authorize_join*, given the stream's
        metadata; D8) before its headers become the ones that re-open the upstream GET; a GET
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
            if self.running(session_id):
                if not authorized:  # it started while this request waited for the lock
                    info = await self._ctx.store.stream_info(session_id, life)
                    refusal = await authorize_join(info)
                    if refusal is not None:
                        return Refused(refusal=refusal)
                self.calls[key] = call
                return None
            return await self._open(session_id, life, call)

    async def _open(self, session_id: str, life: str, call: UpstreamCall) -> Refused[R] | None:
        """Open the session's upstream GET with *call* and start its pump (under the lock)."""
        key = session_digest(session_id)
        store = self._ctx.store
        self._ctx.check_pump_capacity(standalone=True)
        response = await self._ctx.upstream.open("GET", call.url, call.headers, None)
        if not is_event_stream(response):
            return Refused(response=response)
        self.calls[key] = call
        if await store.get_session(session_id, refresh=False) is None:
            # A session the gateway has no record of (it predates this gateway, or its
            # record expired) but the upstream accepts: keep a record of unknown version, so
            # the stream's idle timeout applies to it like to any other session (D2, D5).
            await store.record_session(session_id, "", auth=call.auth)
        if await store.stream_info(session_id, life) is None:
            await self._create(session_id, life, call.auth)
        task = self._ctx.registry.spawn(
            self._pump(session_id, life, call, response), name="standalone.pump", endless=True
        )
        self.pumps[key] = task
        # On completion, not in the pump's own finally: a task cancelled before it first ran
        # (shutdown) never runs its body.
        task.add_done_callback(lambda done: self._forget(key, done))
        return None

    def _forget(self, key: str, task: asyncio.Task[None]) -> None:
        if self.pumps.get(key) is task:
            del self.pumps[key]
            self.calls.pop(key, None)
            self._prune_lock(key)

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
        if entry is not None and entry.users == 0 and key not in self.pumps:
            del self._locks[key]

    async def _pump(
        self, session_id: str, life: str, call: UpstreamCall, response: UpstreamResponse
    ) -> None:
        """Keep the session's upstream GET read into the store while the session lives (D5).

        Re-opens it (with the newest client GET's headers, after ``retry_ms`` growing
        exponentially with jitter up to :data:`STANDALONE_BACKOFF_MAX_S` while it fails) when
        the upstream closes it. Stops on DELETE (tombstone), when the session's record expires
        (idle timeout), when the upstream refuses the GET (400/401/403/404/405: the next client
        GET tries again with its own headers and gets the refusal relayed), and on shutdown.
        """
        key = session_digest(session_id)
        base_s = max(self._ctx.settings.sse.retry_ms / 1000, STANDALONE_BACKOFF_MIN_S)
        while True:
            ended = await self._run_body(session_id, life, response)
            if ended == "gone":
                return
            failures = 0
            while True:
                delay_s = min(base_s * 2**failures, STANDALONE_BACKOFF_MAX_S)
                await asyncio.sleep(delay_s * random.uniform(0.5, 1.0))  # noqa: S311
                latest = self.calls.get(key, call)
                try:
                    if not await self._session_alive(session_id):
                        return
                    await self._restart_if_lost(
                        session_id, life, lost=ended == "store_lost", auth=latest.auth
                    )
                    ended = "ended"
                except StoreError:
                    failures += 1
                    continue
                try:
                    reopened = await self._ctx.upstream.open(
                        "GET", latest.url, latest.headers, None
                    )
                except UpstreamError:
                    failures += 1
                    continue
                if is_event_stream(reopened):
                    response = reopened
                    break
                reopened.close()
                if reopened.status in _STANDALONE_STOP:
                    log.info("standalone.refused", status=reopened.status)
                    return
                failures += 1

    async def _restart_if_lost(self, session_id: str, life: str, *, lost: bool, auth: str) -> None:
        """Start the standalone life again if events were lost (outage, Redis restarted empty).

        It starts after every offset it used, so the cursors clients hold get 400, not a gap.
        *auth* binds it to the credentials that re-open its upstream GET.
        """
        if lost or await self._ctx.store.stream_info(session_id, life) is None:
            await self._ctx.store.drop_stream(session_id, life)
            await self._create(session_id, life, auth)

    async def _create(self, session_id: str, life: str, auth: str) -> None:
        """Create (again) the session's standalone stream life (D5).

        Its offsets start after the current time in microseconds: larger than any offset an
        earlier incarnation of this life (same id) used, unless it stored more than a million
        events per second.
        """
        await self._ctx.store.create_stream(
            session_id,
            life,
            kind="standalone",
            owner=self._ctx.replica_id,
            start_after=time.time_ns() // 1000,
            auth=auth,
        )

    async def _session_alive(self, session_id: str) -> bool:
        if self._ctx.registry.closing:
            return False
        record = await self._ctx.store.get_session(session_id, refresh=False)
        return record is not None and not record.deleted

    async def _run_body(self, session_id: str, life: str, response: UpstreamResponse) -> _BodyEnd:
        """Pump one upstream GET body.

        Returns:
            ``gone`` when the session is gone (stop for good), ``store_lost`` when events could
            not be stored (the life must start again), else ``ended``.

        A watchdog checks the session every ``session_idle_ttl_s / 4`` seconds (at most a
        minute): an upstream GET that never ends must not keep an idle session's pump alive.
        """
        settings = self._ctx.settings.store
        check_s = min(settings.session_idle_ttl_s / 4, STANDALONE_CHECK_MAX_S)
        pump = asyncio.ensure_future(
            run_pump(
                self._ctx.store,
                session_id,
                life,
                response.chunks(),
                request_ids=[],
                max_event_bytes=settings.max_event_bytes,
                finish=False,
            )
        )
        try:
            while not pump.done():
                await asyncio.wait({pump}, timeout=check_s)
                if not pump.done() and not await self._session_alive(session_id):
                    return "gone"
        finally:
            if not pump.done():
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pump
            response.close()
        if not pump.cancelled() and pump.result().store_lost:
            self._ctx.metrics.streams_store_lost.inc()
            return "store_lost"
        try:
            return "ended" if await self._session_alive(session_id) else "gone"
        except StoreError:
            return "store_lost"
