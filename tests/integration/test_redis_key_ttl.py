"""The TTL check the ``gateway`` fixture runs on Redis can fail (tests/support/redis_keys.py).

With ``GATEWAY_TEST_STORE=redis`` the teardown of every test that ran a gateway scans the
gateway's key prefix and fails on a key without TTL; these tests prove the scan finds such keys
(and only under the prefix), on the shared redis-server, without flushing it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
import redis

from tests.support.redis_keys import (
    KeyWithoutTTL,
    assert_every_key_expires,
    keys_without_ttl,
    match_pattern,
)

pytestmark = pytest.mark.redis


@pytest.fixture
def client(redis_server: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_server) as connection:
        yield connection


@pytest.fixture
def new_prefix(client: redis.Redis) -> Iterator[Callable[[], str]]:
    """Makes unique key prefixes; their keys are deleted afterwards (the server is not flushed)."""
    made: list[str] = []

    def make() -> str:
        made.append(uuid.uuid4().hex)
        return made[-1]

    yield make
    for prefix in made:
        keys = list(client.scan_iter(match=f"{prefix}*"))
        if keys:
            client.delete(*keys)


def test_a_key_without_ttl_is_reported_with_its_type_until_it_gets_one(
    client: redis.Redis, redis_server: str, new_prefix: Callable[[], str]
) -> None:
    prefix, outside = new_prefix(), new_prefix()
    persistent, hash_key, expiring = f"{prefix}:a", f"{prefix}:{{d}}:session", f"{prefix}:c"
    client.set(persistent, "no ttl")
    client.hset(hash_key, "v", "1")
    client.set(expiring, "ttl", px=60_000)
    client.set(f"{outside}:x", "no ttl, but not under the prefix")

    assert keys_without_ttl(client, prefix) == [
        KeyWithoutTTL(persistent, "string"),
        KeyWithoutTTL(hash_key, "hash"),
    ]
    with pytest.raises(AssertionError) as failure:
        assert_every_key_expires(redis_server, [prefix], scenario="this scenario")
    message = str(failure.value)
    assert "2 Redis key(s) written by this scenario have no TTL" in message
    assert f"string   {persistent}" in message
    assert f"hash     {hash_key}" in message
    assert expiring not in message
    assert outside not in message

    client.pexpire(persistent, 60_000)
    client.pexpire(hash_key, 60_000)
    assert keys_without_ttl(client, prefix) == []
    assert_every_key_expires(redis_server, [prefix], scenario="this scenario")


def test_glob_characters_of_a_prefix_match_only_themselves(
    client: redis.Redis, new_prefix: Callable[[], str]
) -> None:
    tag = new_prefix()
    prefix = f"{tag}*[a]?"
    literal, lookalike = f"{prefix}:k", f"{tag}Xa!:k"
    client.set(literal, "1")
    client.set(lookalike, "1")

    assert match_pattern("a*b") == "a\\*b*"
    assert keys_without_ttl(client, prefix) == [KeyWithoutTTL(literal, "string")]


def test_no_keys_under_a_prefix_pass(redis_server: str) -> None:
    assert_every_key_expires(redis_server, [uuid.uuid4().hex], scenario="nothing")
    assert_every_key_expires(redis_server, [], scenario="nothing")
