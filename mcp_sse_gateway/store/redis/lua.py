"""The Redis store's Lua scripts, read from ``scripts/*.lua`` once and run by name (EVALSHA).

Each script is the shared ``prelude.lua`` followed by its own file. Every script is atomic and
touches only keys of one session (one hash tag, so one Redis Cluster slot): ``KEYS[1]`` is the
session's list of lives, ``KEYS[2]`` its "fresh" marker, then the script's own keys; ``ARGV[1..7]``
are the common arguments :meth:`Scripts.run` passes (meta and stream prefixes, open-stream and
fresh-marker TTLs in ms, the wake channel, the wake message prefix, and whether to refresh
TTLs), then the script's own.
redis-py sends ``EVALSHA`` and loads a script that the server does not know (after a restart).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from mcp_sse_gateway.store.redis.keys import SessionKeys

#: The scripts, each ``scripts/<name>.lua``.
SCRIPT_NAMES = (
    "record_session",
    "get_session",
    "tombstone_session",
    "purge_session",
    "drop_stream",
    "create_stream",
    "append",
    "finish",
    "read",
    "read_head",
    "stream_info",
    "watch",
    "end_orphaned",
    "lease",
    "claim_reader",
    "task",
)


@functools.cache
def sources() -> dict[str, str]:
    """Every script's full source (prelude + body), by name.

    Raises:
        FileNotFoundError: the package was installed without its ``scripts/``.
    """
    folder = resources.files(__package__).joinpath("scripts")
    prelude = folder.joinpath("prelude.lua").read_text(encoding="utf-8")
    return {
        name: prelude + "\n" + folder.joinpath(f"{name}.lua").read_text(encoding="utf-8")
        for name in SCRIPT_NAMES
    }


class Scripts:
    """The scripts registered on one client, with the store's common arguments.

    Args:
        client: the command client.
        keep_ms: how long an open stream's keys live after the session's last use, ms.
        fresh_ms: how long the "fresh" marker lives, ms.
        channel: the wake-up channel.
    """

    def __init__(
        self, client: Redis | RedisCluster, *, keep_ms: int, fresh_ms: int, channel: str
    ) -> None:
        self._scripts = {name: client.register_script(body) for name, body in sources().items()}
        self._common = (keep_ms, fresh_ms, channel)

    async def load(self, name: str) -> None:
        """Load script *name* into Redis (``SCRIPT LOAD``), as after a restart.

        Raises:
            redis.exceptions.RedisError: as redis-py raises it.
        """
        script = self._scripts[name]
        await script.registered_client.script_load(script.script)

    def sha(self, name: str) -> str:
        """The SHA1 of script *name* (what ``EVALSHA`` sends)."""
        return str(self._scripts[name].sha)

    async def run(
        self,
        name: str,
        keys: SessionKeys,
        extra_keys: Sequence[str] = (),
        args: Sequence[str | int] = (),
        *,
        refresh: bool = True,
    ) -> Any:
        """Run script *name* for the session *keys*; returns its reply as redis-py decodes it.

        *refresh* False skips the TTL refreshes of the stream and the session's list (this
        replica did them lately; see
        :mod:`~mcp_sse_gateway.store.redis.local_cache`). New keys always get their TTL.

        Raises:
            redis.exceptions.RedisError: as redis-py raises it (the caller maps outages).
        """
        return await self._scripts[name](
            keys=[keys.index, keys.fresh, *extra_keys],
            args=self._args(keys, args, refresh=refresh),
        )

    def evalsha_args(
        self,
        name: str,
        keys: SessionKeys,
        extra_keys: Sequence[str] = (),
        args: Sequence[str | int] = (),
        *,
        refresh: bool = True,
    ) -> list[str | int]:
        """The arguments of ``EVALSHA`` running script *name* as :meth:`run` would (a pipeline)."""
        all_keys = [keys.index, keys.fresh, *extra_keys]
        return [self.sha(name), len(all_keys), *all_keys, *self._args(keys, args, refresh=refresh)]

    def _args(
        self, keys: SessionKeys, args: Sequence[str | int], *, refresh: bool
    ) -> list[str | int]:
        keep_ms, fresh_ms, channel = self._common
        return [
            keys.meta_prefix,
            keys.stream_prefix,
            keep_ms,
            fresh_ms,
            channel,
            keys.wake_message(""),
            "1" if refresh else "0",
            *args,
        ]
