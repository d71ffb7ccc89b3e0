"""Every key the Redis store writes must expire: find the ones under a key prefix that do not.

The Redis store promises a TTL on every key (see :mod:`mcp_sse_gateway.store.redis.store`); a key
without one would stay in a shared Redis for ever. The ``gateway`` fixture of
``tests/conftest.py`` calls :func:`assert_every_key_expires` on the key prefixes of its gateways
once they have shut down. Synchronous redis-py: it runs in a fixture's teardown.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis

#: Keys asked about per round trip (``PTTL`` and ``TYPE`` of each, pipelined).
SCAN_BATCH = 500
#: At most this many offending keys are listed in an assertion message.
MAX_LISTED = 50

#: ``PTTL`` of a key that exists but has no TTL (``-2``: the key does not exist).
NO_TTL = -1


@dataclass(frozen=True, slots=True)
class KeyWithoutTTL:
    """A key that never expires.

    Attributes:
        key: its name (bytes that are not UTF-8 backslash-escaped).
        type: its Redis ``TYPE`` (``string``, ``hash``, ``list``, ``stream``…).
    """

    key: str
    type: str


def redis_store(redis_url: str, **extra: Any) -> dict[str, Any]:
    """The ``store`` settings of a gateway on *redis_url* under a key prefix of its own, so
    tests sharing a Redis never see each other's sessions or streams (*extra*: more settings).
    """
    return {"backend": "redis", "redis_url": redis_url, "key_prefix": uuid.uuid4().hex, **extra}


def match_pattern(prefix: str) -> str:
    """The ``SCAN MATCH`` pattern of every key starting with *prefix* (glob characters escaped)."""
    escaped = "".join("\\" + char if char in "*?[]\\^" else char for char in prefix)
    return escaped + "*"


def keys_without_ttl(client: redis.Redis, prefix: str) -> list[KeyWithoutTTL]:
    """The keys starting with *prefix* that have no TTL (``PTTL == -1``), sorted by name.

    A key that expires between ``SCAN`` and ``PTTL`` is not one of them.
    """
    found: list[KeyWithoutTTL] = []
    batch: list[bytes] = []

    def check(keys: list[bytes]) -> None:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.pttl(key)
            pipe.type(key)
        replies = pipe.execute()
        for index, key in enumerate(keys):
            pttl, kind = replies[2 * index], replies[2 * index + 1]
            if pttl == NO_TTL:
                found.append(KeyWithoutTTL(_text(key), _text(kind)))

    for key in client.scan_iter(match=match_pattern(prefix), count=SCAN_BATCH):
        batch.append(key)
        if len(batch) >= SCAN_BATCH:
            check(batch)
            batch = []
    if batch:
        check(batch)
    return sorted(found, key=lambda item: item.key)


def assert_every_key_expires(redis_url: str, prefixes: Iterable[str], *, scenario: str) -> None:
    """Fail, listing each offending key and its type, when a key under *prefixes* has no TTL.

    Args:
        redis_url: the Redis the keys are in (never flushed or written here).
        prefixes: the key prefixes to scan (``SCAN MATCH <prefix>*`` each).
        scenario: what wrote the keys (a test id), for the message.

    Raises:
        AssertionError: some key has no TTL (the message lists them, with their types).
    """
    prefixes = sorted(set(prefixes))
    if not prefixes:
        return
    client = redis.Redis.from_url(redis_url)
    try:
        offending = [key for prefix in prefixes for key in keys_without_ttl(client, prefix)]
    finally:
        client.close()
    if offending:
        raise AssertionError(describe(offending, scenario=scenario))


def describe(offending: list[KeyWithoutTTL], *, scenario: str) -> str:
    """The assertion message: how many keys never expire, and which (with their types)."""
    lines = [
        f"{len(offending)} Redis key(s) written by {scenario} have no TTL (PTTL -1); "
        "every key of the Redis store must expire:"
    ]
    lines += [f"  {item.type:<8} {item.key}" for item in offending[:MAX_LISTED]]
    if len(offending) > MAX_LISTED:
        lines.append(f"  … and {len(offending) - MAX_LISTED} more")
    return "\n".join(lines)


def _text(value: bytes | str) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="backslashreplace")
    return value
