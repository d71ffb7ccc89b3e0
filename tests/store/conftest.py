"""Fixtures of the store tests: one factory per backend, real and private Redis servers, and a
small loopback Redis Cluster."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import fakeredis
import pytest
import redis

from mcp_sse_gateway.store.memory import MemoryStore
from mcp_sse_gateway.store.redis import COMMAND_CONNECTIONS, RedisStore
from mcp_sse_gateway.store.redis.connections import command_retry
from tests.conftest import redis_server_executable
from tests.support.redis_cluster import ClusterStartError, RedisClusterProcess

StoreFactory = Callable[..., Any]

BACKENDS = [
    "memory",
    "fakeredis",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("cluster", marks=pytest.mark.redis),
]
REDIS_BACKENDS = ["fakeredis", pytest.param("redis", marks=pytest.mark.redis)]


async def raises(call: Callable[[], Awaitable[Any]], error: type[BaseException]) -> bool:
    """Whether awaiting *call()* raises *error* (a condition for ``eventually``)."""
    try:
        await call()
    except error:
        return True
    return False


@pytest.fixture
def redis_url(redis_server: str) -> str:
    """The shared real Redis, flushed for this test."""
    client = redis.Redis.from_url(redis_server)
    try:
        client.flushdb()
    finally:
        client.close()
    return redis_server


def start_redis_cluster(**options: Any) -> RedisClusterProcess:
    """A started loopback Redis Cluster (:class:`RedisClusterProcess` *options*); close it.

    Skips the test without ``redis-server`` or when it cannot form a cluster (no cluster
    support, no free ports); fails it instead when ``$CI`` is set.
    """
    cluster = RedisClusterProcess(redis_server_executable(), **options)
    try:
        cluster.start()
    except (ClusterStartError, redis.RedisError, OSError) as exc:
        if os.environ.get("CI"):
            pytest.fail(f"cannot start a Redis Cluster (required when CI is set): {exc}")
        pytest.skip(f"cannot start a Redis Cluster: {exc}")
    return cluster


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterProcess]:
    """A Redis Cluster of three loopback masters shared by the session's tests (see
    :func:`start_redis_cluster`); its processes end with the session."""
    cluster = start_redis_cluster()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def cluster_url(redis_cluster: RedisClusterProcess) -> str:
    """URL of a node of the shared Redis Cluster, every node flushed for this test."""
    redis_cluster.flush()
    return redis_cluster.url


class Backend:
    """Builds stores of one backend; the Redis ones of a test share one data set (replicas)."""

    def __init__(self, name: str, url: str | None) -> None:
        self.name = name
        self.url = url
        self.fake_server = fakeredis.FakeServer() if name == "fakeredis" else None
        self.stores: list[Any] = []
        self.clients: list[Any] = []

    def __call__(self, **bounds: Any) -> Any:
        store: Any
        if self.name == "memory":
            store = MemoryStore(**bounds)
        elif self.name == "fakeredis":
            # As in production: a small blocking pool (bursts queue for a connection).
            client = fakeredis.FakeAsyncRedis(
                server=self.fake_server,
                connection_pool_class=redis.asyncio.BlockingConnectionPool,
                max_connections=COMMAND_CONNECTIONS,
                socket_timeout=None,  # the store bounds its calls itself (cancel-safe)
            )
            client.set_retry(command_retry())  # as from_url's: one repeat on a dropped connection
            self.clients.append(client)
            # No lane: fakeredis answers without yielding, so every append would go alone and
            # none would share a pipeline (the lane is tested on a real Redis).
            store = RedisStore(client, lane=False, **bounds)
        else:
            assert self.url is not None
            store = RedisStore.from_url(self.url, cluster=self.name == "cluster", **bounds)
        self.stores.append(store)
        return store

    def admin(self) -> Any:
        """A plain async client on the same Redis data (not counted as the store's)."""
        if self.name == "fakeredis":
            client = fakeredis.FakeAsyncRedis(server=self.fake_server)
        elif self.name == "redis":
            assert self.url is not None
            client = redis.asyncio.Redis.from_url(self.url)
        elif self.name == "cluster":
            assert self.url is not None
            client = redis.asyncio.RedisCluster.from_url(self.url)
        else:
            raise ValueError("the memory backend has no Redis")
        self.clients.append(client)
        return client

    async def close(self) -> None:
        for store in self.stores:
            await store.close()
        for client in self.clients:
            await client.aclose()


async def _backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    name = request.param
    url = None
    if name == "redis":
        url = request.getfixturevalue("redis_url")
    elif name == "cluster":
        url = request.getfixturevalue("cluster_url")
    backend = Backend(name, url)
    try:
        yield backend
    finally:
        await backend.close()


@pytest.fixture(params=BACKENDS)
async def make_store(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    """``make_store(**bounds)`` builds a store of the parametrized backend; closed afterwards."""
    async for backend in _backend(request):
        yield backend


@pytest.fixture(params=REDIS_BACKENDS)
async def make_redis_store(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    """As ``make_store``, for the Redis backends only (fakeredis and a real server)."""
    async for backend in _backend(request):
        yield backend
