"""The Redis store on Redis Cluster (DESIGN D7), on a loopback cluster of three masters
(tests/support/redis_cluster.py). The whole contract suite runs on it too (backend ``cluster``);
these tests check what only a cluster shows: hash slots, nodes, wake-ups across nodes,
connections per node, outages."""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
from typing import Any

import pytest
import redis
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import SSLConnection
from redis.crc import key_slot
from redis.exceptions import ClusterError, MovedError

from mcp_sse_gateway.config import StoreSettings
from mcp_sse_gateway.errors import StoreUnavailable
from mcp_sse_gateway.event_ids import new_life
from mcp_sse_gateway.store.redis import (
    CLIENT_NAME,
    CLUSTER_COMMAND_CONNECTIONS_PER_NODE,
    DEFAULT_STALL_TIMEOUT_S,
    MAX_CLUSTER_CONNECTIONS_PER_NODE,
    SUBSCRIBER_CONNECTIONS,
    RedisStore,
)
from mcp_sse_gateway.store.redis.keys import SessionKeys, heartbeat_key
from tests.store.conftest import start_redis_cluster
from tests.support.redis_cluster import RedisClusterProcess
from tests.support.waiting import DEADLINE_S, eventually, parked

pytestmark = pytest.mark.redis

PREFIX = "mcp-sse-gateway"
HASH_TAG = re.compile(r"\{([0-9a-f]{32})\}")


def session_slot(session_id: str) -> int:
    return key_slot(SessionKeys.of(PREFIX, session_id).index.encode())


def sessions_by_node(cluster: RedisClusterProcess, per_node: int) -> dict[int, list[str]]:
    """*per_node* session ids whose keys live on each node (picked by their hash slot)."""
    found: dict[int, list[str]] = {index: [] for index in range(len(cluster.ports))}
    candidate = 0
    while any(len(ids) < per_node for ids in found.values()):
        session_id = f"session-{candidate}"
        candidate += 1
        ids = found[cluster.node_of_slot(session_slot(session_id))]
        if len(ids) < per_node:
            ids.append(session_id)
    return found


class Nodes:
    """Async admin clients, one per node (their connections carry no client name)."""

    def __init__(self, cluster: RedisClusterProcess) -> None:
        self.clients = [
            redis.asyncio.Redis(host="127.0.0.1", port=port, decode_responses=True)
            for port in cluster.ports
        ]

    async def store_clients(self) -> list[list[dict[str, Any]]]:
        """``CLIENT LIST`` entries of the store's connections, per node."""
        return [
            [entry for entry in await client.client_list() if entry.get("name") == CLIENT_NAME]
            for client in self.clients
        ]

    async def store_connections(self) -> list[int]:
        return [len(entries) for entries in await self.store_clients()]

    async def subscribers(self) -> list[tuple[int, str]]:
        """``(node, client id)`` of every Pub/Sub connection of the store."""
        return [
            (index, entry["id"])
            for index, entries in enumerate(await self.store_clients())
            for entry in entries
            if "P" in entry.get("flags", "")
        ]

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()


@pytest.fixture
async def nodes(redis_cluster: RedisClusterProcess) -> Any:
    admin = Nodes(redis_cluster)
    try:
        yield admin
    finally:
        await admin.aclose()


@pytest.fixture
async def stores(cluster_url: str) -> Any:
    """``stores()`` builds a cluster store on the shared (flushed) cluster; closed afterwards."""
    built: list[RedisStore] = []

    def build(**bounds: Any) -> RedisStore:
        store = RedisStore.from_url(cluster_url, cluster=True, **bounds)
        built.append(store)
        return store

    try:
        yield build
    finally:
        for store in built:
            await store.close()


# Configuration ----------------------------------------------------------------------------------


async def test_selected_by_config_alone(cluster_url, monkeypatch):
    from mcp_sse_gateway.config import load_settings

    monkeypatch.setenv("MCP_SSE_GATEWAY_STORE__BACKEND", "redis")
    monkeypatch.setenv("MCP_SSE_GATEWAY_STORE__REDIS_URL", cluster_url)
    monkeypatch.setenv("MCP_SSE_GATEWAY_STORE__REDIS_CLUSTER", "true")
    monkeypatch.setenv("MCP_SSE_GATEWAY_AUTH__DIGEST_KEY", "test-digest-key-0123456789abcdef")
    settings = load_settings().store
    assert settings.redis_cluster is True
    store = RedisStore.from_settings(settings)
    try:
        assert isinstance(store.clients.commands, redis.asyncio.RedisCluster)
        await store.ping()
        life = new_life()
        await store.create_stream("s", life, kind="request", owner="r1")
        assert await store.append("s", life, "a", None) == 1
    finally:
        await store.close()


def test_cluster_urls_must_be_tcp_and_database_0():
    with pytest.raises(ValueError, match="unix"):
        StoreSettings(backend="redis", redis_url="unix:///tmp/r.sock", redis_cluster=True)
    with pytest.raises(ValueError, match="unix"):
        RedisStore.from_url("unix:///tmp/r.sock", cluster=True)
    with pytest.raises(ValueError, match="database 0"):
        RedisStore.from_url("redis://127.0.0.1:7000/3", cluster=True)


async def test_cluster_tls_url_builds_bounded_tls_clients():
    store = RedisStore.from_url(
        "rediss://app:secret@127.0.0.1:7000/0?ssl_ca_certs=/etc/ca.pem&max_connections=500",
        cluster=True,
    )
    try:
        kwargs = store.clients.commands.connection_kwargs
        assert kwargs["connection_class"] is SSLConnection
        assert (kwargs["ssl_ca_certs"], kwargs["username"], kwargs["password"]) == (
            "/etc/ca.pem",
            "app",
            "secret",
        )
        assert kwargs["max_connections"] == CLUSTER_COMMAND_CONNECTIONS_PER_NODE
        assert kwargs["client_name"] == CLIENT_NAME
        subscription = store.clients.subscriber.pubsub()
        pool = subscription.connection_pool
        assert pool.connection_class is SSLConnection
        assert pool.max_connections == SUBSCRIBER_CONNECTIONS
        assert (pool.connection_kwargs["host"], pool.connection_kwargs["port"]) == (
            "127.0.0.1",
            7000,
        )
        assert pool.connection_kwargs["password"] == "secret"
        await subscription.aclose()
    finally:
        await store.close()


# Hash slots and nodes ---------------------------------------------------------------------------


async def test_keys_of_a_session_share_one_slot_and_sessions_spread_over_nodes(
    redis_cluster, stores, nodes
):
    store = stores(max_streams_per_session=3)
    by_node = sessions_by_node(redis_cluster, per_node=2)
    sessions = [session_id for ids in by_node.values() for session_id in ids]
    for session_id in sessions:
        await store.record_session(session_id, "2025-11-25")
        done, open_, orphan = new_life(), new_life(), new_life()
        await store.create_stream(session_id, done, kind="request", owner="r1")
        await store.append(session_id, done, "a", None)
        await store.finish(session_id, done)
        await store.create_stream(session_id, open_, kind="standalone", owner="r1")
        await store.append(session_id, open_, "b", "custom")
        await store.create_stream(session_id, orphan, kind="request", owner="dead")
        assert await store.end_orphaned(session_id, orphan, ["error"])
        await store.create_stream(session_id, new_life(), kind="request", owner="r1")  # evicts
        await store.get_session(session_id)
        await store.read(session_id, open_, 0, 10)
        assert (await store.stream_info(session_id, open_)).last_offset == 1
    await store.tombstone_session(sessions[0])
    await store.heartbeat("r1")

    slots_by_digest: dict[str, set[int]] = defaultdict(set)
    nodes_by_digest: dict[str, set[int]] = defaultdict(set)
    heartbeats = []
    for index, client in enumerate(nodes.clients):
        async for key in client.scan_iter(match=f"{PREFIX}:*", count=1000):
            slot = int(await client.execute_command("CLUSTER", "KEYSLOT", key))
            assert redis_cluster.node_of_slot(slot) == index  # stored where its slot is served
            tag = HASH_TAG.search(key)
            if tag is None:
                heartbeats.append(key)
                continue
            slots_by_digest[tag.group(1)].add(slot)
            nodes_by_digest[tag.group(1)].add(index)
    assert heartbeats == [heartbeat_key(PREFIX, "r1")]
    digests = {SessionKeys.of(PREFIX, session_id).digest for session_id in sessions}
    assert set(slots_by_digest) == digests
    for session_id in sessions:
        keys = SessionKeys.of(PREFIX, session_id)
        # Every key of the session (record, list, marker, metadata, events) is in one slot.
        assert slots_by_digest[keys.digest] == {session_slot(session_id)}
        assert len(nodes_by_digest[keys.digest]) == 1
    # The sessions spread over every node of the cluster.
    assert set().union(*nodes_by_digest.values()) == set(range(len(redis_cluster.ports)))


# Wake-ups ---------------------------------------------------------------------------------------


async def test_wake_ups_reach_a_subscriber_on_another_node_and_survive_its_loss(
    redis_cluster, stores, nodes
):
    reader, writer = stores(), stores()  # two replicas
    by_node = sessions_by_node(redis_cluster, per_node=1)
    probe = new_life()
    assert await reader.wait("probe", probe, 0, 0.01) is True  # unknown stream: starts subscribing
    await eventually(lambda: reader.subscribed)
    [(subscribed_on, subscriber_id)] = await nodes.subscribers()

    async def woken_across_nodes(subscribed_on: int) -> None:
        for node, [session_id] in by_node.items():
            if node == subscribed_on:
                continue
            life = new_life()
            await writer.create_stream(session_id, life, kind="request", owner="w")
            waiter = asyncio.create_task(reader.wait(session_id, life, 0, 30))
            await eventually(lambda: parked(reader, 1))
            await writer.append(session_id, life, "a", None)  # a script on the other node
            assert await asyncio.wait_for(waiter, DEADLINE_S) is True

    await woken_across_nodes(subscribed_on)
    # Woken by messages: the subscription stayed where it was, on its one connection.
    assert await nodes.subscribers() == [(subscribed_on, subscriber_id)]

    # The subscriber's connection dies: redis-py reconnects and subscribes again (the node is
    # still there), and waiters are woken again.
    await nodes.clients[subscribed_on].client_kill_filter(_id=subscriber_id)

    async def resubscribed() -> bool:
        found = await nodes.subscribers()
        return len(found) == 1 and found[0][1] != subscriber_id and reader.subscribed

    await eventually(resubscribed)
    [(resubscribed_on, _)] = await nodes.subscribers()
    await woken_across_nodes(resubscribed_on)


async def test_the_subscriber_moves_to_another_node_when_its_node_is_gone():
    cluster = start_redis_cluster(node_timeout_ms=500)
    admin = Nodes(cluster)
    store = RedisStore.from_url(cluster.url, cluster=True)
    try:
        assert await store.wait("probe", new_life(), 0, 0.01) is True  # starts subscribing
        await eventually(lambda: store.subscribed)
        [(subscribed_on, _)] = await admin.subscribers()
        cluster.stop_node(subscribed_on)
        others = [client for index, client in enumerate(admin.clients) if index != subscribed_on]

        async def moved() -> bool:
            found = [
                entry
                for client in others
                for entry in await client.client_list()
                if entry.get("name") == CLIENT_NAME and "P" in entry.get("flags", "")
            ]
            return len(found) == 1 and store.subscribed

        await eventually(moved, timeout_s=DEADLINE_S)
    finally:
        await store.close()
        await admin.aclose()
        cluster.close()


# Bounded connections ----------------------------------------------------------------------------


async def test_connections_per_node_stay_bounded_under_many_waiters(redis_cluster, stores, nodes):
    store = stores()
    peaks = [0] * len(redis_cluster.ports)
    sampling = True

    async def sample() -> None:
        while sampling:  # each CLIENT LIST round trip lets the store run
            for index, count in enumerate(await nodes.store_connections()):
                peaks[index] = max(peaks[index], count)

    sampler = asyncio.create_task(sample())
    try:
        by_node = sessions_by_node(redis_cluster, per_node=4)
        lives = [
            (session_id, new_life())
            for ids in by_node.values()
            for session_id in ids
            for _ in range(5)
        ]
        for session_id, life in lives:
            await store.create_stream(session_id, life, kind="request", owner="r1")
        waiters = [
            asyncio.create_task(store.wait(session_id, life, 0, 30))
            for session_id, life in lives
            for _ in range(2)
        ]
        assert len(waiters) >= 50
        await eventually(lambda: parked(store, len(waiters)))
        parked_connections = await nodes.store_connections()
        assert not any(waiter.done() for waiter in waiters)
        # A burst: every stream appended to at once, plus 360 concurrent reads.
        await asyncio.gather(
            *(store.append(session_id, life, "x", None) for session_id, life in lives),
            *(store.read(session_id, life, 0, 10) for session_id, life in lives * 6),
        )
        assert await asyncio.wait_for(asyncio.gather(*waiters), DEADLINE_S) == [True] * len(waiters)
    finally:
        sampling = False
        await sampler
    print(f"connections per node: parked={parked_connections} peak={peaks}")
    assert sum(parked_connections) >= 1
    assert all(peak <= MAX_CLUSTER_CONNECTIONS_PER_NODE for peak in peaks)
    assert MAX_CLUSTER_CONNECTIONS_PER_NODE == (
        CLUSTER_COMMAND_CONNECTIONS_PER_NODE + SUBSCRIBER_CONNECTIONS
    )
    assert sum(peaks) <= CLUSTER_COMMAND_CONNECTIONS_PER_NODE * len(peaks) + 1


# Outages ----------------------------------------------------------------------------------------


async def test_unreachable_cluster_raises_store_unavailable_quickly():
    store = RedisStore.from_url("redis://127.0.0.1:1/0", cluster=True)
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(StoreUnavailable):
            await store.ping()
        with pytest.raises(StoreUnavailable):
            await store.create_stream("s", new_life(), kind="request", owner="r1")
        assert loop.time() - started < 2 * DEFAULT_STALL_TIMEOUT_S
    finally:
        await store.close()


async def test_cluster_down_raises_store_unavailable_and_recovers_by_itself():
    cluster = start_redis_cluster(node_timeout_ms=500)
    store = RedisStore.from_url(cluster.url, cluster=True)
    try:
        by_node = sessions_by_node(cluster, per_node=1)
        [session_id] = by_node[0]
        life = new_life()
        await store.create_stream(session_id, life, kind="request", owner="r1")
        await store.append(session_id, life, "a", None)
        # A master without replica stops: once the others see it fail, the cluster is down
        # (CLUSTERDOWN) even for the slots of the nodes still running.
        cluster.stop_node(2)

        async def down() -> bool:
            try:
                await store.stream_info(session_id, life)
            except StoreUnavailable:
                return True
            return False

        await eventually(down, timeout_s=DEADLINE_S)
        await asyncio.to_thread(cluster.start_node, 2)
        # Back without any action on the store; the data of the running nodes is still there.
        await eventually(lambda: _readable(store, session_id, life), timeout_s=DEADLINE_S)
        assert await store.append(session_id, life, "b", None) == 2
    finally:
        await store.close()
        cluster.close()


async def _readable(store: RedisStore, session_id: str, life: str) -> bool:
    try:
        return (await store.stream_info(session_id, life)) is not None
    except StoreUnavailable:
        return False


async def test_a_moved_storm_raises_store_unavailable_then_the_store_recovers(
    redis_cluster, stores, monkeypatch
):
    store = stores()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    slot = session_slot("s")
    elsewhere = redis_cluster.ports[(redis_cluster.node_of_slot(slot) + 1) % 3]
    real = ClusterNode.execute_command
    redirected = 0

    async def storm(node, *args, **kwargs):
        nonlocal redirected
        if args[0] == "EVALSHA":
            redirected += 1
            # Every node sends the script's slot elsewhere (a resharding gone wrong).
            raise MovedError(f"{slot} 127.0.0.1:{elsewhere}")
        return await real(node, *args, **kwargs)

    monkeypatch.setattr(ClusterNode, "execute_command", storm)
    with pytest.raises(StoreUnavailable) as raised:
        await store.append("s", life, "a", None)
    assert isinstance(raised.value.__cause__, ClusterError)  # "TTL exhausted"
    assert redirected > 1
    monkeypatch.setattr(ClusterNode, "execute_command", real)
    # The slot map the storm left behind is wrong: real MOVED replies correct it.
    assert await store.append("s", life, "a", None) == 1
