"""A delivery writes each event exactly as the SSE encoder does (its inline common block too)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_sse_gateway.config import Settings
from mcp_sse_gateway.event_ids import event_id, new_life
from mcp_sse_gateway.sse import SSEDecoder, encode_event
from mcp_sse_gateway.store.base import session_digest
from mcp_sse_gateway.store.memory import MemoryStore
from mcp_sse_gateway.streams.delivery import MAX_HEADS, Delivery
from mcp_sse_gateway.streams.life import StreamLife
from tests.support.fake_upstream import ListSink

_DATA = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=40),
    st.sampled_from(["", " ", '{"jsonrpc":"2.0"}', "a\nb", "a\r\nb", "\r", "x" * 3000, "é€😀"]),
)
_TYPE = st.sampled_from([None, None, "", "message", "progress", " spaced", "é"])


@settings(max_examples=200, derandomize=True, deadline=None)
@given(events=st.lists(st.tuples(_DATA, _TYPE), min_size=1, max_size=25), batch=st.integers(1, 7))
async def test_a_replay_writes_each_event_as_the_encoder_does(events, batch):
    store = MemoryStore()
    session, life = "session", new_life()
    await store.create_stream(session, life, kind="request", owner="r1")
    for data, event in events:
        await store.append(session, life, data, event)
    await store.finish(session, life)
    sink = ListSink()
    stream = StreamLife((session_digest(session), life), session, life)
    replay = Settings(store={"replay_batch_events": batch, "replay_max_passes": 100})
    delivery = Delivery(sink, store, stream, replay, cursor=0, primes=False, resuming=True)
    assert await delivery.run() == "finished"
    written = b"".join(sink.writes)
    expected = b"".join(
        encode_event(data, event=event, id=event_id(life, offset))
        for offset, (data, event) in enumerate(events, start=1)
    )
    assert written == expected
    decoded = SSEDecoder().feed(written)
    assert [(e.data, e.event, e.id) for e in decoded] == [
        (data.replace("\r\n", "\n").replace("\r", "\n"), event, event_id(life, offset))
        for offset, (data, event) in enumerate(events, start=1)
    ]


async def test_a_delivery_keeps_a_bounded_number_of_formatted_heads():
    store = MemoryStore()
    life = new_life()
    await store.create_stream("s", life, kind="request", owner="r1")
    for i in range(500):
        await store.append("s", life, "d", f"progress-{i}")  # a type per event
    await store.finish("s", life)
    sink = ListSink()
    stream = StreamLife((session_digest("s"), life), "s", life)
    replay = Settings(store={"replay_max_passes": 100})
    delivery = Delivery(sink, store, stream, replay, cursor=0, primes=False, resuming=True)
    assert await delivery.run() == "finished"
    assert len(delivery._heads) == MAX_HEADS
    assert [e.event for e in SSEDecoder().feed(b"".join(sink.writes))] == [
        f"progress-{i}" for i in range(500)
    ]
