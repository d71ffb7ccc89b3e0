"""One session's upstream GET, pumped into its standalone stream under the session's lease (D5).

The pump holds the session's lease (:class:`~mcp_sse_gateway.store.base.Lease`) for as long as
it runs. A keeper beside it renews the lease every third of ``store.lease_ttl_s``, whatever the
pump is doing (reading, re-opening, backing off), and takes it again under a new epoch if it
expired while nobody else took it. The pump appends under the lease (fencing) and stops, closing
its upstream GET, the moment another replica holds it, or once no renewal succeeded for
``lease_ttl_s`` minus one renewal period (a replica cut off from the store must not hold a GET
another replica may have opened): one replica at a time holds the session's upstream GET. It
releases the lease when it stops for any other reason (the session is gone, the upstream refuses
the GET, drain), so that another replica with a client attached takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import structlog

from mcp_sse_gateway.errors import StoreError, UpstreamError
from mcp_sse_gateway.store.base import Lease, session_digest
from mcp_sse_gateway.streams.context import StreamContext
from mcp_sse_gateway.streams.pump import PumpResult, run_pump
from mcp_sse_gateway.streams.upstream import UpstreamCall, UpstreamResponse, is_event_stream
from mcp_sse_gateway.tracing import KIND, LIFE, SESSION

log = structlog.get_logger("mcp_sse_gateway.managed")

#: Longest interval between two checks that a standalone stream's session still lives, seconds.
STANDALONE_CHECK_MAX_S = 60.0
#: Bounds of the delay between two re-opens of a standalone stream's upstream GET, seconds.
STANDALONE_BACKOFF_MIN_S = 0.1
STANDALONE_BACKOFF_MAX_S = 30.0
#: Upstream statuses after which the standalone stream is not re-opened (D5).
STANDALONE_STOP = frozenset({400, 401, 403, 404, 405})
#: An upstream GET that ends within this many seconds without an event counts as a failed
#: open: the next re-open waits longer (an upstream that answers every GET and closes it at
#: once is not asked again every ``retry_ms``, for every session, for as long as they live).
STANDALONE_QUICK_END_S = 1.0

#: Cap on the exponent of the backoff (2**6 * retry_ms already passes the maximum delay).
_BACKOFF_MAX_DOUBLINGS = 16

#: How one upstream GET body ended: the session is gone, the lease is another replica's, the
#: store lost events, or it just ended.
BodyEnd = Literal["gone", "lease_lost", "store_lost", "ended"]


def backoff_s(base_s: float, failures: int) -> float:
    """The delay before the next re-open after *failures* in a row, seconds.

    *base_s* doubled per failure, at most :data:`STANDALONE_BACKOFF_MAX_S`, times a jitter in
    [0.5, 1] (replicas re-opening many sessions at once spread out). Any count is fine: the
    exponent is capped, so a session failing for days never overflows it.
    """
    delay_s = min(base_s * (1 << min(failures, _BACKOFF_MAX_DOUBLINGS)), STANDALONE_BACKOFF_MAX_S)
    return delay_s * random.uniform(0.5, 1.0)  # noqa: S311


@dataclass(frozen=True, slots=True)
class _Body:
    """One upstream GET body, pumped.

    Attributes:
        ended: how it ended.
        events: the events it stored.
        polled_s: the upstream closed it on purpose (it primed or sent ``retry``, SEP-1699):
            re-open after this many seconds (its ``retry``, else ``sse.retry_ms``), no backoff.
            None: it just ended.
    """

    ended: BodyEnd
    events: int = 0
    polled_s: float | None = None


class StandalonePump:
    """The pump of one session's standalone stream, under *lease*.

    Args:
        ctx: the app's stream layer.
        session_id: the session.
        life: its standalone stream life.
        lease: the session's lease, held by this replica.
        latest_call: the newest client GET's call on this replica (it re-opens the upstream GET,
            so a refreshed token is used from the next re-open on).
    """

    def __init__(
        self,
        ctx: StreamContext,
        session_id: str,
        life: str,
        lease: Lease,
        latest_call: Callable[[], UpstreamCall],
    ) -> None:
        self._ctx = ctx
        self._session_id, self._life, self._lease = session_id, life, lease
        self._latest_call = latest_call
        self._ttl_s = ctx.settings.store.lease_ttl_s
        self._renew_s = self._ttl_s / 3
        self._lost = False
        #: Why the pump stopped: ``refused`` (the upstream refused the GET), ``lease_lost``,
        #: ``gone`` (the session), else ``""``.
        self.stopped = ""

    async def run(self, response: UpstreamResponse | None) -> None:
        """Pump *response* (None: open the upstream GET first, a takeover) while the session lives.

        Re-opens the GET (after ``retry_ms`` growing exponentially with jitter up to
        :data:`STANDALONE_BACKOFF_MAX_S` while it fails) when the upstream closes it. Stops on
        DELETE (tombstone), when the session's record expires (idle timeout), when the
        upstream refuses the GET (400/401/403/404/405: the next client GET, here or on another
        replica, tries again with its own headers), when the lease is lost, and on shutdown.
        """
        # A root of its own (the session's GET stream outlives every request), linked to the
        # request that opened or took it over.
        with self._ctx.tracing.span(
            "mcp.stream",
            attributes={
                SESSION: session_digest(self._session_id)[:12],
                LIFE: self._life,
                KIND: "standalone",
                "mcp.stream.takeover": response is None,
            },
            links=(self._ctx.tracing.origin(),),
            detached=True,
        ) as span:
            try:
                await self._run_leased(response)
            finally:
                span.set("mcp.stream.end", self.stopped or "closed")

    async def _run_leased(self, response: UpstreamResponse | None) -> None:
        """:meth:`run`'s work and the lease keeper, side by side; the lease released after."""
        work = asyncio.ensure_future(self._run(response))
        keeper = asyncio.ensure_future(self._keep_lease())
        try:
            await asyncio.wait({work, keeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, keeper):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            if self._lost:
                self.stopped = "lease_lost"
            else:
                with contextlib.suppress(StoreError):
                    await self._ctx.store.release_lease(self._session_id, self._lease)
        if work.done() and not work.cancelled():
            work.result()  # a bug in the pump is raised, not swallowed

    async def _keep_lease(self) -> None:
        """Renew the lease every renewal period; return once it is lost (the pump then stops).

        Lost: another replica holds it, or no renewal succeeded for ``lease_ttl_s`` minus one
        renewal period (this replica cannot tell whether another took it over).
        """
        loop = asyncio.get_running_loop()
        renewed_at = loop.time()
        while True:
            await asyncio.sleep(self._renew_s)
            asked_at = loop.time()
            try:
                if await self._ctx.store.renew_lease(self._session_id, self._lease, self._ttl_s):
                    renewed_at = asked_at
                    continue
                # Expired with nobody else holding it: take it again, under a new epoch.
                again = await self._ctx.store.acquire_lease(
                    self._session_id, self._ctx.replica_id, self._ttl_s
                )
            except StoreError:
                if loop.time() - renewed_at >= self._ttl_s - self._renew_s:
                    log.warning("standalone.lease_unrenewed", ttl_s=self._ttl_s)
                    self._lost = True
                    return
                continue
            if again is None:
                log.info("standalone.lease_lost")
                self._lost = True
                return
            self._lease, renewed_at = again, asked_at

    def _current_lease(self) -> Lease:
        return self._lease

    async def _run(self, response: UpstreamResponse | None) -> None:
        ended: BodyEnd = "ended"
        # A takeover opens at once; a GET the upstream closed is re-opened after retry_ms.
        open_now = response is None
        # Upstream GETs in a row that ended at once without an event (see _open_again).
        empty = 0
        loop = asyncio.get_running_loop()
        polled_s: float | None = None
        while True:
            if response is not None:
                opened_at = loop.time()
                body = await self._run_body(response)
                ended, polled_s = body.ended, body.polled_s
                if ended in {"gone", "lease_lost"}:
                    self._lost = ended == "lease_lost"
                    self.stopped = ended
                    return
                # An upstream polling its GET (SEP-1699) closes it quickly on purpose: not a
                # failure, it is re-opened after its retry.
                quick_and_empty = (
                    body.events == 0 and loop.time() - opened_at < STANDALONE_QUICK_END_S
                )
                empty = empty + 1 if quick_and_empty and polled_s is None else 0
                if quick_and_empty and polled_s is not None:
                    # Polled, but nothing came and it ended at once: at most one GET a second.
                    polled_s = max(polled_s, STANDALONE_QUICK_END_S)
            response = await self._open_again(
                ended, open_now=open_now, failures=empty, polled_s=polled_s
            )
            if response is None:
                return
            open_now = False

    async def _open_again(
        self,
        ended: BodyEnd,
        *,
        open_now: bool,
        failures: int = 0,
        polled_s: float | None = None,
    ) -> UpstreamResponse | None:
        """Re-open the upstream GET, with backoff while it fails; None: stop for good.

        *failures* counts the GETs before that ended at once without an event: the first
        delay grows with them as with failed opens (up to :data:`STANDALONE_BACKOFF_MAX_S`).
        *polled_s*: the upstream closed its GET on purpose and asked for this delay, seconds
        (bounded by :data:`STANDALONE_BACKOFF_MIN_S` and :data:`STANDALONE_BACKOFF_MAX_S`),
        used for the first re-open as it is.
        """
        base_s = max(self._ctx.settings.sse.retry_ms / 1000, STANDALONE_BACKOFF_MIN_S)
        while True:
            if polled_s is not None and not open_now:
                await asyncio.sleep(
                    min(max(polled_s, STANDALONE_BACKOFF_MIN_S), STANDALONE_BACKOFF_MAX_S)
                )
            elif not open_now:
                await asyncio.sleep(backoff_s(base_s, failures))
            open_now, polled_s = False, None
            call = self._latest_call()
            try:
                if not await self._session_alive():
                    self.stopped = "gone"
                    return None
                await self._restart_if_lost(lost=ended == "store_lost", auth=call.auth)
                ended = "ended"
            except StoreError:
                failures += 1
                continue
            response = await self._reopen(call)
            if response is not None and is_event_stream(response):
                return response
            if response is not None:
                response.close()
                if response.status in STANDALONE_STOP:
                    log.info("standalone.refused", status=response.status)
                    self.stopped = "refused"
                    return None
            failures += 1

    async def _reopen(self, call: UpstreamCall) -> UpstreamResponse | None:
        try:
            return await self._ctx.upstream.open("GET", call.url, call.headers, None)
        except UpstreamError:
            return None

    async def _restart_if_lost(self, *, lost: bool, auth: str) -> None:
        """Start the standalone life again if events were lost (outage, Redis restarted empty).

        It starts after every offset it used, so the cursors clients hold get 400, not a gap.
        *auth* binds it to the credentials that re-open its upstream GET.
        """
        store = self._ctx.store
        if lost or await store.stream_info(self._session_id, self._life) is None:
            await store.drop_stream(self._session_id, self._life)
            await create_standalone(self._ctx, self._session_id, self._life, auth)

    async def _session_alive(self) -> bool:
        if self._ctx.registry.closing:
            return False
        record = await self._ctx.store.get_session(self._session_id, refresh=False)
        return record is not None and not record.deleted

    async def _run_body(self, response: UpstreamResponse) -> _Body:
        """Pump one upstream GET body, renewing the lease every third of ``lease_ttl_s``.

        Returns how it ended, the events it stored and whether it was closed on purpose.

        A watchdog checks the session every ``session_idle_ttl_s / 4`` seconds (at most a
        minute): an upstream GET that never ends must not keep an idle session's pump alive.
        """
        settings = self._ctx.settings.store
        check_s = min(settings.session_idle_ttl_s / 4, STANDALONE_CHECK_MAX_S)
        pump = asyncio.ensure_future(
            run_pump(
                self._ctx.store,
                self._session_id,
                self._life,
                response.chunks(),
                request_ids=[],
                max_event_bytes=settings.max_event_bytes,
                finish=False,
                lease=self._current_lease,
            )
        )
        try:
            stopped = await self._watch(pump, check_s)
        finally:
            if not pump.done():
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pump
            response.close()
        result = None if pump.cancelled() else pump.result()
        events = result.events if result is not None else 0
        if stopped is not None:
            return _Body(stopped, events)
        if result is not None and result.lease_lost:
            return _Body("lease_lost", events)
        if result is not None and result.store_lost:
            self._ctx.metrics.streams_store_lost.inc()
            return _Body("store_lost", events)
        polled_s = None
        if result is not None and result.resumable:
            retry_ms = result.retry_ms
            polled_s = (
                retry_ms if retry_ms is not None else self._ctx.settings.sse.retry_ms
            ) / 1000
        try:
            alive = await self._session_alive()
        except StoreError:
            return _Body("store_lost", events)
        return _Body("ended" if alive else "gone", events, polled_s)

    async def _watch(self, pump: asyncio.Future[PumpResult], check_s: float) -> BodyEnd | None:
        """While *pump* runs: check the session every *check_s*; why to stop it, or None."""
        while not pump.done():
            await asyncio.wait({pump}, timeout=check_s)
            if pump.done():
                break
            with contextlib.suppress(StoreError):  # unknown: checked again next time
                if not await self._session_alive():
                    return "gone"
        return None


async def create_standalone(ctx: StreamContext, session_id: str, life: str, auth: str) -> None:
    """Create (again) the session's standalone stream life (D5).

    Its offsets start after the current time in microseconds: larger than any offset an earlier
    incarnation of this life (same id) used, unless it stored more than a million events per
    second.
    """
    await ctx.store.create_stream(
        session_id,
        life,
        kind="standalone",
        owner=ctx.replica_id,
        start_after=time.time_ns() // 1000,
        auth=auth,
    )
