"""Script calls of concurrent streams share pipelines (group commit), each with its own outcome;
the queue's bounds and the stall timeout hold as they did for calls sent one by one."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
import structlog

from mcp_sse_gateway.errors import StoreBusy, StoreUnavailable, UnknownStream
from mcp_sse_gateway.event_ids import new_life
from mcp_sse_gateway.store.redis import READ_MAX_BYTES, RedisStore
from mcp_sse_gateway.store.redis.calls import LIVENESS
from mcp_sse_gateway.store.redis.connections import CLIENT_NAME
from mcp_sse_gateway.store.redis.keys import SessionKeys
from tests.conftest import RedisServerProcess, redis_server_executable
from tests.support.ports import free_port
from tests.support.waiting import DEADLINE_S, eventually

PREFIX = "mcp-sse-gateway"
STREAMS = 200
EVENTS = 5


async def _streams(store, count: int) -> list[tuple[str, str]]:
    pairs = [(f"s{i}", new_life()) for i in range(count)]
    for session, life in pairs:
        await store.create_stream(session, life, kind="request", owner="r1")
    return pairs


@contextlib.asynccontextmanager
async def _real_redis(redis_url: str, **settings: Any) -> AsyncIterator[tuple[RedisStore, Any]]:
    """A store on the real Redis and an admin client to kill, pause or reconfigure it with;
    on the way out Redis is unpaused and both are closed."""
    store = RedisStore.from_url(redis_url, **settings)
    admin = redis.asyncio.Redis.from_url(redis_url)
    try:
        yield store, admin
    finally:
        with contextlib.suppress(redis.RedisError):  # the test's own error stays the one told
            await admin.execute_command("CLIENT", "UNPAUSE")
        await store.close()
        await admin.aclose()


async def test_concurrent_appends_share_pipelines_and_each_gets_its_offsets(make_redis_store):
    store = make_redis_store()
    pairs = await _streams(store, STREAMS)

    async def write(session: str, life: str) -> list[int]:
        return [
            await store.append_many(session, life, [(f"{session}-{n}", None)])
            for n in range(EVENTS)
        ]

    before = store._batches.pipelines, store._batches.calls
    offsets = await asyncio.gather(*(write(s, life) for s, life in pairs))
    pipelines = store._batches.pipelines - before[0]
    calls = store._batches.calls - before[1]
    assert offsets == [list(range(1, EVENTS + 1))] * STREAMS
    assert calls == STREAMS * EVENTS
    # Every turn's appends go together: far fewer round trips than calls.
    assert pipelines <= calls / 4, (pipelines, calls)
    for session, life in pairs:
        read = await store.read(session, life, 0, 100)
        assert [e.data for e in read.events] == [f"{session}-{n}" for n in range(EVENTS)]
        assert [e.offset for e in read.events] == list(range(1, EVENTS + 1))


async def test_an_error_reply_fails_only_its_own_call(make_redis_store):
    store = make_redis_store()
    admin = make_redis_store.admin()
    pairs = await _streams(store, 20)
    broken_session, broken_life = pairs[7]
    # The stream's metadata is no longer a hash: its script gets a WRONGTYPE error reply.
    meta = SessionKeys.of(PREFIX, broken_session).meta(broken_life)
    await admin.delete(meta)
    await admin.set(meta, "not a hash")

    outcomes = await asyncio.gather(
        *(store.append(s, life, "x", None) for s, life in pairs), return_exceptions=True
    )
    assert isinstance(outcomes[7], StoreUnavailable)
    assert outcomes[:7] + outcomes[8:] == [1] * 19
    # The store is not down: the next append of another stream goes through.
    assert await store.append(*pairs[0], "y", None) == 2


async def test_appends_go_on_after_redis_forgot_the_scripts(make_redis_store):
    store = make_redis_store()
    admin = make_redis_store.admin()
    pairs = await _streams(store, 30)
    await admin.script_flush()
    offsets = await asyncio.gather(*(store.append(s, life, "x", None) for s, life in pairs))
    assert offsets == [1] * 30
    for session, life in pairs:
        assert [e.data for e in (await store.read(session, life, 0, 10)).events] == ["x"]


async def test_an_unknown_stream_is_that_calls_error(make_redis_store):
    store = make_redis_store()
    pairs = await _streams(store, 5)
    outcomes = await asyncio.gather(
        *(store.append(s, life, "x", None) for s, life in pairs),
        store.append("s0", new_life(), "x", None),
        return_exceptions=True,
    )
    assert outcomes[:5] == [1] * 5
    assert isinstance(outcomes[5], UnknownStream)


@pytest.mark.redis
async def test_calls_fail_with_store_unavailable_once_the_store_is_closed(make_redis_store):
    store = make_redis_store()
    ((session, life),) = await _streams(store, 1)
    await store.close()
    with pytest.raises(StoreUnavailable):
        await store.append(session, life, "x", None)


async def _hold_all_permits(store) -> tuple[asyncio.Event, list[asyncio.Task[None]]]:
    """Take every permit of the store's call queue: (the event that gives them back, holders)."""
    calls = store._calls
    release = asyncio.Event()

    async def hold() -> None:
        async with calls.call("hold", LIVENESS):
            await release.wait()

    holders = [asyncio.create_task(hold()) for _ in range(calls._free)]
    await eventually(lambda: calls._free == 0 and calls.in_flight == len(holders))
    return release, holders


async def test_running_calls_waiting_in_batches_make_new_work_refused(make_redis_store):
    store = make_redis_store(max_queued_calls=5)
    pairs = await _streams(store, 20)
    release, holders = await _hold_all_permits(store)
    appends = [asyncio.create_task(store.append(s, life, "x", None)) for s, life in pairs]
    try:
        await eventually(lambda: store.queued >= len(pairs))  # the queue-depth gauge sees them
        with pytest.raises(StoreBusy):
            await store.create_stream("new", new_life(), kind="request", owner="r1")
        with pytest.raises(StoreBusy):
            await store.get_session("new")
    finally:
        release.set()
        outcomes = await asyncio.gather(*holders, *appends, return_exceptions=True)
    # The running calls were only delayed.
    assert outcomes[len(holders) :] == [1] * len(pairs)


@pytest.mark.redis
async def test_concurrent_large_reads_stay_within_the_stall_timeout(redis_url):
    # A real Redis: the replies' sizes and their time on the wire are what matters.
    store = RedisStore.from_url(redis_url, stall_timeout_s=0.5)
    try:
        pairs = await _streams(store, 40)
        event = "x" * (100 * 1024)
        for session, life in pairs:
            await store.append_many(session, life, [(event, None)] * 20)  # 2 MB per stream
        outcomes = await asyncio.gather(
            *(store.read(s, life, 0, 1000) for s, life in pairs), return_exceptions=True
        )
    finally:
        await store.close()
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    assert not failed, repr(failed[0])
    assert store._calls.healthy
    # Each reply bounded: the rest is read again from the last offset.
    assert all(len(o.events) * len(event) <= READ_MAX_BYTES + len(event) for o in outcomes)


async def test_a_persistent_error_reply_is_logged_once(make_redis_store):
    store = make_redis_store()
    admin = make_redis_store.admin()
    pairs = await _streams(store, 4)
    for session, life in pairs:
        meta = SessionKeys.of(PREFIX, session).meta(life)
        await admin.delete(meta)
        await admin.set(meta, "not a hash")
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            outcomes = await asyncio.gather(
                *(store.append(s, life, "x", None) for s, life in pairs), return_exceptions=True
            )
            assert all(isinstance(o, StoreUnavailable) for o in outcomes)
    assert [e["event"] for e in logs].count("store.redis_refused") == 1


async def test_a_call_cancelled_while_queued_is_not_sent(make_redis_store):
    store = make_redis_store()
    (pair,) = await _streams(store, 1)
    release, holders = await _hold_all_permits(store)
    task = asyncio.create_task(store.append(*pair, "gone", None))
    await eventually(lambda: store.queued >= 1)
    task.cancel()
    release.set()
    await asyncio.gather(*holders, return_exceptions=True)
    assert await store.append(*pair, "kept", None) == 1
    assert [e.data for e in (await store.read(*pair, 0, 10)).events] == ["kept"]


async def test_closing_with_calls_queued_settles_every_caller(make_redis_store):
    store = make_redis_store()
    pairs = await _streams(store, 300)
    release, holders = await _hold_all_permits(store)
    appends = [asyncio.create_task(store.append(s, life, "x", None)) for s, life in pairs]
    await eventually(lambda: store.queued >= len(pairs))
    closing = asyncio.create_task(store.close())
    release.set()
    await asyncio.wait_for(closing, DEADLINE_S)
    outcomes = await asyncio.wait_for(asyncio.gather(*appends, return_exceptions=True), DEADLINE_S)
    assert {type(o).__name__ if isinstance(o, BaseException) else "ok" for o in outcomes} <= {
        "ok",
        "StoreUnavailable",
    }
    await asyncio.gather(*holders, return_exceptions=True)


async def test_new_work_let_in_is_not_refused_by_its_own_pipeline(make_redis_store):
    store = make_redis_store(max_queued_calls=5)
    release, holders = await _hold_all_permits(store)
    lives = [new_life() for _ in range(5)]
    creates = [
        asyncio.create_task(store.create_stream(f"n{i}", life, kind="request", owner="r1"))
        for i, life in enumerate(lives)
    ]
    await eventually(lambda: store.queued >= len(creates))
    release.set()
    outcomes = await asyncio.gather(*creates, *holders, return_exceptions=True)
    assert outcomes[: len(creates)] == [None] * len(creates)
    assert [await store.append(f"n{i}", life, "x", None) for i, life in enumerate(lives)] == [1] * 5


async def test_waiting_longer_than_the_stall_timeout_is_not_an_outage(make_redis_store):
    stall_s = 1.0
    store = make_redis_store(stall_timeout_s=stall_s)
    pairs = await _streams(store, 10)
    first, holders = await _hold_all_permits(store)
    began = asyncio.get_running_loop().time()
    appends = [asyncio.create_task(store.append(s, life, "x", None)) for s, life in pairs]
    creates = [
        asyncio.create_task(store.create_stream(f"w{i}", new_life(), kind="request", owner="r1"))
        for i in range(5)
    ]
    await eventually(lambda: store.queued >= len(appends) + len(creates))
    # A second wave of holders, more urgent than the queued calls, takes every permit as the
    # first wave gives them back: the calls wait two holds (each well within the stall timeout),
    # longer in all than the stall timeout, and no command of theirs is late.
    second = asyncio.Event()

    async def hold_again() -> None:
        async with store._calls.call("hold", LIVENESS):
            await second.wait()

    again = [asyncio.create_task(hold_again()) for _ in holders]
    await eventually(lambda: store._calls.queued >= len(again))
    loop = asyncio.get_running_loop()
    loop.call_later(stall_s * 0.7, first.set)
    loop.call_later(stall_s * 1.4, second.set)
    outcomes = await asyncio.gather(*appends, *creates, return_exceptions=True)
    await asyncio.gather(*holders, *again)
    assert loop.time() - began > stall_s
    assert outcomes == [1] * len(appends) + [None] * len(creates)
    assert store._calls.healthy


@pytest.mark.redis
async def test_pipelines_repeat_on_a_new_connection_after_redis_dropped_theirs(redis_url):
    # A real Redis: CLIENT KILL closes the store's pooled connections between two waves, as a
    # restart or a failover would. Each append is sent again on a new connection, stored once.
    async with _real_redis(redis_url) as (store, admin):
        pairs = await _streams(store, 50)
        first = await asyncio.gather(*(store.append(s, life, "a", None) for s, life in pairs))
        killed = await admin.client_kill_filter(_type="normal", skipme=True)
        assert killed >= 1
        second = await asyncio.gather(*(store.append(s, life, "b", None) for s, life in pairs))
        reads = [await store.read(s, life, 0, 10) for s, life in pairs]
    assert first == [1] * len(pairs)
    assert second == [2] * len(pairs)
    assert [[e.data for e in read.events] for read in reads] == [["a", "b"]] * len(pairs)
    assert store._calls.healthy


@pytest.mark.redis
async def test_a_pipeline_cut_by_the_stall_timeout_leaves_no_reply_behind(redis_url):
    # A real Redis, frozen by CLIENT PAUSE: the pipeline's replies come after its callers gave
    # up. Its connection must not go back to the pool with them unread, or a later call would
    # read another call's reply.
    async with _real_redis(redis_url, stall_timeout_s=0.3) as (store, admin):
        pairs = await _streams(store, 8)
        await admin.execute_command("CLIENT", "PAUSE", 1000, "ALL")
        stalled = await asyncio.gather(
            *(store.append(s, life, "late", None) for s, life in pairs), return_exceptions=True
        )
        assert all(isinstance(o, StoreUnavailable) for o in stalled), stalled
        await admin.execute_command("CLIENT", "UNPAUSE")
        # Each stalled append may or may not have been applied; each stream's next offset says.
        stored = [len((await store.read(s, life, 0, 10)).events) for s, life in pairs]
        after = await asyncio.gather(*(store.append(s, life, "next", None) for s, life in pairs))
        infos = [await store.stream_info(s, life) for s, life in pairs]
    assert after == [n + 1 for n in stored]
    assert all(info is not None for info in infos)


@pytest.mark.redis
async def test_callers_that_leave_mid_call_cost_no_new_connections(redis_url):
    # A client that goes away cancels its request handler, and with it the store call in
    # flight: the call is finished by its pipeline's flusher task, so the connection is not
    # closed under it.
    rounds = 100
    async with _real_redis(redis_url) as (store, admin):
        ((session, life),) = await _streams(store, 1)
        await store.append(session, life, "a", None)
        before = int((await admin.info("stats"))["total_connections_received"])
        for _ in range(rounds):
            call = asyncio.ensure_future(store.stream_info(session, life))
            for _ in range(3):
                await asyncio.sleep(0)  # its command is out, its reply not read yet
            call.cancel()
            await asyncio.gather(call, return_exceptions=True)
        after = int((await admin.info("stats"))["total_connections_received"])
        assert (await store.stream_info(session, life)).last_offset == 1
    assert after - before <= 2, after - before


async def _lane_connected(store, session: str, life: str) -> Any:
    """Append once (a lone append wants the lane, which then connects in the background) and
    wait until the lane is up; returns it."""
    await store.append(session, life, "first", None)
    lane = store._batches.lane
    await eventually(lambda: lane.connects >= 1)
    return lane


@pytest.mark.redis
async def test_a_paced_streams_appends_and_finish_go_alone_on_the_lane(redis_url):
    store = RedisStore.from_url(redis_url)
    try:
        ((session, life),) = await _streams(store, 1)
        lane = await _lane_connected(store, session, life)
        before = store._batches.alone
        offsets = [await store.append(session, life, f"e{n}", None) for n in range(2, 22)]
        await store.finish(session, life)
        alone = store._batches.alone - before
        read = await store.read(session, life, 0, 100)
    finally:
        await store.close()
    assert offsets == list(range(2, 22))
    assert alone == 21  # the 20 appends and the finish: none waited for a flusher task
    assert [e.data for e in read.events] == ["first"] + [f"e{n}" for n in range(2, 22)]
    assert read.finished
    assert lane.connects == 1


@pytest.mark.redis
async def test_an_append_on_a_lane_redis_closed_is_stored_once_and_the_lane_comes_back(redis_url):
    # CLIENT KILL closes the lane's connection (and the pool's) while idle, as a Redis restart
    # or an idle timeout would: the append finds out on it, goes to a pipeline, is stored once.
    async with _real_redis(redis_url) as (store, admin):
        ((session, life),) = await _streams(store, 1)
        lane = await _lane_connected(store, session, life)
        assert await admin.client_kill_filter(_type="normal", skipme=True) >= 1
        assert await store.append(session, life, "b", None) == 2
        assert await store.append(session, life, "c", None) == 3  # wants the lane again
        await eventually(lambda: lane.connects == 2)
        before = store._batches.alone
        assert await store.append(session, life, "d", None) == 4
        alone = store._batches.alone - before
        read = await store.read(session, life, 0, 10)
    assert [e.data for e in read.events] == ["first", "b", "c", "d"]
    assert alone == 1
    assert store._calls.healthy


@pytest.mark.redis
async def test_a_lone_call_cancelled_mid_call_leaves_no_reply_on_the_lane(redis_url):
    # A pump stopped with its append in flight: the lane's connection has a reply unread, so
    # it is dropped (and made anew), never read by the next call as its own reply.
    store = RedisStore.from_url(redis_url)
    try:
        ((session, life),) = await _streams(store, 1)
        lane = await _lane_connected(store, session, life)
        before = store._batches.alone
        call = asyncio.ensure_future(store.append(session, life, "cut", None))
        await eventually(lambda: store._batches.alone > before, poll_s=0)
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        assert call.cancelled()
        stored = len((await store.read(session, life, 0, 10)).events)  # "cut" stored or not
        nxt = await store.append(session, life, "next", None)
        await eventually(lambda: lane.connects == 2)
        last = await store.append(session, life, "last", None)
        read = await store.read(session, life, 0, 10)
    finally:
        await store.close()
    assert (nxt, last) == (stored + 1, stored + 2)
    assert [e.data for e in read.events][-2:] == ["next", "last"]


@pytest.mark.redis
async def test_a_lone_call_cut_by_the_stall_timeout_is_unavailable_and_drops_the_lane(redis_url):
    async with _real_redis(redis_url, stall_timeout_s=0.3) as (store, admin):
        ((session, life),) = await _streams(store, 1)
        lane = await _lane_connected(store, session, life)
        before = store._batches.alone
        await admin.execute_command("CLIENT", "PAUSE", 1000, "WRITE")
        with pytest.raises(StoreUnavailable):
            await store.append(session, life, "late", None)
        assert store._batches.alone == before + 1
        await admin.execute_command("CLIENT", "UNPAUSE")
        stored = len((await store.read(session, life, 0, 10)).events)  # "late" stored or not
        after = await store.append(session, life, "next", None)  # the store is back
        again = await store.append(session, life, "again", None)  # wants the lane again
        await eventually(lambda: lane.connects == 2)
    assert (after, again) == (stored + 1, stored + 2)


@pytest.mark.redis
async def test_closing_the_store_waits_for_a_lone_call_in_flight_and_leaves_no_connection(
    redis_url,
):
    async with _real_redis(redis_url, stall_timeout_s=3.0) as (store, admin):
        ((session, life),) = await _streams(store, 1)
        await _lane_connected(store, session, life)
        await admin.execute_command("CLIENT", "PAUSE", 500, "WRITE")
        before = store._batches.alone
        call = asyncio.ensure_future(store.append(session, life, "in flight", None))
        await eventually(lambda: store._calls.in_flight == 1)
        assert store._batches.alone == before + 1  # it went on the lane
        await store.close()
        done_at_close = call.done()
        left = [c for c in await admin.client_list() if c.get("name") == CLIENT_NAME]
        outcome = (await asyncio.gather(call, return_exceptions=True))[0]
    assert done_at_close
    assert outcome == 2
    assert left == []


@pytest.mark.redis
async def test_a_lane_redis_closed_for_idleness_is_replaced_not_tried(redis_url):
    # Redis's idle `timeout` closes the lane between two events of a slow stream: the next
    # append sees it closed before using it (a pipeline sends it) and a new lane is made.
    async with _real_redis(redis_url) as (store, admin):
        ((session, life),) = await _streams(store, 1)
        lane = await _lane_connected(store, session, life)
        idle = lane._connection
        await admin.config_set("timeout", 1)
        try:
            await eventually(lambda: idle.closed, timeout_s=DEADLINE_S)
        finally:
            await admin.config_set("timeout", 0)
        before = store._batches.alone
        assert await store.append(session, life, "b", None) == 2
        tried = store._batches.alone - before
        await eventually(lambda: lane.connects == 2)
        assert await store.append(session, life, "c", None) == 3
        alone = store._batches.alone - before
        read = await store.read(session, life, 0, 10)
    assert (tried, alone) == (0, 1)
    assert [e.data for e in read.events] == ["first", "b", "c"]


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (its own CA) and its key, as PEM files in *directory*."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "redis.crt", directory / "redis.key"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


@pytest.mark.redis
async def test_the_lane_works_over_tls(tmp_path):
    # The lane takes over a TLS connection's transport as it does a plain one: the paced appends
    # and the finish go alone, encrypted, and read back whole (one event past a TLS record).
    cert_file, key_file = _self_signed(tmp_path)
    tls_port = free_port()
    server = RedisServerProcess(
        redis_server_executable(),
        [
            "--tls-port", str(tls_port),
            "--tls-cert-file", str(cert_file),
            "--tls-key-file", str(key_file),
            "--tls-ca-cert-file", str(cert_file),
            "--tls-auth-clients", "no",
        ],
    )  # fmt: skip
    server.start()
    store = RedisStore.from_url(f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={cert_file}")
    try:
        ((session, life),) = await _streams(store, 1)
        lane = await _lane_connected(store, session, life)
        before = store._batches.alone
        datas = [f"e{n}" for n in range(2, 21)] + ["x" * 100_000]
        offsets = [await store.append(session, life, data, "message") for data in datas]
        await store.finish(session, life)
        alone = store._batches.alone - before
        read = await store.read(session, life, 0, 100)
    finally:
        await store.close()
        server.close()
    assert offsets == list(range(2, 22))
    assert alone == 21
    assert [e.data for e in read.events] == ["first", *datas]
    assert read.finished
    assert lane.connects == 1


@pytest.mark.redis
async def test_a_lane_dropped_with_a_write_redis_never_read_closes_at_once(
    private_redis, loop_errors
):
    # Redis frozen (SIGSTOP) while a lone append of 8 MB is being written: the stall timeout
    # cuts it, the lane's connection is dropped at once (its buffered write discarded), and
    # nothing fails later in the background; the store then closes at once too.
    store = RedisStore.from_url(private_redis.url, stall_timeout_s=0.5)
    try:
        ((session, life),) = await _streams(store, 1)
        lane = await _lane_connected(store, session, life)
        os.kill(private_redis.pid, signal.SIGSTOP)
        try:
            with pytest.raises(StoreUnavailable):
                await store.append(session, life, "x" * 8_000_000, None)
            await eventually(lambda: not lane._closing)  # redis-py let go of it
            dropped = lane._connection is None
        finally:
            os.kill(private_redis.pid, signal.SIGCONT)
    finally:
        await asyncio.wait_for(store.close(), DEADLINE_S)
    gc.collect()  # a future or task whose exception nobody retrieved reports it here
    assert dropped
    assert loop_errors == []
