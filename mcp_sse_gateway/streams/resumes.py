"""Resumes (DESIGN D6): the cursor a ``Last-Event-ID`` names, and the dead-owner check (D7).

A resume is never forwarded upstream: the web layer authorizes it (D8) and delivers the stream
from the store after the cursor (:mod:`.delivery`). A request stream another replica writes is
checked for a dead writer while its reader waits, so a client gets the writer's pending errors
rather than a hang.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import structlog

from mcp_sse_gateway.errors import CursorGone, InvalidEventId, UnknownStream
from mcp_sse_gateway.event_ids import Cursor, parse_event_id
from mcp_sse_gateway.store.base import StreamInfo, session_digest
from mcp_sse_gateway.streams.context import StreamContext
from mcp_sse_gateway.streams.life import LOST_PHASES

log = structlog.get_logger("mcp_sse_gateway.managed")

#: Replicas whose liveness is remembered at once (each entry lives a fraction of a second).
MAX_KNOWN_OWNERS = 4096


class Resumes:
    """Resumes of one app's managed streams.

    Args:
        ctx: the app's stream layer.
    """

    def __init__(self, ctx: StreamContext) -> None:
        self._ctx = ctx
        #: Other replicas seen alive lately: replica id → monotonic time until which that holds
        #: (shared by every reader of their streams on this replica).
        self._owners_alive_until: dict[str, float] = {}

    async def resume_target(self, session_id: str, last_event_id: str) -> tuple[Cursor, StreamInfo]:
        """The cursor a ``Last-Event-ID`` names and its stream's metadata (D6).

        Raises:
            InvalidEventId: malformed, or an offset this stream never reached.
            UnknownStream: no such stream life under this session, or one this process lost
                to a store outage (its events after the outage were never stored).
            CursorGone: the events after the cursor were trimmed.
            StoreUnavailable: the store cannot be asked.
        """
        cursor = parse_event_id(last_event_id)
        if cursor is None:
            raise InvalidEventId
        if self._lost_here(session_id, cursor.life):
            raise UnknownStream
        info = await self._ctx.store.stream_info(session_id, cursor.life)
        if info is None or self._lost_here(session_id, cursor.life):
            raise UnknownStream
        if cursor.offset > info.last_offset:
            raise InvalidEventId
        if cursor.offset + 1 < info.first_offset:
            raise CursorGone
        return cursor, info

    def _lost_here(self, session_id: str, life: str) -> bool:
        """Whether this process lost *life* to a store outage (it is being retired).

        The store still has such a life until its retirement drops it, which waits for the
        store to be back (a backoff of up to seconds): a resume meanwhile would be served the
        stored events, then the events the lost feed carried unstored, which the connection
        that read them already has, without ids. It gets the 400 of a dropped life instead.
        """
        stream = self._ctx.registry.find((session_digest(session_id), life))
        return stream is not None and stream.phase in LOST_PHASES

    def owner_check(
        self, session_id: str, info: StreamInfo
    ) -> Callable[[], Awaitable[bool]] | None:
        """For a request stream another replica writes: end it if that replica died (D7).

        It runs when a resume starts and then every ``store.heartbeat_s`` while the stream is
        idle. An owner seen alive is taken as alive for a quarter of ``heartbeat_s`` by every
        reader on this replica: one store command per owner and period, however many clients
        wait. The stream is ended with the JSON-RPC errors its writer left pending, exactly
        once whichever replicas check at the same time.

        Returns:
            The check (True when it ended the stream), or None when there is nothing to check.
        """
        if info.kind != "request" or info.owner == self._ctx.replica_id:
            return None
        alive_until = self._owners_alive_until
        cache_s = self._ctx.settings.store.heartbeat_s / 4
        store = self._ctx.store

        async def check() -> bool:
            now = time.monotonic()
            if alive_until.get(info.owner, 0.0) > now:
                return False
            if await store.replica_alive(info.owner):
                if len(alive_until) >= MAX_KNOWN_OWNERS:
                    alive_until.clear()
                alive_until[info.owner] = now + cache_s
                return False
            alive_until.pop(info.owner, None)
            ended = await store.end_orphaned(session_id, info.life)
            if ended:
                self._ctx.metrics.streams_orphaned.inc()
                log.warning("stream.orphan_ended", life=info.life[:8])
            return ended

        return check
