"""The stream layer without sockets: delivery, the pump, request and standalone streams.

A real in-memory event store, the scripted upstream and the list sink of
:mod:`tests.support.fake_upstream`; no HTTP anywhere.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from mcp_sse_gateway.config import Settings
from mcp_sse_gateway.errors import (
    ClientGone,
    CursorGone,
    InvalidEventId,
    SlowReader,
    StoreUnavailable,
    UnknownStream,
    UpstreamConnectError,
)
from mcp_sse_gateway.event_ids import event_id, new_life, parse_event_id
from mcp_sse_gateway.jsonrpc import UPSTREAM_STREAM_BROKEN
from mcp_sse_gateway.metrics import Metrics
from mcp_sse_gateway.sse import encode_retry
from mcp_sse_gateway.store.base import ReadResult, session_digest
from mcp_sse_gateway.store.memory import MemoryStore
from mcp_sse_gateway.streams import Streams
from mcp_sse_gateway.streams.cursor import Delivered
from mcp_sse_gateway.streams.delivery import KEEPALIVE, deliver
from mcp_sse_gateway.streams.life import Phase, StreamLife
from mcp_sse_gateway.streams.pump import MAX_UPSTREAM_RESUMES, MIN_UPSTREAM_RETRY_S, run_pump
from mcp_sse_gateway.streams.registry import Registry
from mcp_sse_gateway.streams.standalone import standalone_life
from mcp_sse_gateway.streams.upstream import UpstreamCall
from tests.support.fake_upstream import URL_, ListSink, ScriptedResponse, ScriptedUpstream, sse
from tests.support.streams import make_streams
from tests.support.waiting import eventually

SID = "session-1"
RETRY_MS = 1000
DEADLINE_S = 10.0


def _settings(sse_: dict[str, Any] | None = None, store: dict[str, Any] | None = None) -> Settings:
    return Settings(
        upstream={"url": str(URL_)},
        sse={"retry_ms": RETRY_MS, "keepalive_s": 30.0, **(sse_ or {})},
        store=store or {},
    )


class _Stage:
    """A store, a registry and one request stream life, for delivery tests."""

    def __init__(self, settings: Settings | None = None, store: MemoryStore | None = None) -> None:
        self.settings = settings or _settings()
        self.store = store or MemoryStore()
        self.registry = Registry()
        self.metrics = Metrics()
        self.life = new_life()
        self.key = (session_digest(SID), self.life)

    async def create(self, *datas: str) -> None:
        await self.store.create_stream(SID, self.life, kind="request", owner="replica-a")
        if datas:
            await self.store.append_many(SID, self.life, [(d, None) for d in datas])

    def stream(self) -> StreamLife:
        return self.registry.life(self.key, SID, self.life)

    def deliver(
        self, sink: ListSink, *, cursor: int = 0, primes: bool = True, **options: Any
    ) -> asyncio.Task[Delivered]:
        return asyncio.ensure_future(
            deliver(
                sink,
                store=self.store,
                registry=self.registry,
                stream=self.stream(),
                settings=self.settings,
                metrics=self.metrics,
                cursor=cursor,
                primes=primes,
                **options,
            )
        )


# Delivery -----------------------------------------------------------------------------------


async def test_replay_then_live_tail_sends_each_event_once_with_its_id():
    stage = _Stage()
    await stage.create("a", "b", "c")
    sink = ListSink()
    task = stage.deliver(sink, cursor=1)
    await sink.wait_for(2)
    await stage.store.append_many(SID, stage.life, [("d", None)])
    await sink.wait_for(3)
    await stage.store.finish(SID, stage.life)
    delivered = await asyncio.wait_for(task, DEADLINE_S)

    events = sink.events()
    assert events[0].data == ""  # the priming event: id + retry + empty data
    primed = parse_event_id(events[0].id)
    assert primed is not None
    assert (primed.life, primed.offset) == (stage.life, 1)  # its cursor is the starting one
    assert events[0].retry == RETRY_MS
    assert [(e.data, e.id) for e in events if e.data] == [
        ("b", event_id(stage.life, 2)),
        ("c", event_id(stage.life, 3)),
        ("d", event_id(stage.life, 4)),
    ]
    assert sink.writes[-1] == encode_retry(RETRY_MS)
    assert sink.ended
    assert (delivered.ended, delivered.events, delivered.cursor) == ("finished", 3, 4)
    assert stage.registry.find(stage.key) is None  # released with its reader


async def test_polling_close_right_after_priming_unless_resuming():
    stage = _Stage(_settings({"poll_after_ms": 0}))
    await stage.create("a")
    sink = ListSink()
    delivered = await asyncio.wait_for(stage.deliver(sink), DEADLINE_S)
    assert delivered.ended == "poll"
    assert sink.datas() == []

    resumed = ListSink()
    task = stage.deliver(resumed, resuming=True)
    await resumed.wait_for(1)
    await stage.store.finish(SID, stage.life)
    assert (await asyncio.wait_for(task, DEADLINE_S)).ended == "finished"
    assert resumed.datas() == ["a"]


async def test_a_reader_cut_at_the_closing_retry_is_counted_as_a_slow_reader():
    """The closing ``retry`` stayed blocked (the client stopped reading just then): the
    connection was cut, and it ended as a slow reader, not as the poll it was about to be."""

    class SlowAtTheEnd(ListSink):
        async def end(self, last: bytes = b"") -> None:
            del last
            raise SlowReader

    stage = _Stage(_settings({"poll_after_ms": 0}))
    await stage.create("a")
    delivered = await asyncio.wait_for(stage.deliver(SlowAtTheEnd()), DEADLINE_S)
    assert delivered.ended == "slow_reader"
    counted = stage.metrics.registry.get_sample_value(
        "mcp_sse_gateway_stream_connections_ended_total", {"reason": "slow_reader"}
    )
    assert counted == 1


async def test_a_replay_that_never_catches_up_closes_after_its_passes():
    stage = _Stage(_settings(store={"replay_batch_events": 2, "replay_max_passes": 2}))
    await stage.create(*"abcdefghij")
    sink = ListSink()
    delivered = await asyncio.wait_for(stage.deliver(sink, resuming=True), DEADLINE_S)
    assert delivered.ended == "replay_bound"
    assert sink.datas() == ["a", "b", "c", "d"]
    assert delivered.cursor == 4  # the client resumes from there


@pytest.mark.parametrize(
    ("failure", "ended"), [(SlowReader, "slow_reader"), (ClientGone, "client_gone")]
)
async def test_a_slow_or_vanished_reader_is_cut_without_a_retry(failure: Any, ended: str):
    stage = _Stage()
    await stage.create("a")
    sink = ListSink()
    sink.fail_with = failure
    delivered = await asyncio.wait_for(stage.deliver(sink), DEADLINE_S)
    assert delivered.ended == ended
    counted = stage.metrics.registry.get_sample_value(
        "mcp_sse_gateway_stream_connections_ended_total", {"reason": ended}
    )
    assert counted == 1
    assert sink.aborted is (failure is SlowReader)
    assert not sink.ended
    assert sink.writes == []


async def test_a_newer_connection_supersedes_the_older_with_retry():
    stage = _Stage()
    await stage.create("a")
    older, newer = ListSink(), ListSink()
    first = stage.deliver(older)
    await older.wait_for(1)
    second = stage.deliver(newer)
    assert (await asyncio.wait_for(first, DEADLINE_S)).ended == "superseded"
    assert older.writes[-1] == encode_retry(RETRY_MS)
    await newer.wait_for(1)
    await stage.store.finish(SID, stage.life)
    assert (await asyncio.wait_for(second, DEADLINE_S)).ended == "finished"


async def test_keepalive_comments_while_idle():
    stage = _Stage(_settings({"keepalive_s": 0.02}))
    await stage.create()
    sink = ListSink()
    task = stage.deliver(sink)
    await eventually(lambda: sink.writes.count(KEEPALIVE) >= 2)
    await stage.store.finish(SID, stage.life)
    assert (await asyncio.wait_for(task, DEADLINE_S)).ended == "finished"


async def test_the_live_tail_comes_from_the_feed_and_lost_events_go_without_ids():
    stage = _Stage()
    await stage.create()
    stream = stage.stream()
    feed = stream.start_feed(max_lost_events=100)
    sink = ListSink()
    task = stage.deliver(sink)
    last = await stage.store.append_many(SID, stage.life, [("a", None)])
    feed.add_stored(last, [("a", None)])
    await sink.wait_for(1)
    stream.lose()  # the store failed: the feed carries the stream on, unstored
    feed.push("b", "progress")
    feed.close()
    stream.pump_ended()
    assert stream.phase is Phase.LOST
    delivered = await asyncio.wait_for(task, DEADLINE_S)
    assert delivered.ended == "finished_unstored"
    assert [(e.data, e.id, e.event) for e in sink.events() if e.data] == [
        ("a", event_id(stage.life, 1), None),
        ("b", None, "progress"),  # without id: a later resume names "a" and gets a 400
    ]


async def _parked_delivery(
    stage: _Stage, sink: ListSink, **options: Any
) -> tuple[StreamLife, Any, asyncio.Task[Delivered]]:
    """A delivery of a new stream with a feed, caught up and parked at the feed's end."""
    await stage.create()
    stream = stage.stream()
    feed = stream.start_feed(max_lost_events=100)
    task = stage.deliver(sink, **options)
    await eventually(lambda: feed.parked)
    return stream, feed, task


async def _store(stage: _Stage, feed: Any, *datas: str) -> None:
    """What the pump does with a batch: store it, then hand it to the feed."""
    events = [(data, None) for data in datas]
    last = await stage.store.append_many(SID, stage.life, events)
    feed.add_stored(last - len(events) + 1, events)


async def test_a_caught_up_connection_is_written_by_the_pumps_call_without_a_wake_up():
    stage = _Stage()
    sink = ListSink()
    stream, feed, task = await _parked_delivery(stage, sink)
    events = [("a", None), ("b", None)]
    last = await stage.store.append_many(SID, stage.life, events)
    feed.add_stored(last - 1, events)
    # Written within the pump's own call: no loop turn of the connection's task came between.
    assert sink.datas() == ["a", "b"]
    assert sink.written_now == 1
    await _store(stage, feed, "c")
    assert sink.datas() == ["a", "b", "c"]
    await stage.store.finish(SID, stage.life)
    feed.close()
    stream.pump_ended()
    delivered = await asyncio.wait_for(task, DEADLINE_S)
    assert (delivered.ended, delivered.events, delivered.cursor) == ("finished", 3, 3)
    assert [(e.data, e.id) for e in sink.events() if e.data] == [
        ("a", event_id(stage.life, 1)),
        ("b", event_id(stage.life, 2)),
        ("c", event_id(stage.life, 3)),
    ]


async def test_a_connection_behind_when_the_pump_ends_reads_the_rest_from_its_feed():
    """The pump ended and the store evicted the finished stream (memory pressure) while the
    client's buffer was full: the connection still sends every event, from the feed it held."""

    class GatedSink(ListSink):
        def __init__(self) -> None:
            super().__init__()
            self.gate = asyncio.Event()
            self.gate.set()
            self.held = 0

        async def write(self, data: bytes) -> None:
            if not self.gate.is_set():
                self.held += 1
                await self.gate.wait()
            await super().write(data)

    stage = _Stage()
    sink = GatedSink()
    stream, feed, task = await _parked_delivery(stage, sink)
    sink.blocked, _ = True, sink.gate.clear()
    await _store(stage, feed, "a")
    await eventually(lambda: sink.held == 1)  # the connection's own write of "a" waits
    await _store(stage, feed, "b", "c")
    await stage.store.finish(SID, stage.life)
    feed.close()
    stream.pump_ended()
    assert stream.feed is None
    await stage.store.drop_stream(SID, stage.life)  # evicted under the byte cap
    sink.gate.set()
    delivered = await asyncio.wait_for(task, DEADLINE_S)
    assert sink.datas() == ["a", "b", "c"]
    assert [e.id for e in sink.events() if e.data] == [
        event_id(stage.life, 1),
        event_id(stage.life, 2),
        event_id(stage.life, 3),
    ]
    assert delivered.events == 3
    assert delivered.ended == "finished"  # the end of the ended feed: no store read needed


class _TokenSink(ListSink):
    """A client that takes one write per token while gated (a full socket buffer)."""

    def __init__(self) -> None:
        super().__init__()
        self.gated = False
        self.tokens: asyncio.Queue[None] = asyncio.Queue()
        self.held = 0

    async def write(self, data: bytes) -> None:
        if self.gated:
            self.held += 1
            await self.tokens.get()
        await super().write(data)

    def open(self) -> None:
        self.gated = False
        for _ in range(self.held + 1):
            self.tokens.put_nowait(None)


async def _evict_by_cap(store: MemoryStore, size: int) -> None:
    """Another session's running call appends *size* bytes: the cap evicts finished streams."""
    other = new_life()
    await store.create_stream("other-session", other, kind="request", owner="replica-a")
    await store.append("other-session", other, "z" * size, None)


async def test_a_reader_behind_the_feeds_window_at_the_pumps_end_gets_the_tail_from_it():
    """More than the feed's window behind when the pump ends: the connection catches up from
    the store, then takes the tail and the response from the feed it held, though the store
    evicted the finished stream in between."""
    big = "x" * (1024 * 1024 - 100)  # 4 of them and the response fill the feed's 4 MiB
    store = MemoryStore(max_bytes=6 * 1024 * 1024)
    stage = _Stage(_settings(store={"replay_batch_events": 1}), store)
    sink = _TokenSink()
    stream, feed, task = await _parked_delivery(stage, sink)
    sink.blocked, sink.gated = True, True
    await _store(stage, feed, "a")
    await eventually(lambda: sink.held == 1)  # the connection's own write of "a" waits
    answer = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {}})
    await _store(stage, feed, big, big, big, big, big)  # offsets 2..6: the feed keeps 3..6
    await _store(stage, feed, answer)  # offset 7
    assert feed.read(1, 10) is None  # offset 2 is only in the store now
    await stage.store.finish(SID, stage.life)
    feed.close()
    stream.pump_ended()
    sink.tokens.put_nowait(None)  # "a" goes; offset 2 is read from the store, its write waits
    await eventually(lambda: sink.held == 2)
    await _evict_by_cap(store, 2 * 1024 * 1024)
    assert await store.stream_info(SID, stage.life) is None
    sink.open()
    delivered = await asyncio.wait_for(task, DEADLINE_S)
    assert sink.datas() == ["a", big, big, big, big, big, answer]
    assert [e.id for e in sink.events() if e.data] == [
        event_id(stage.life, offset) for offset in range(1, 8)
    ]
    assert delivered.events == 7


async def test_a_call_answered_before_its_connection_attached_is_served_from_the_ended_feed():
    """The common fast call: the answer was read, stored and finished, and the life released,
    before the POST's connection attached; the store evicted the finished stream meanwhile.
    The connection takes the life its POST opened, and the answer from its ended feed."""
    answer = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"ok": True}})
    upstream = ScriptedUpstream().then(ScriptedResponse(body=[sse(answer)]))
    store = MemoryStore(max_bytes=64 * 1024)
    streams = make_streams(_settings(), upstream, store)
    _, stream = await streams.requests.open_post(SID, CALL, b"{}", [1])
    assert stream is not None
    await eventually(lambda: streams.ctx.registry.tasks == 0)
    assert stream.feed is None
    assert streams.ctx.registry.find(stream.key) is None  # released with its pump
    await _evict_by_cap(store, 64 * 1024)
    assert await store.stream_info(SID, stream.life) is None
    sink = ListSink()
    delivered = await asyncio.wait_for(
        deliver(
            sink,
            store=store,
            registry=streams.ctx.registry,
            stream=streams.ctx.registry.adopt(stream),  # as web/managed.py does for a POST
            settings=streams.ctx.settings,
            metrics=streams.ctx.metrics,
            cursor=0,
            primes=True,
        ),
        DEADLINE_S,
    )
    assert sink.datas() == [answer], delivered
    assert [e.id for e in sink.events() if e.data] == [event_id(stream.life, 1)]
    assert streams.ctx.registry.find(stream.key) is None  # released again with its reader


async def test_the_registry_adopts_a_released_life_unless_a_newer_one_holds_its_key():
    registry = Registry()
    released = StreamLife(("k", "life"), SID, "life")
    assert registry.adopt(released) is released
    assert registry.find(("k", "life")) is released
    registry.release(released)
    newer = registry.life(("k", "life"), SID, "life")
    assert newer is not released
    assert registry.adopt(released) is newer


async def test_a_client_whose_buffer_is_full_is_woken_and_written_by_its_connection():
    stage = _Stage()
    sink = ListSink()
    stream, feed, task = await _parked_delivery(stage, sink)
    sink.blocked = True
    await _store(stage, feed, "a")
    assert sink.datas() == []  # declined: nothing written from the pump's call
    await sink.wait_for(1)  # the connection's own (timed) write
    sink.blocked = False
    await eventually(lambda: feed.parked)
    await _store(stage, feed, "b")
    assert sink.datas() == ["a", "b"]  # parked again, and taken again
    await stage.store.finish(SID, stage.life)
    feed.close()
    stream.pump_ended()
    delivered = await asyncio.wait_for(task, DEADLINE_S)
    assert (delivered.ended, delivered.events) == ("finished", 2)
    assert [e.id for e in sink.events() if e.data] == [
        event_id(stage.life, 1),
        event_id(stage.life, 2),
    ]


async def test_a_connection_told_to_stop_takes_nothing_more_from_the_pump():
    stage = _Stage()
    older, newer = ListSink(), ListSink()
    stream, feed, first = await _parked_delivery(stage, older)
    assert stream.reader is not None
    stream.reader.stop("superseded")  # what a newer connection's attach does
    await _store(stage, feed, "a")
    assert older.datas() == []  # its task is being cancelled: it is not written to
    assert (await asyncio.wait_for(first, DEADLINE_S)).ended == "superseded"
    assert older.datas() == []
    second = stage.deliver(newer)
    await newer.wait_for(1)
    await stage.store.finish(SID, stage.life)
    feed.close()
    stream.pump_ended()
    assert (await asyncio.wait_for(second, DEADLINE_S)).events == 1
    assert newer.datas() == ["a"]


async def test_keepalives_follow_the_last_write_of_the_pump():
    stage = _Stage(_settings({"keepalive_s": 0.05}))
    sink = ListSink()
    stream, feed, task = await _parked_delivery(stage, sink)
    await _store(stage, feed, "a")
    assert sink.writes[-1].endswith(b"data: a\n\n")
    await eventually(lambda: sink.writes[-1] == KEEPALIVE)  # the timer still rings after it
    await stage.store.finish(SID, stage.life)
    feed.close()
    stream.pump_ended()
    assert (await asyncio.wait_for(task, DEADLINE_S)).ended == "finished"


async def test_a_polling_close_that_came_due_ends_the_connection_after_what_it_took():
    stage = _Stage(_settings({"poll_after_ms": 200}))
    sink = ListSink()
    stream, feed, task = await _parked_delivery(stage, sink)
    await _store(stage, feed, "a")
    assert sink.datas() == ["a"]
    delivered = await asyncio.wait_for(task, DEADLINE_S)
    assert (delivered.ended, delivered.events, delivered.cursor) == ("poll", 1, 1)
    assert sink.writes[-1] == encode_retry(RETRY_MS)
    feed.close()
    stream.pump_ended()


class _DownStore(MemoryStore):
    """A memory store whose reads fail while ``down`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.failed_reads = 0

    async def read(self, session_id: str, life: str, after: int, limit: int) -> ReadResult:
        if self.down:
            self.failed_reads += 1
            raise StoreUnavailable
        return await super().read(session_id, life, after, limit)

    async def stream_info(self, session_id: str, life: str) -> Any:
        if self.down:
            raise StoreUnavailable
        return await super().stream_info(session_id, life)


async def test_an_outage_waits_for_the_feed_to_carry_the_stream_on():
    store = _DownStore()
    stage = _Stage(store=store)
    await stage.create()
    store.down = True
    sink = ListSink()
    task = stage.deliver(sink)
    await eventually(lambda: store.failed_reads >= 1)
    # This process's pump lost the store too: the feed appears in lost mode and wakes the
    # waiting connection (no polling).
    stream = stage.stream()
    feed = stream.start_feed(max_lost_events=100)
    stream.lose()
    feed.push("x", None)
    feed.close()
    stream.pump_ended()
    delivered = await asyncio.wait_for(task, DEADLINE_S)
    assert delivered.ended == "finished_unstored"
    assert [(e.data, e.id) for e in sink.events() if e.data] == [("x", None)]


@pytest.mark.parametrize("store_down", [False, True], ids=["owner_alive", "store_down"])
async def test_the_owner_check_runs_while_idle_and_may_end_the_stream(store_down):
    """The owner check runs while the connection is idle; it ends the stream once the owner is
    found dead. A check the store cannot answer (store_down) is an outage waited out like any
    other, not an end of the connection (it used to end ``error``)."""
    stage = _Stage(_settings(store={"heartbeat_s": 0.02, "heartbeat_expiry_s": 0.1}))
    await stage.create("a")
    checks = 0

    async def check_owner() -> bool:
        nonlocal checks
        checks += 1
        if checks < 3:
            if store_down:
                raise StoreUnavailable("down (test)")
            return False
        # The owner is found dead: its pending errors end the stream.
        await stage.store.append_many(SID, stage.life, [("error", None)])
        await stage.store.finish(SID, stage.life)
        return True

    sink = ListSink()
    delivered = await asyncio.wait_for(
        stage.deliver(sink, resuming=True, check_owner=check_owner), DEADLINE_S
    )
    assert delivered.ended == "finished"
    assert sink.datas() == ["a", "error"]
    assert checks == 3


async def test_retry_tasks_are_cancelled_at_once_on_close_and_never_start_after():
    """A task that only retries a store call (a retire, a late end) holds no drain: close
    cancels it at once instead of waiting out its timeout, and one spawned while the
    registry closes never runs."""
    registry = Registry()
    ran = asyncio.Event()

    async def retrying() -> None:
        ran.set()
        await asyncio.Event().wait()  # a store that never answers

    task = registry.spawn(retrying(), name="retry", retry=True)
    await asyncio.wait_for(ran.wait(), DEADLINE_S)
    assert registry.request_pumps == 0
    assert await asyncio.wait_for(registry.close(600), DEADLINE_S) == 0
    assert task.cancelled()
    ran.clear()
    late = registry.spawn(retrying(), name="retry", retry=True)
    with pytest.raises(asyncio.CancelledError):
        await late
    assert not ran.is_set()
    assert registry.tasks == 0


async def test_a_dropped_stream_ends_the_connection_with_retry():
    stage = _Stage()
    await stage.create("a")
    sink = ListSink()
    task = stage.deliver(sink)
    await sink.wait_for(1)
    await stage.store.drop_stream(SID, stage.life)
    delivered = await asyncio.wait_for(task, DEADLINE_S)
    assert delivered.ended == "stream_dropped"
    assert sink.writes[-1] == encode_retry(RETRY_MS)


# The pump -----------------------------------------------------------------------------------


async def _chunks(*chunks: bytes) -> Any:
    for chunk in chunks:
        yield chunk


async def test_the_pump_stores_events_without_upstream_ids_and_finishes():
    stage = _Stage()
    await stage.create()
    response = json.dumps({"jsonrpc": "2.0", "id": 7, "result": {}})
    body = _chunks(
        b"id: up-0\nretry: 50\ndata:\n\n", sse('{"method":"n"}', event_id="up-1"), sse(response)
    )
    result = await run_pump(
        stage.store, SID, stage.life, body, request_ids=[7], max_event_bytes=1 << 16
    )
    assert (result.events, result.broken, result.pending) == (2, False, [])
    read = await stage.store.read(SID, stage.life, 0, 10)
    assert [e.data for e in read.events] == ['{"method":"n"}', response]
    assert read.finished


class _EndingBody:
    """Chunks of a body whose end comes with its last chunk (``ended`` as the upstream's says)."""

    def __init__(self, *chunks: bytes) -> None:
        self._chunks = list(chunks)
        self.ended = False

    def __aiter__(self) -> _EndingBody:
        return self

    async def __anext__(self) -> bytes:
        if not self._chunks:
            raise StopAsyncIteration
        chunk = self._chunks.pop(0)
        self.ended = not self._chunks
        return chunk


class _CountingStore(MemoryStore):
    """A memory store that records whether each append finished, and each finish."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    async def append_many(self, *args: Any, finish: bool = False, **kwargs: Any) -> int:
        self.calls.append("append+finish" if finish else "append")
        return await super().append_many(*args, finish=finish, **kwargs)

    async def finish(self, session_id: str, life: str) -> None:
        self.calls.append("finish")
        await super().finish(session_id, life)


async def test_the_last_append_carries_the_end_when_the_body_ended_with_it():
    store = _CountingStore()
    stage = _Stage(store=store)
    await stage.create()
    answer = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {}})
    body = _EndingBody(sse('{"method":"n"}'), sse(answer))
    result = await run_pump(store, SID, stage.life, body, request_ids=[1], max_event_bytes=1 << 16)
    assert (result.events, result.broken, result.pending) == (2, False, [])
    assert store.calls == ["append", "append+finish"]
    read = await store.read(SID, stage.life, 0, 10)
    assert [e.data for e in read.events] == ['{"method":"n"}', answer]
    assert read.finished


async def test_the_end_is_a_call_of_its_own_when_the_body_says_nothing_of_its_end():
    store = _CountingStore()
    stage = _Stage(store=store)
    await stage.create()
    body = _chunks(sse(json.dumps({"jsonrpc": "2.0", "id": 1, "result": {}})))
    await run_pump(store, SID, stage.life, body, request_ids=[1], max_event_bytes=1 << 16)
    assert store.calls == ["append", "finish"]
    assert (await store.read(SID, stage.life, 0, 10)).finished


async def test_a_request_unanswered_at_the_bodys_end_gets_its_error_before_the_end():
    store = _CountingStore()
    stage = _Stage(store=store)
    await stage.create()
    body = _EndingBody(sse('{"method":"n"}'))
    result = await run_pump(store, SID, stage.life, body, request_ids=[1], max_event_bytes=1 << 16)
    assert result.pending == [1]
    assert store.calls == ["append", "append", "finish"]
    read = await store.read(SID, stage.life, 0, 10)
    assert json.loads(read.events[-1].data)["error"]["code"] == UPSTREAM_STREAM_BROKEN
    assert read.finished


async def test_a_broken_upstream_body_answers_each_pending_request_with_an_error():
    stage = _Stage()
    await stage.create()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    queue.put_nowait(sse('{"method":"progress"}'))
    queue.put_nowait(ConnectionResetError())
    body = ScriptedResponse(body=queue).chunks()
    result = await run_pump(
        stage.store, SID, stage.life, body, request_ids=[1, "two"], max_event_bytes=1 << 16
    )
    assert result.broken
    assert result.pending == [1, "two"]
    read = await stage.store.read(SID, stage.life, 0, 10)
    errors = [json.loads(e.data) for e in read.events[1:]]
    assert [(e["id"], e["error"]["code"]) for e in errors] == [
        (1, UPSTREAM_STREAM_BROKEN),
        ("two", UPSTREAM_STREAM_BROKEN),
    ]
    assert read.finished


async def _pump_resumable(stage: _Stage, first: Any, reopen: Any) -> Any:
    """Pump *first* into the stage's stream for request id 1, resuming through *reopen*."""
    return await asyncio.wait_for(
        run_pump(
            stage.store,
            SID,
            stage.life,
            first,
            request_ids=[1],
            max_event_bytes=1 << 16,
            reopen=reopen,
        ),
        30,
    )


async def test_a_resumable_upstream_that_closes_on_purpose_is_resumed_with_its_own_id():
    stage = _Stage()
    await stage.create()
    asked: list[str] = []
    answer = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {}})

    async def reopen(last_event_id: str) -> Any:
        asked.append(last_event_id)
        return _chunks(sse(answer))

    first = _chunks(b"id: up-9\nretry: 1\ndata:\n\n", sse('{"method":"n"}', event_id="up-10"))
    result = await _pump_resumable(stage, first, reopen)
    assert asked == ["up-10"]
    assert not result.broken
    read = await stage.store.read(SID, stage.life, 0, 10)
    assert [e.data for e in read.events] == ['{"method":"n"}', answer]


@pytest.mark.parametrize(
    "opening",
    [b"id: up-9\ndata:\n\n", b"retry: 5\n\n"],
    ids=["primed", "retry"],
)
async def test_an_upstream_closing_with_a_priming_event_or_retry_is_resumed(opening: bytes):
    stage = _Stage()
    await stage.create()
    asked: list[str] = []
    answer = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {}})

    async def reopen(last_event_id: str) -> Any:
        asked.append(last_event_id)
        return _chunks(sse(answer))

    first = _chunks(opening, sse('{"method":"n"}', event_id="up-10"))
    result = await _pump_resumable(stage, first, reopen)
    assert asked == ["up-10"]
    assert not result.broken


async def test_an_upstream_that_just_stops_is_not_resumed():
    """Ids but neither priming nor retry: not a close on purpose (SEP-1699). Asking such an
    upstream for a replay may bring messages of another stream, and the call would wait for
    them; its pending request gets the gateway's error at once instead."""
    stage = _Stage()
    await stage.create()
    asked: list[str] = []

    async def reopen(last_event_id: str) -> Any:
        asked.append(last_event_id)
        return _chunks(sse('{"method":"unrelated"}'))

    first = _chunks(sse('{"method":"n"}', event_id="up-10"))
    result = await _pump_resumable(stage, first, reopen)
    assert asked == []
    assert result.broken
    read = await stage.store.read(SID, stage.life, 0, 10)
    datas = [json.loads(e.data) for e in read.events]
    assert datas[0] == {"method": "n"}
    assert datas[1]["id"] == 1
    assert datas[1]["error"]["code"] == UPSTREAM_STREAM_BROKEN
    assert read.finished


async def test_a_resumed_upstream_that_closes_again_without_priming_is_resumed_again():
    """A replay body (the TypeScript SDK's) carries neither priming nor retry: the upstream
    showed it is resumable on the first body, so its later clean ends are deliberate too, and
    it is asked again from its last event id, at its last retry."""
    stage = _Stage()
    await stage.create()
    asked: list[str] = []
    answer = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {}})
    bodies = [
        _chunks(sse('{"method":"second"}', event_id="up-11")),  # replay, closed on purpose
        _chunks(),  # nothing new yet: closed again, no id in it
        _chunks(sse(answer, event_id="up-12")),
    ]

    async def reopen(last_event_id: str) -> Any:
        asked.append(last_event_id)
        return bodies.pop(0)

    first = _chunks(b"id: up-9\nretry: 1\ndata:\n\n", sse('{"method":"first"}', event_id="up-10"))
    result = await _pump_resumable(stage, first, reopen)
    assert asked == ["up-10", "up-11", "up-11"]
    assert not result.broken
    read = await stage.store.read(SID, stage.life, 0, 10)
    assert [e.data for e in read.events] == ['{"method":"first"}', '{"method":"second"}', answer]
    assert read.finished


async def test_a_resumed_upstream_body_held_open_after_the_answer_is_closed():
    """The upstream answered while no one was connected: its replay holds the answer and then
    stays open (nothing left to send on it). The call is done: the pump ends the stream rather
    than waiting on the body for as long as the upstream keeps it."""
    stage = _Stage()
    await stage.create()
    answer = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {}})
    closed = asyncio.Event()

    async def held_open() -> Any:
        try:
            yield sse(answer, event_id="up-11")
            await asyncio.Event().wait()
        finally:
            closed.set()

    async def reopen(last_event_id: str) -> Any:
        return held_open()

    first = _chunks(b"retry: 1\n\n", sse('{"method":"n"}', event_id="up-10"))
    result = await _pump_resumable(stage, first, reopen)
    assert not result.broken
    assert closed.is_set()
    read = await stage.store.read(SID, stage.life, 0, 10)
    assert [e.data for e in read.events] == ['{"method":"n"}', answer]
    assert read.finished


class _StoreDown(MemoryStore):
    """A memory store whose appends fail (a store outage) once ``down``."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    async def append_many(self, *args: Any, **kwargs: Any) -> int:
        if self.down:
            raise StoreUnavailable
        return await super().append_many(*args, **kwargs)


async def test_a_polling_upstream_is_resumed_during_an_outage_while_it_moves_on():
    """The store is down (lost mode) while a client reads the feed, and the upstream polls more
    than MAX_UPSTREAM_RESUMES times, a progress notification a body: its moving event id is
    progress, stored or not, so the client gets its answer, not the gateway's error."""
    store = _StoreDown()
    life = new_life()
    await store.create_stream(SID, life, kind="request", owner="r")
    stream = Registry().life((session_digest(SID), life), SID, life)
    feed = stream.start_feed(max_lost_events=1000)
    stream.attach()
    store.down = True
    answer = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {}})
    bodies = 0

    async def reopen(last_event_id: str) -> Any:
        nonlocal bodies
        bodies += 1
        if bodies > MAX_UPSTREAM_RESUMES + 3:
            return _chunks(sse(answer, event_id=f"up-{bodies}"))
        note = json.dumps({"jsonrpc": "2.0", "method": "notifications/progress"})
        return _chunks(sse(note, event_id=f"up-{bodies}"))

    first = _chunks(b"id: up-0\nretry: 0\ndata:\n\n")
    result = await asyncio.wait_for(
        run_pump(
            store,
            SID,
            life,
            first,
            request_ids=[1],
            max_event_bytes=1 << 16,
            reopen=reopen,
            stream=stream,
        ),
        30,
    )
    assert not result.broken
    assert result.events == 0  # nothing was stored
    assert (feed.read(feed.end - 1, 1) or [])[0].data == answer


async def test_replays_that_repeat_themselves_are_given_up_on():
    """A resumable upstream whose replays bring events without ids: its last event id never
    moves, so the resumes make no progress; after MAX_UPSTREAM_RESUMES of them (each at least
    MIN_UPSTREAM_RETRY_S apart, whatever its retry) the request gets the gateway's error."""
    stage = _Stage()
    await stage.create()
    asked: list[str] = []

    async def reopen(last_event_id: str) -> Any:
        asked.append(last_event_id)
        return _chunks(b'data: {"jsonrpc":"2.0","method":"notifications/message"}\n\n')

    loop = asyncio.get_running_loop()
    began = loop.time()
    first = _chunks(b"id: up-1\nretry: 0\ndata:\n\n")
    result = await _pump_resumable(stage, first, reopen)
    assert result.broken
    assert asked == ["up-1"] * (MAX_UPSTREAM_RESUMES + 1)
    assert loop.time() - began >= MAX_UPSTREAM_RESUMES * MIN_UPSTREAM_RETRY_S


# Request and standalone streams ------------------------------------------------------------


def _streams(upstream: ScriptedUpstream, store: MemoryStore | None = None) -> Streams:
    return make_streams(_settings(), upstream, store)


CALL = UpstreamCall(URL_, [("Accept", "application/json, text/event-stream")])


async def test_a_json_answer_is_relayed_and_its_stream_life_dropped():
    json_answer = ScriptedResponse(content_type="application/json", body=[b"{}"])
    again = ScriptedResponse(content_type="application/json", body=[b"{}"])
    # One open stream per session at most: a life left behind would refuse the next POST.
    store = MemoryStore(max_streams_per_session=1)
    streams = _streams(ScriptedUpstream().then(json_answer, again), store)
    response, stream = await streams.requests.open_post(SID, CALL, b"{}", [1])
    assert response is json_answer
    assert stream is None
    response, stream = await streams.requests.open_post(SID, CALL, b"{}", [2])
    assert (response, stream) == (again, None)
    await eventually(lambda: streams.ctx.registry.tasks == 0)


async def test_an_sse_answer_is_pumped_by_the_app_even_when_the_client_leaves():
    queue: asyncio.Queue[Any] = asyncio.Queue()
    upstream = ScriptedUpstream().then(ScriptedResponse(body=queue))
    streams = _streams(upstream)
    response, stream = await streams.requests.open_post(SID, CALL, b"{}", [1])
    assert stream is not None
    assert stream.phase is Phase.LIVE
    assert stream.feed is not None  # before any client attaches
    answer = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {}})
    queue.put_nowait(sse(answer))  # nobody reads the stream: the pump goes on
    queue.put_nowait(None)
    await eventually(lambda: streams.ctx.registry.tasks == 0)
    read = await streams.ctx.store.read(SID, stream.life, 0, 10)
    assert [e.data for e in read.events] == [answer]
    assert read.finished
    assert stream.phase is Phase.FINISHED
    assert streams.ctx.registry.find(stream.key) is None
    assert response.closed


async def test_an_upstream_failure_before_the_headers_drops_the_new_stream_life():
    store = MemoryStore(max_streams_per_session=1)
    answer = ScriptedResponse(content_type="application/json", body=[b"{}"])
    streams = _streams(ScriptedUpstream().then(UpstreamConnectError("refused"), answer), store)
    with pytest.raises(UpstreamConnectError):
        await streams.requests.open_post(SID, CALL, b"{}", [1])
    # Nothing is left: the session's one stream is free for the next POST.
    response, _ = await streams.requests.open_post(SID, CALL, b"{}", [2])
    assert response is answer


@pytest.mark.parametrize(
    ("last_event_id", "error"),
    [("garbage", InvalidEventId), (None, UnknownStream), ("far", InvalidEventId)],
)
async def test_a_cursor_that_cannot_be_served_is_refused(last_event_id: Any, error: Any):
    store = MemoryStore()
    streams = _streams(ScriptedUpstream(), store)
    life = new_life()
    await store.create_stream(SID, life, kind="request", owner="replica-b")
    await store.append_many(SID, life, [("a", None)])
    value = {
        "garbage": "not-an-id",
        None: event_id(new_life(), 1),  # a life the session never had
        "far": event_id(life, 5),  # beyond the stream's end
    }[last_event_id]
    with pytest.raises(error):
        await streams.resumes.resume_target(SID, value)
    cursor, info = await streams.resumes.resume_target(SID, event_id(life, 1))
    assert (cursor.life, cursor.offset, info.last_offset) == (life, 1, 1)


async def test_a_trimmed_cursor_is_gone():
    store = MemoryStore(max_events_per_stream=2)
    streams = _streams(ScriptedUpstream(), store)
    life = new_life()
    await store.create_stream(SID, life, kind="request", owner="replica-b")
    await store.append_many(SID, life, [(d, None) for d in "abcd"])
    with pytest.raises(CursorGone):
        await streams.resumes.resume_target(SID, event_id(life, 1))


async def test_the_standalone_stream_relays_a_refusal_and_authorizes_joins():
    refusal = ScriptedResponse(status=405, content_type="application/json", body=[b"{}"])
    queue: asyncio.Queue[Any] = asyncio.Queue()
    upstream = ScriptedUpstream().then(refusal, ScriptedResponse(body=queue))
    streams = _streams(upstream)
    joins: list[Any] = []

    async def refuse(info: Any) -> str:
        joins.append(info)
        return "refused"

    async def admit(info: Any) -> None:
        joins.append(info)

    refused = await streams.standalone.ensure(SID, CALL, admit)
    assert refused is not None
    assert refused.response is refusal  # relayed: no pump, nothing kept
    assert not streams.standalone.pumps
    assert await streams.standalone.ensure(SID, CALL, admit) is None  # opens the upstream GET
    assert streams.standalone.running(SID)
    assert joins == []  # the opener is authorized by the upstream itself
    refused = await streams.standalone.ensure(SID, CALL, refuse)
    assert refused is not None
    assert refused.refusal == "refused"
    newer = UpstreamCall(URL_, [("Authorization", "Bearer newer")])
    assert await streams.standalone.ensure(SID, newer, admit) is None
    assert streams.standalone.calls[session_digest(SID)] is newer  # it re-opens the GET
    assert [info.life for info in joins] == [standalone_life(SID)] * 2
    assert len(upstream.sent) == 2  # one refused GET, one open: never two open at once
    await streams.ctx.registry.close(DEADLINE_S)
    assert not streams.standalone.pumps


def _replica(store: MemoryStore, upstream: ScriptedUpstream, replica_id: str) -> Streams:
    settings = _settings(store={"lease_ttl_s": 0.3})
    return make_streams(settings, upstream, store, replica_id=replica_id)


async def test_one_upstream_get_per_session_across_replicas_and_a_takeover_on_release():
    store = MemoryStore()
    await store.record_session(SID, "2025-11-25")
    queue_a: asyncio.Queue[Any] = asyncio.Queue()
    queue_b: asyncio.Queue[Any] = asyncio.Queue()
    upstream_a = ScriptedUpstream().then(ScriptedResponse(body=queue_a))
    upstream_b = ScriptedUpstream().then(ScriptedResponse(body=queue_b))
    a, b = _replica(store, upstream_a, "a"), _replica(store, upstream_b, "b")
    joins: list[Any] = []

    async def admit(info: Any) -> None:
        joins.append(info)

    assert await a.standalone.ensure(SID, CALL, admit) is None  # a opens the upstream GET
    call_b = UpstreamCall(URL_, [("Authorization", "Bearer b")])
    assert await b.standalone.ensure(SID, call_b, admit) is None  # b joins: a holds the lease
    assert (len(upstream_a.sent), len(upstream_b.sent)) == (1, 0)
    assert [info.life for info in joins] == [standalone_life(SID)]

    # A client reads on b; a drains (its pump releases the lease): b takes over with its call.
    life = standalone_life(SID)
    sink = ListSink()
    reader = await b.standalone.claim(SID, life)
    info = await store.stream_info(SID, life)
    assert info is not None
    reading = asyncio.ensure_future(
        deliver(
            sink,
            store=store,
            registry=b.ctx.registry,
            stream=b.requests.stream(SID, life),
            settings=b.ctx.settings,
            metrics=b.ctx.metrics,
            cursor=info.last_offset,  # a plain GET starts at the live end
            primes=False,
            reader=reader,
        )
    )
    await eventually(lambda: b.ctx.registry.attached((session_digest(SID), life)))
    await a.ctx.registry.close(DEADLINE_S)
    await eventually(lambda: b.standalone.running(SID))
    await eventually(lambda: len(upstream_b.sent) == 1)
    assert upstream_b.sent[0].headers == call_b.headers
    queue_b.put_nowait(sse('{"method":"notifications/message"}'))
    await sink.wait_for(1)

    # A newer connection claims the stream: the older one ends, superseded.
    await b.standalone.claim(SID, life)
    assert (await asyncio.wait_for(reading, DEADLINE_S)).ended == "superseded"
    await b.ctx.registry.close(DEADLINE_S)


async def test_a_pump_whose_lease_was_taken_over_stores_nothing_more():
    store = MemoryStore()
    life = new_life()
    await store.create_stream(SID, life, kind="standalone", owner="a")
    lease = await store.acquire_lease(SID, "a", 0.05)
    assert lease is not None
    queue: asyncio.Queue[Any] = asyncio.Queue()
    body = ScriptedResponse(body=queue).chunks()
    pumping = asyncio.ensure_future(
        run_pump(
            store,
            SID,
            life,
            body,
            request_ids=[],
            max_event_bytes=1 << 16,
            finish=False,
            lease=lease,
        )
    )
    queue.put_nowait(sse("kept"))

    async def stored() -> int:
        return len((await store.read(SID, life, 0, 10)).events)

    async def taken_over() -> bool:  # the lease expires unrenewed; another replica takes it
        return await store.acquire_lease(SID, "b", 30) is not None

    await eventually(stored)
    await eventually(taken_over)
    queue.put_nowait(sse("late"))
    result = await asyncio.wait_for(pumping, DEADLINE_S)
    assert result.lease_lost
    read = await store.read(SID, life, 0, 10)
    assert [e.data for e in read.events] == ["kept"]


class _FailingAppends(MemoryStore):
    """A memory store whose appends raise *failure* while it is set."""

    def __init__(self) -> None:
        super().__init__()
        self.failure: BaseException | None = None

    async def append_many(self, *args: Any, **kwargs: Any) -> int:
        if self.failure is not None:
            raise self.failure
        return await super().append_many(*args, **kwargs)


async def test_a_life_retired_while_its_pump_runs_never_gets_a_write_after_the_gap():
    store = _FailingAppends()
    stage = _Stage(store=store)
    await stage.create()
    stream = stage.stream()
    stream.start_feed(max_lost_events=100)
    queue: asyncio.Queue[Any] = asyncio.Queue()
    pumping = asyncio.ensure_future(
        run_pump(
            store,
            SID,
            stage.life,
            ScriptedResponse(body=queue).chunks(),
            request_ids=[1],
            max_event_bytes=1 << 16,
            stream=stream,
        )
    )
    queue.put_nowait(sse('{"method":"one"}'))
    await eventually(lambda: stream.feed is not None and stream.feed.end == 1)
    store.failure = StoreUnavailable()
    queue.put_nowait(sse('{"method":"two"}'))  # unstored: the life goes to lost mode
    await eventually(lambda: stream.phase is Phase.LOST)
    stream.retire()  # a retire cancelled at shutdown, say, while the pump still runs
    store.failure = None  # the store is back
    queue.put_nowait(sse(json.dumps({"jsonrpc": "2.0", "id": 1, "result": {}})))
    queue.put_nowait(None)
    result = await asyncio.wait_for(pumping, DEADLINE_S)
    assert result.store_lost
    read = await store.read(SID, stage.life, 0, 10)
    assert [e.data for e in read.events] == ['{"method":"one"}']  # nothing after the gap
    assert not read.finished  # not finished as if complete: a resume gets no silent gap


async def test_an_unforeseen_store_failure_ends_the_pump_with_the_pending_errors():
    store = _FailingAppends()
    stage = _Stage(store=store)
    await stage.create()
    store.failure = RuntimeError("a bug")
    result = await run_pump(
        store,
        SID,
        stage.life,
        _chunks(sse('{"method":"n"}')),
        request_ids=[9],
        max_event_bytes=1 << 16,
    )
    assert result.broken
    assert result.pending == [9]


async def test_the_lease_is_kept_while_the_upstream_get_is_re_opened_for_longer_than_its_ttl():
    store = MemoryStore()
    await store.record_session(SID, "2025-11-25")
    first: asyncio.Queue[Any] = asyncio.Queue()
    later: asyncio.Queue[Any] = asyncio.Queue()
    unavailable = [
        ScriptedResponse(status=503, content_type="text/plain", body=[b"busy"]) for _ in range(4)
    ]
    upstream = ScriptedUpstream().then(
        ScriptedResponse(body=first), *unavailable, ScriptedResponse(body=later)
    )
    settings = _settings({"retry_ms": 100}, {"lease_ttl_s": 0.3})
    streams = make_streams(settings, upstream, store, replica_id="a")

    async def admit(info: Any) -> None:
        return None

    assert await streams.standalone.ensure(SID, CALL, admit) is None
    first.put_nowait(None)  # the upstream closes the GET; re-opens fail for about a second
    await eventually(lambda: len(upstream.sent) == 6)  # the open that succeeds at last
    assert streams.standalone.running(SID)
    assert await store.acquire_lease(SID, "b", 30) is None  # still this replica's
    await streams.ctx.registry.close(DEADLINE_S)


# The JSON upgrade's races ------------------------------------------------------------------


class _HeldUpstream:
    """An upstream whose one answer (a response or an error) comes when the test releases it."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.answer: ScriptedResponse | BaseException = UpstreamConnectError("refused")
        self.timeouts: list[float | None] = []
        self.requests: list[tuple[Any, ...]] = []

    async def open(self, *request: Any, headers_timeout_s: float | None = None) -> ScriptedResponse:
        """The answer once released; *request* is (method, URL, headers, body)."""
        self.requests.append(request)
        self.timeouts.append(headers_timeout_s)
        await self.release.wait()
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


class _SlowDropStore(MemoryStore):
    """A memory store whose ``drop_stream`` waits until the test lets it go on."""

    def __init__(self) -> None:
        super().__init__()
        self.dropping = asyncio.Event()
        self.go_on = asyncio.Event()

    async def drop_stream(self, session_id: str, life: str) -> None:
        self.dropping.set()
        await self.go_on.wait()
        await super().drop_stream(session_id, life)


def _upgrade_streams(upstream: Any, store: MemoryStore | None = None) -> Streams:
    settings = _settings({"upgrade_json": True, "upgrade_answer_timeout_s": 42.0})
    return make_streams(settings, upstream, store)


async def test_an_upgraded_call_waits_for_its_answer_as_long_as_the_upgrade_allows():
    upstream = _HeldUpstream()
    upstream.answer = ScriptedResponse(content_type="application/json", body=[b"{}"])
    upstream.release.set()
    streams = _upgrade_streams(upstream)
    await streams.requests.open_post(SID, CALL, b"{}", [1], upgrade_wait_s=5.0)
    await streams.requests.open_post(SID, CALL, b"{}", [2])
    assert upstream.timeouts == [42.0, None]  # None: upstream.headers_timeout_s
    assert [r[0] for r in upstream.requests] == ["POST", "POST"]
    await eventually(lambda: streams.ctx.registry.tasks == 0)


async def test_a_failure_within_the_wait_is_the_clients_error_while_the_store_drops_slowly():
    upstream = _HeldUpstream()
    store = _SlowDropStore()
    streams = _upgrade_streams(upstream, store)
    opening = asyncio.ensure_future(
        streams.requests.open_post(SID, CALL, b"{}", [1], upgrade_wait_s=0.2)
    )
    await eventually(lambda: upstream.timeouts)
    upstream.release.set()  # the upstream fails well within the wait...
    await asyncio.wait_for(store.dropping.wait(), DEADLINE_S)
    # ... and the client has its error while the store is still dropping the stream life.
    with pytest.raises(UpstreamConnectError):
        await asyncio.wait_for(opening, DEADLINE_S)
    store.go_on.set()
    await eventually(lambda: streams.ctx.registry.tasks == 0)


async def test_a_drain_that_cancels_a_committed_upgrade_still_answers_its_call():
    upstream = _HeldUpstream()  # never released: the upstream is still working on the call
    streams = _upgrade_streams(upstream)
    response, stream = await streams.requests.open_post(SID, CALL, b"{}", [1], upgrade_wait_s=0)
    assert response is None
    assert stream is not None
    cancelled = await streams.ctx.registry.close(0.0)
    assert cancelled == 1
    read = await streams.ctx.store.read(SID, stream.life, 0, 10)
    (error,) = [json.loads(e.data) for e in read.events]
    assert error["id"] == 1
    assert error["error"]["code"] == UPSTREAM_STREAM_BROKEN
    assert read.finished
    assert streams.ctx.registry.find(stream.key) is None  # released, feed closed
    late = streams.ctx.metrics.json_upgrade_late_answers.labels("cancelled")._value.get()
    assert late == 1


RESULT_1 = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {}}).encode()


@pytest.mark.parametrize(
    ("answer", "counted"),
    [
        (UpstreamConnectError("refused"), "failed"),
        (ScriptedResponse(status=502, content_type="text/html", body=[b"<html>"]), "status"),
        (ScriptedResponse(content_type="application/json", body=[RESULT_1]), "json"),
    ],
)
async def test_what_the_upstream_answers_after_the_commit_is_counted(answer: Any, counted: str):
    upstream = _HeldUpstream()
    upstream.answer = answer
    streams = _upgrade_streams(upstream)
    _, stream = await streams.requests.open_post(SID, CALL, b"{}", [1], upgrade_wait_s=0)
    assert stream is not None
    upstream.release.set()
    await eventually(lambda: streams.ctx.registry.tasks == 0)
    metrics = streams.ctx.metrics
    assert metrics.json_upgrade_late_answers.labels(counted)._value.get() == 1
    refused = metrics.upstream_errors.labels("UpstreamConnectError")._value.get()
    assert refused == (1 if counted == "failed" else 0)
    read = await streams.ctx.store.read(SID, stream.life, 0, 10)
    assert len(read.events) == 1
    assert read.finished


# Standalone re-open backoff ----------------------------------------------------------------


@pytest.mark.parametrize("failures", [0, 1, 4, 9, 1024, 10**6])
def test_the_standalone_backoff_grows_to_its_bound_for_any_count_of_failures(failures: int):
    """2**failures overflowed a float after 1,024 failures in a row (a session whose upstream
    closes every GET at once, for hours): the delay stays within its bounds for any count."""
    from mcp_sse_gateway.streams.standalone_pump import STANDALONE_BACKOFF_MAX_S, backoff_s

    base_s = 0.1
    expected = min(base_s * 2 ** min(failures, 64), STANDALONE_BACKOFF_MAX_S)
    delays = [backoff_s(base_s, failures) for _ in range(50)]
    assert all(expected * 0.5 <= d <= expected for d in delays), (expected, delays[:3])
