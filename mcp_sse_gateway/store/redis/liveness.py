"""Replica liveness in Redis: heartbeats, and ending a dead owner's streams once (DESIGN D7).

Each replica writes its heartbeat key (``<prefix>:replica:<id>``, :mod:`.keys`) every
``heartbeat_s``; it lives ``heartbeat_expiry_s``. A stream whose owner's key is gone is ended by
whichever replica notices first, exactly once across all replicas: the ``end_orphaned`` script
compares and sets (the stream must still be unfinished and owned by the replica seen dead), and
carries a token, so a repeat after a lost reply recognises its own applied attempt. The
heartbeat key is in a slot of its own, so in Redis Cluster it is checked with a separate command
before the script.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import structlog
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from mcp_sse_gateway.store.redis.calls import LIVENESS, RUNNING, Calls
from mcp_sse_gateway.store.redis.keys import SessionKeys, heartbeat_key
from mcp_sse_gateway.store.redis.lua import Scripts
from mcp_sse_gateway.store.redis.offsets import WrittenOffsets

log = structlog.get_logger("mcp_sse_gateway.store")


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


class Liveness:
    """Heartbeats and orphan ending for one store.

    Args:
        client: the command client.
        scripts: the store's scripts.
        calls: the store's call queue and outage state.
        written: the store's offsets (an ended stream is forgotten).
        prefix: the key prefix.
        heartbeat_ms: a heartbeat key's TTL, ms.
        max_events: events kept per stream.
        finished_ms: a finished stream's TTL, ms.
    """

    def __init__(
        self,
        client: Redis | RedisCluster,
        scripts: Scripts,
        calls: Calls,
        written: WrittenOffsets,
        *,
        prefix: str,
        heartbeat_ms: int,
        max_events: int,
        finished_ms: int,
    ) -> None:
        self._client = client
        self._scripts = scripts
        self._calls = calls
        self._written = written
        self._prefix = prefix
        self._heartbeat_ms = heartbeat_ms
        self._max_events = max_events
        self._finished_ms = finished_ms
        self._sent: set[str] = set()

    async def heartbeat(self, replica_id: str) -> None:
        """Write *replica_id*'s heartbeat key, alive ``heartbeat_expiry_s``.

        Logs ``store.heartbeat_lapsed`` when the key had expired since this process's previous
        heartbeat: other replicas may have ended this replica's streams.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        key = heartbeat_key(self._prefix, replica_id)
        async with self._calls.call("heartbeat", LIVENESS):
            previous = await self._client.set(key, "1", px=self._heartbeat_ms, get=True)
        if previous is None and replica_id in self._sent:
            log.warning("store.heartbeat_lapsed", replica=replica_id)
        self._sent.add(replica_id)

    async def replica_alive(self, replica_id: str) -> bool:
        """Whether *replica_id*'s heartbeat key exists (it beat within ``heartbeat_expiry_s``).

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        async with self._calls.call("replica_alive", LIVENESS):
            return bool(await self._client.exists(heartbeat_key(self._prefix, replica_id)))

    async def end_orphaned(
        self, keys: SessionKeys, life: str, error_datas: Sequence[str] | None
    ) -> bool:
        """End the stream life if its owner's heartbeat is gone, exactly once.

        Appends *error_datas* (one event each, default type; None: the stream's stored pending
        ones), then the terminal marker, in one compare-and-set script, and wakes its readers.

        Returns:
            True only for the one caller that ended the stream.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        token = secrets.token_hex(8)
        async with self._calls.call("end_orphaned", RUNNING):
            owner, finished = await self._client.hmget(keys.meta(life), ["owner", "fin"])
            if owner is None or _text(finished or b"0") == "1":
                return False
            owner = _text(owner)
            if await self._client.exists(heartbeat_key(self._prefix, owner)):
                return False
            ended = await self._scripts.run(
                "end_orphaned",
                keys,
                [keys.meta(life), keys.stream(life)],
                [
                    life,
                    owner,
                    self._max_events,
                    self._finished_ms,
                    token,
                    "1" if error_datas is None else "0",
                    *(error_datas or ()),
                ],
            )
        if ended:
            log.warning("store.stream_orphaned", session=keys.digest[:12], owner=owner)
            self._written.forget(keys.digest, life)
        return bool(ended)
