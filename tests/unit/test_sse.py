"""SSE codec: WHATWG HTML §9.2.5/§9.2.6 decoding, encoding, chunking, bounds, round trips."""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcp_sse_gateway import sse
from mcp_sse_gateway.errors import EventTooLarge, InvalidSSEField, SSEError
from mcp_sse_gateway.sse import (
    ServerSentEvent,
    SSEDecoder,
    encode,
    encode_comment,
    encode_event,
    encode_priming,
    encode_retry,
)

E = ServerSentEvent
BOM = b"\xef\xbb\xbf"


def decode_all(wire: bytes, chunks: list[bytes] | None = None) -> tuple[list[E], SSEDecoder]:
    decoder = SSEDecoder()
    events: list[E] = []
    for chunk in [wire] if chunks is None else chunks:
        events += decoder.feed(chunk)
    assert decoder.end() == []
    return events, decoder


def normalised(ev: E) -> E:
    if ev.data is None:
        return ev
    return E(ev.data.replace("\r\n", "\n").replace("\r", "\n"), ev.event, ev.id, ev.retry)


# --- A literal transcription of the spec, the oracle of the differential tests -------------


def reference_decode(wire: bytes) -> tuple[list[E], str, int]:
    """WHATWG §9.2.5/§9.2.6 on a whole stream, written for clarity, not speed."""
    text = wire.decode("utf-8", "replace")  # UTF-8 decode; then one leading BOM is stripped
    text = text.removeprefix("\ufeff")
    lines = re.split("\r\n|\r|\n", text)[:-1]  # the last item lacks a line end: discarded
    events: list[E] = []
    data = ""  # the data buffer; the event type buffer is block_event
    has_data = False
    last_id_buffer = last_id = ""
    block_id: str | None = None
    block_event: str | None = None
    retry: int | None = None
    comments = 0
    for line in lines:
        if line == "":
            last_id = last_id_buffer
            if has_data or block_event is not None or block_id is not None or retry is not None:
                events.append(E(data[:-1] if has_data else None, block_event, block_id, retry))
            data = ""
            has_data = False
            block_id = block_event = retry = None
            continue
        if line.startswith(":"):
            comments += 1
            continue
        name, colon, value = line.partition(":")  # no colon: the whole line names the field
        value = value.removeprefix(" ") if colon else ""
        if name == "event":
            block_event = value
        elif name == "data":
            data += value + "\n"
            has_data = True
        elif name == "id":
            if "\0" not in value:
                last_id_buffer = block_id = value
        elif name == "retry" and value and all(c in "0123456789" for c in value):
            retry = int(value) if len(value) <= 4000 else retry  # int()'s digit limit
    return events, last_id, comments


# --- Golden wire tests ----------------------------------------------------------------------

GOLDEN: list[tuple[str, bytes, list[E], str]] = [
    ("lf", b"data: a\n\n", [E("a")], ""),
    ("cr", b"data: a\r\r", [E("a")], ""),
    ("crlf", b"data: a\r\n\r\n", [E("a")], ""),
    ("mixed", b"data: a\rdata: b\r\ndata: c\n\r\n", [E("a\nb\nc")], ""),
    ("cr-then-lf-is-two-ends", b"data: a\r\n\rdata: b\n\n", [E("a"), E("b")], ""),
    ("lf-cr-is-two-ends", b"data: a\n\rdata: b\n\n", [E("a"), E("b")], ""),
    ("multi-line", b"data: a\ndata: b\ndata: c\n\n", [E("a\nb\nc")], ""),
    ("trailing-empty-data", b"data: a\ndata\n\n", [E("a\n")], ""),
    ("leading-empty-data", b"data\ndata: a\n\n", [E("\na")], ""),
    ("two-blocks", b"data: 1\n\ndata: 2\n\n", [E("1"), E("2")], ""),
    ("comment-only", b": hello\n\n", [], ""),
    ("bare-colon-comment", b":\n\n", [], ""),
    ("comments-inside", b": c\ndata: x\n:c2\n\n", [E("x")], ""),
    ("bom", BOM + b"data: a\n\n", [E("a")], ""),
    ("second-bom-is-text", BOM + BOM + b"data: a\n\n", [], ""),
    ("bom-in-value-kept", BOM + b"data: " + BOM + b"a\n\n", [E("\ufeffa")], ""),
    ("bom-later-kept", b"data: a\n\n" + BOM + b"data: b\n\n", [E("a")], ""),
    ("data-no-colon", b"data\n\n", [E("")], ""),
    ("data-colon", b"data:\n\n", [E("")], ""),
    ("data-colon-space", b"data: \n\n", [E("")], ""),
    ("no-space", b"data:a\n\n", [E("a")], ""),
    ("one-space-removed", b"data:  a\n\n", [E(" a")], ""),
    ("only-spaces", b"data:   \n\n", [E("  ")], ""),
    ("tab-kept", b"data:\ta\n\n", [E("\ta")], ""),
    ("space-before-colon", b"data : a\n\n", [], ""),
    ("colon-in-value", b"data: a: b\n\n", [E("a: b")], ""),
    ("unknown-field", b"foo: bar\n\n", [], ""),
    ("unknown-field-no-colon", b"foo\n\n", [], ""),
    ("unknown-among-known", b"foo: bar\ndata: x\nbaz\n\n", [E("x")], ""),
    ("field-names-case-sensitive", b"Data: x\nID: 1\nEvent: e\nRetry: 5\n\n", [], ""),
    ("event", b"event: add\ndata: 1\n\n", [E("1", event="add")], ""),
    ("event-empty", b"event\ndata\n\n", [E("", event="")], ""),
    ("event-last-wins", b"event: a\nevent: b\ndata: 1\n\n", [E("1", event="b")], ""),
    ("event-without-data", b"event: x\n\n", [E(event="x")], ""),
    ("event-not-carried-over", b"event: a\ndata: 1\n\ndata: 2\n\n", [E("1", "a"), E("2")], ""),
    ("retry", b"retry: 1500\n\n", [E(retry=1500)], ""),
    ("retry-zero-leading", b"retry: 007\n\n", [E(retry=7)], ""),
    ("retry-not-digits", b"retry: 15a\n\n", [], ""),
    ("retry-negative", b"retry: -1\n\n", [], ""),
    ("retry-decimal", b"retry: 1.5\n\n", [], ""),
    ("retry-empty", b"retry:\n\n", [], ""),
    ("retry-two-spaces", b"retry:  10\n\n", [], ""),
    ("retry-non-ascii-digit", "retry: \u0663\n\n".encode(), [], ""),
    ("retry-fullwidth-digit", "retry: \uff11\n\n".encode(), [], ""),
    ("retry-invalid-keeps-valid", b"retry: 10\nretry: x\n\n", [E(retry=10)], ""),
    ("retry-huge-ignored", b"retry: " + b"9" * 5000 + b"\n\n", [], ""),
    ("retry-with-data", b"retry: 5\ndata: x\n\n", [E("x", retry=5)], ""),
    ("id", b"id: 7\ndata: x\n\n", [E("x", id="7")], "7"),
    ("id-with-nul-ignored", b"id: a\x00b\ndata: x\n\n", [E("x")], ""),
    ("id-nul-keeps-earlier", b"id: 1\nid: 2\x00\ndata: x\n\n", [E("x", id="1")], "1"),
    ("id-nul-alone-not-yielded", b"id: \x00\n\n", [], ""),
    ("id-persists", b"id: 1\ndata: a\n\ndata: b\n\n", [E("a", id="1"), E("b")], "1"),
    ("id-only-block", b"id: 1\n\n", [E(id="1")], "1"),
    ("id-empty-resets", b"id: 1\n\nid\n\n", [E(id="1"), E(id="")], ""),
    ("id-last-wins", b"id: 1\nid: 2\ndata\n\n", [E("", id="2")], "2"),
    ("id-utf8", "id: é✓\ndata: x\n\n".encode(), [E("x", id="é✓")], "é✓"),
    ("incomplete-at-eof", b"data: a\n\ndata: b\n", [E("a")], ""),
    ("incomplete-line-at-eof", b"data: a", [], ""),
    ("incomplete-id-not-taken", b"id: 1\ndata: a\n\nid: 2\ndata: b\n", [E("a", id="1")], "1"),
    ("empty-blocks", b"\n\n\n\r\n\r\r", [], ""),
    ("empty-lines-between", b"data: a\n\n\n\ndata: b\n\n", [E("a"), E("b")], ""),
    ("invalid-utf8-replaced", b"data: \xff\xfe\n\n", [E("\ufffd\ufffd")], ""),
    ("truncated-utf8-before-eol", b"data: \xf0\x9f\n\n", [E("\ufffd")], ""),
    ("nul-in-data-kept", b"data: a\x00b\n\n", [E("a\x00b")], ""),
    ("non-ascii", "data: ünïcødé 漢字 😀\n\n".encode(), [E("ünïcødé 漢字 😀")], ""),
    (
        "other-line-breaks-are-text",
        "data: a\x0bb\x0cc\x85d\u2028e\n\n".encode(),
        [E("a\x0bb\x0cc\x85d\u2028e")],
        "",
    ),
    ("priming", b"id: s-0\nretry: 1000\ndata:\n\n", [E("", id="s-0", retry=1000)], "s-0"),
]


@pytest.mark.parametrize(
    ("wire", "expected", "last_id"), [g[1:] for g in GOLDEN], ids=[g[0] for g in GOLDEN]
)
def test_golden_wire(wire: bytes, expected: list[E], last_id: str) -> None:
    events, decoder = decode_all(wire)
    assert events == expected
    assert decoder.last_event_id == last_id


@pytest.mark.parametrize(
    ("wire", "expected", "last_id"), [g[1:] for g in GOLDEN], ids=[g[0] for g in GOLDEN]
)
def test_golden_wire_byte_by_byte_and_reference(
    wire: bytes, expected: list[E], last_id: str
) -> None:
    events, decoder = decode_all(wire, [wire[i : i + 1] for i in range(len(wire))])
    assert events == expected
    assert decoder.last_event_id == last_id
    assert reference_decode(wire)[:2] == (expected, last_id)


def test_dispatches_only_with_data() -> None:
    assert E("").dispatches
    assert E("x", event="e").dispatches
    assert not E(id="1").dispatches
    assert not E(event="e", retry=5).dispatches


def test_decoded_events_are_ordinary_frozen_events() -> None:
    (ev,) = SSEDecoder().feed(b"event: e\nid: 1\nretry: 2\ndata: x\n\n")
    assert type(ev) is E
    assert ev == E("x", "e", "1", 2)
    assert hash(ev) == hash(E("x", "e", "1", 2))
    assert repr(ev) == repr(E("x", "e", "1", 2))
    with pytest.raises(AttributeError):
        ev.data = "y"  # type: ignore[misc]
    assert ev.dispatches
    assert not E(None, "e").dispatches


@pytest.mark.parametrize(
    ("line", "event"),
    [
        (b"event: message", "message"),  # the decoder's short-cut
        (b"event:message", "message"),
        (b"event: message ", "message "),
        (b"event: messages", "messages"),
        (b"event:  message", " message"),
        (b"event: Message", "Message"),
    ],
)
def test_the_common_event_line_decodes_like_any_other(line: bytes, event: str) -> None:
    wire = line + b"\ndata: x\n\n"
    assert SSEDecoder().feed(wire) == [E("x", event)]
    assert reference_decode(wire)[0] == [E("x", event)]


def test_comments_are_counted() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b": keepalive\n\n:\n\ndata: x\n: inside\n\n") == [E("x")]
    assert decoder.comments == 3
    assert decoder.feed(b": ka") == []
    assert decoder.comments == 3  # a partial line is not a line yet
    assert decoder.feed(b"\n") == []
    assert decoder.comments == 4


def test_blocks_are_returned_as_soon_as_complete() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n") == []
    assert decoder.feed(b"\n") == [E("a")]
    assert decoder.feed(b"data: b\r") == []
    assert decoder.feed(b"\r") == [E("b")]  # a lone CR ends the block at once
    assert decoder.feed(b"\ndata: c\n\n") == [E("c")]  # that LF was a new empty line


def test_cr_at_chunk_end_then_lf_is_one_line_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\n") == []  # the LF of the CRLF, not an empty line
    assert decoder.feed(b"data: b\r\n\r") == [E("a\nb")]
    assert decoder.feed(b"\n") == []
    assert decoder.feed(b"\n") == []  # a real empty line, but no block is pending
    assert decoder.feed(b"data: c\r") == []
    assert decoder.feed(b"") == []  # an empty chunk in between changes nothing
    assert decoder.feed(b"\ndata: d\n\n") == [E("c\nd")]


def test_last_event_id_persists_across_end() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"id: 41\ndata: x\n\nid: 42\ndata: cut")
    assert decoder.last_event_id == "41"
    assert decoder.end() == []
    assert decoder.last_event_id == "41"
    # A new stream (a reconnection): the BOM is stripped again, no half block leaks.
    assert decoder.feed(BOM + b"data: y\n\n") == [E("y")]
    assert decoder.last_event_id == "41"


def test_end_discards_pending_state() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"event: e\nretry: 5\ndata: a\n")
    decoder.end()
    assert decoder.feed(b"data: b\n\n") == [E("b")]


def test_id_buffer_updates_before_dispatch_in_same_block() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"id: 1\ndata: a\n") == []
    assert decoder.last_event_id == ""  # taken only when the block completes
    assert decoder.feed(b"\n") == [E("a", id="1")]
    assert decoder.last_event_id == "1"


# --- Chunking ---------------------------------------------------------------------------------

MIXED_STREAM = (
    BOM
    + b": hello\r\n"
    + b"id: 1\r\nevent: greet\r\ndata: caf\xc3\xa9 \xf0\x9f\x98\x80\r\n\r\n"
    + "data: 漢字かな\rdata: second 🎉\r\r".encode()
    + b"retry: 250\n\n"
    + b"id: \xe2\x9c\x93\ndata\ndata:  spaced\r\n\r\n"
    + b"data: tail without end"
)
MIXED_EXPECTED = [
    E("café 😀", event="greet", id="1"),
    E("漢字かな\nsecond 🎉"),
    E(retry=250),
    E("\n spaced", id="✓"),
]


def test_mixed_stream_whole() -> None:
    events, decoder = decode_all(MIXED_STREAM)
    assert events == MIXED_EXPECTED
    assert decoder.last_event_id == "✓"
    assert decoder.comments == 1
    assert reference_decode(MIXED_STREAM) == (MIXED_EXPECTED, "✓", 1)


def test_mixed_stream_cut_at_every_boundary() -> None:
    for cut in range(len(MIXED_STREAM) + 1):
        events, decoder = decode_all(MIXED_STREAM, [MIXED_STREAM[:cut], MIXED_STREAM[cut:]])
        assert events == MIXED_EXPECTED, cut
        assert decoder.last_event_id == "✓"


def test_mixed_stream_cut_at_every_pair_of_boundaries() -> None:
    n = len(MIXED_STREAM)
    for a in range(n + 1):
        for b in range(a, n + 1, 3):
            chunks = [MIXED_STREAM[:a], MIXED_STREAM[a:b], MIXED_STREAM[b:]]
            assert decode_all(MIXED_STREAM, chunks)[0] == MIXED_EXPECTED, (a, b)


def test_mixed_stream_byte_by_byte() -> None:
    chunks = [MIXED_STREAM[i : i + 1] for i in range(len(MIXED_STREAM))]
    events, decoder = decode_all(MIXED_STREAM, chunks)
    assert events == MIXED_EXPECTED
    assert decoder.comments == 1


@pytest.mark.parametrize("prefix", [b"\xef", b"\xef\xbb", b"\xef\xbb\xbe", b"\xbb\xbf"])
def test_bom_lookalikes_are_not_stripped(prefix: bytes) -> None:
    wire = prefix + b"\ndata: x\n\n"
    for cut in range(len(wire) + 1):
        events, _ = decode_all(wire, [wire[:cut], wire[cut:]])
        assert events == [E("x")]  # the first line is garbage (an unknown field), then x
        assert events == reference_decode(wire)[0]


def test_bytearray_chunks_are_accepted() -> None:
    events, _ = decode_all(b"", [bytearray(b"id: 1\nretry: 3\ndata: a"), bytearray(b"\n\n")])
    assert events == [E("a", id="1", retry=3)]


# --- Encoder ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("encoded", "wire"),
    [
        (encode_event("hi"), b"data: hi\n\n"),
        (encode_event(""), b"data:\n\n"),
        (encode_event(" x"), b"data:  x\n\n"),
        (encode_event("a\nb"), b"data: a\ndata: b\n\n"),
        (encode_event("a\r\nb\rc"), b"data: a\ndata: b\ndata: c\n\n"),
        (encode_event("a\n"), b"data: a\ndata:\n\n"),
        (encode_event("\n"), b"data:\ndata:\n\n"),
        (encode_event("a\n\r\nb"), b"data: a\ndata:\ndata: b\n\n"),
        (encode_event("é 😀"), "data: é 😀\n\n".encode()),
        (
            encode_event("x", event="e", id="7", retry_ms=100),
            b"event: e\nid: 7\nretry: 100\ndata: x\n\n",
        ),
        (encode_event("x", id=""), b"id:\ndata: x\n\n"),
        (encode_event("x", event=""), b"event:\ndata: x\n\n"),
        (encode_event("x", id=" 1"), b"id:  1\ndata: x\n\n"),
        (encode_event("a\nb", retry_ms=0), b"retry: 0\ndata: a\ndata: b\n\n"),
        (encode_comment(), b":\n\n"),
        (encode_comment("keepalive"), b": keepalive\n\n"),
        (encode_retry(3000), b"retry: 3000\n\n"),
        (encode_retry(0), b"retry: 0\n\n"),
        (encode_priming("abc", 1000), b"id: abc\nretry: 1000\ndata:\n\n"),
        (encode_priming("abc", None), b"id: abc\ndata:\n\n"),
        (encode(E("x")), b"data: x\n\n"),
        (encode(E(id="5")), b"id: 5\n\n"),
        (encode(E(event="e", retry=1)), b"event: e\nretry: 1\n\n"),
        (encode(E("", "t", "i", 2)), b"event: t\nid: i\nretry: 2\ndata:\n\n"),
        (encode(E()), b""),
    ],
)
def test_encoder_golden(encoded: bytes, wire: bytes) -> None:
    assert encoded == wire


def test_priming_event_decodes_as_dispatched_empty_data() -> None:
    (ev,) = decode_all(encode_priming("s1-0", 500))[0]
    assert ev == E("", id="s1-0", retry=500)
    assert ev.dispatches


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\r\nb", "a\x00b", "\n", "\r", "\x00", "x\n"])
@pytest.mark.parametrize("field", ["id", "event"])
def test_encoder_refuses_line_breaks_and_nul_in_id_and_event(field: str, bad: str) -> None:
    with pytest.raises(InvalidSSEField):
        encode_event("x", **{field: bad})
    with pytest.raises(InvalidSSEField):
        encode(E("x", **{field: bad}))
    with pytest.raises(InvalidSSEField):
        encode(E(**{field: bad}))
    if field == "id":
        with pytest.raises(InvalidSSEField):
            encode_priming(bad, None)


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "\r\n", "x\n"])
def test_encoder_refuses_line_breaks_in_comments(bad: str) -> None:
    with pytest.raises(InvalidSSEField) as info:
        encode_comment(bad)
    assert isinstance(info.value, SSEError)
    assert isinstance(info.value, ValueError)


def test_lone_surrogates_are_refused() -> None:
    with pytest.raises(UnicodeEncodeError):
        encode_event("\ud800")
    with pytest.raises(ValueError):
        encode_event("x", id="\udfff")


def test_comment_may_hold_colons_and_nul() -> None:
    assert encode_comment("a: b\x00") == b": a: b\x00\n\n"


@pytest.mark.parametrize("bad", [-1, True, False, 1.5, "5"])
def test_retry_must_be_a_non_negative_int(bad: object) -> None:
    with pytest.raises(ValueError, match="retry_ms"):
        encode_retry(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="retry_ms"):
        encode_event("x", retry_ms=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="retry_ms"):
        encode_priming("1", bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="retry_ms"):
        encode(E("x", retry=bad))  # type: ignore[arg-type]


def test_retry_none_is_refused_where_required() -> None:
    with pytest.raises(ValueError, match="retry_ms"):
        encode_retry(None)  # type: ignore[arg-type]


def test_encoder_error_messages_do_not_echo_values() -> None:
    with pytest.raises(InvalidSSEField) as info:
        encode_event("x", id="SECRET\nevent: forged")
    assert "SECRET" not in str(info.value)


# --- Round trips (hypothesis) -----------------------------------------------------------------

field_text = st.text(
    alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\r\n\x00"), max_size=20
)
data_text = st.one_of(
    st.text(max_size=40),
    st.lists(
        st.sampled_from(["a", " ", "\r", "\n", "\r\n", "é", "😀", ":", "\x00", "\ufeff"]),
        max_size=20,
    ).map("".join),
)
events_st = st.builds(
    E,
    data=st.none() | data_text,
    event=st.none() | field_text,
    id=st.none() | field_text,
    retry=st.none() | st.integers(min_value=0, max_value=2**63),
).filter(lambda ev: (ev.data, ev.event, ev.id, ev.retry) != (None, None, None, None))


def split_at(wire: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(wire) + 1) for c in cuts})
    bounds = [0, *points, len(wire)]
    return [wire[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    events=st.lists(events_st, max_size=8),
    cuts=st.lists(st.integers(0, 10_000), max_size=12),
    bom=st.booleans(),
    keepalives=st.booleans(),
)
def test_encode_then_decode_round_trips(
    events: list[E], cuts: list[int], bom: bool, keepalives: bool
) -> None:
    parts = [encode(ev) for ev in events]
    if keepalives:
        parts = [p for ev in parts for p in (encode_comment("keepalive"), ev)]
    wire = (BOM if bom else b"") + b"".join(parts)
    decoded, decoder = decode_all(wire, split_at(wire, cuts))
    assert decoded == [normalised(ev) for ev in events]
    ids = [ev.id for ev in events if ev.id is not None]
    assert decoder.last_event_id == (ids[-1] if ids else "")
    assert decoder.comments == (len(events) if keepalives else 0)


@given(
    data=data_text,
    event=st.none() | field_text,
    ident=st.none() | field_text,
    retry=st.none() | st.integers(min_value=0, max_value=10**12),
)
def test_encode_event_round_trips(
    data: str, event: str | None, ident: str | None, retry: int | None
) -> None:
    wire = encode_event(data, event=event, id=ident, retry_ms=retry)
    assert wire == encode(E(data, event, ident, retry))
    assert decode_all(wire)[0] == [normalised(E(data, event, ident, retry))]


TOKENS = [
    b"data",
    b"id",
    b"event",
    b"retry",
    b"foo",
    b":",
    b": ",
    b" ",
    b"  ",
    b"\n",
    b"\r",
    b"\r\n",
    b"\n\n",
    b"x",
    b"12",
    b"\x00",
    BOM,
    b"\xef\xbb",
    b"\xf0\x9f\x98\x80",
    "漢".encode(),
    b"\xff",
    b"\xc3",
    b"\t",
    b"data: ",
    b"id: ",
    b"retry: ",
]


@settings(max_examples=500)
@given(
    tokens=st.lists(st.sampled_from(TOKENS), max_size=40),
    cuts=st.lists(st.integers(0, 10_000), max_size=10),
)
def test_decoder_matches_spec_reference_on_any_stream(tokens: list[bytes], cuts: list[int]) -> None:
    wire = b"".join(tokens)
    expected, last_id, comments = reference_decode(wire)
    for chunks in (None, split_at(wire, cuts), [wire[i : i + 1] for i in range(len(wire))]):
        events, decoder = decode_all(wire, chunks)
        assert events == expected
        assert decoder.last_event_id == last_id
        assert decoder.comments == comments


@settings(max_examples=200)
@given(wire=st.binary(max_size=200), cuts=st.lists(st.integers(0, 10_000), max_size=10))
def test_decoder_matches_spec_reference_on_random_bytes(wire: bytes, cuts: list[int]) -> None:
    expected, last_id, _ = reference_decode(wire)
    events, decoder = decode_all(wire, split_at(wire, cuts))
    assert events == expected
    assert decoder.last_event_id == last_id


# --- Large events and the size bound ----------------------------------------------------------

MB = 1 << 20


def test_eight_megabyte_single_line_event_in_small_chunks() -> None:
    payload = b"0123456789abcdef" * (8 * MB // 16)
    wire = b"id: big\ndata: " + payload + b"\n\ndata: after\n\n"
    decoder = SSEDecoder(max_event_bytes=9 * MB)
    events: list[E] = []
    for i in range(0, len(wire), 4096):
        events += decoder.feed(wire[i : i + 4096])
    assert [len(ev.data or "") for ev in events] == [len(payload), 5]
    assert events[0].data == payload.decode()
    assert events[0].id == "big"
    assert events[1] == E("after")


def test_eight_megabyte_many_line_event_in_small_chunks() -> None:
    line = "€" * 300  # 900 bytes: chunk cuts fall inside characters and CRLFs
    wire = b"".join([b"data: " + line.encode() + b"\r\n"] * (8 * MB // 908)) + b"\r\n"
    decoder = SSEDecoder()
    events: list[E] = []
    for i in range(0, len(wire), 4096):
        events += decoder.feed(wire[i : i + 4096])
    assert len(events) == 1
    assert events[0].data == "\n".join([line] * (8 * MB // 908))


def test_many_small_events_in_one_chunk() -> None:
    wire = b"".join(encode_event(f"{i}", id=str(i)) for i in range(50_000))
    events, decoder = decode_all(wire)
    assert [ev.data for ev in events] == [str(i) for i in range(50_000)]
    assert decoder.last_event_id == "49999"


def test_event_too_large_by_complete_lines() -> None:
    # "data: abc" + one byte of line end = 10 bytes.
    assert SSEDecoder(max_event_bytes=10).feed(b"data: abc\n\n") == [E("abc")]
    with pytest.raises(EventTooLarge):
        SSEDecoder(max_event_bytes=9).feed(b"data: abc\n\n")
    with pytest.raises(EventTooLarge):
        SSEDecoder(max_event_bytes=9).feed(b"data: abc\r\n\r\n")


def test_event_too_large_counts_the_whole_block_across_chunks() -> None:
    decoder = SSEDecoder(max_event_bytes=30)
    assert decoder.feed(b"data: 0123456789\n") == []  # 17 bytes
    with pytest.raises(EventTooLarge):
        decoder.feed(b": comments count too\n")  # + 21 bytes


def test_event_too_large_spread_over_lines_and_chunks() -> None:
    decoder = SSEDecoder(max_event_bytes=40)
    assert decoder.feed(b"data: 0123456789\n") == []  # 17 bytes
    assert decoder.feed(b"data: 0123456789\n") == []  # 34 bytes
    with pytest.raises(EventTooLarge):
        decoder.feed(b"data: 0123456789\n")  # 51 bytes


def test_bound_is_per_block() -> None:
    decoder = SSEDecoder(max_event_bytes=23)
    wire = b"".join(encode_event("0123456789", id="1") for _ in range(100))  # 6 + 17 bytes each
    assert len(decoder.feed(wire)) == 100


def test_event_too_large_by_a_line_without_line_end() -> None:
    decoder = SSEDecoder(max_event_bytes=64)
    assert decoder.feed(b"data: " + b"x" * 50) == []
    with pytest.raises(EventTooLarge) as info:
        decoder.feed(b"SECRET" * 3)  # still no line end
    assert "SECRET" not in str(info.value)
    assert "x" * 5 not in str(info.value)


def test_event_too_large_by_pending_line_after_complete_lines() -> None:
    decoder = SSEDecoder(max_event_bytes=30)
    with pytest.raises(EventTooLarge):
        decoder.feed(b"data: 0123456789\ndata: 0123456789")  # 17 + 16 pending


def test_event_too_large_breaks_the_decoder_until_end() -> None:
    decoder = SSEDecoder(max_event_bytes=8)
    decoder.feed(b"id: 1\n\n")  # 6 bytes
    with pytest.raises(EventTooLarge):
        decoder.feed(b"data: 0123456789")
    with pytest.raises(EventTooLarge):
        decoder.feed(b"\n\n")  # the rest of the oversized block is never parsed as events
    assert decoder.end() == []
    assert decoder.last_event_id == "1"
    assert decoder.feed(b"data: k\n\n") == [E("k")]  # 8 bytes: at the bound, fine


def test_unbounded_by_default() -> None:
    wire = b"data: " + b"y" * (3 * MB) + b"\n\n"
    assert decode_all(wire)[0] == [E("y" * (3 * MB))]


# --- Purity -----------------------------------------------------------------------------------


#: Every module of the codec package: its ``__init__`` and each submodule, as found on disk.
SSE_SOURCES = sorted(Path(sse.__file__).parent.glob("*.py"))


def _imported_names(source: Path) -> set[str]:
    """Dotted names a module imports: ``from a.b import c`` gives ``a.b.c``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = f"mcp_sse_gateway.sse.{node.module or ''}" if node.level else node.module
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def test_sans_io_check_covers_the_codec_modules() -> None:
    assert {source.stem for source in SSE_SOURCES} >= {"__init__", "decoder", "encoder", "event"}


@pytest.mark.parametrize("source", SSE_SOURCES, ids=lambda source: source.stem)
def test_module_is_sans_io(source: Path) -> None:
    imported = _imported_names(source)
    ours = {name for name in imported if name.split(".")[0] == "mcp_sse_gateway"}
    assert {name.split(".")[0] for name in imported - ours} <= {
        "__future__",
        "contextlib",
        "sys",
        "typing",
    }
    # Of the project, only the codec itself and its exceptions: never web, store or streams.
    allowed = ("mcp_sse_gateway.sse.", "mcp_sse_gateway.errors.")
    assert all(name.startswith(allowed) for name in ours), ours


def test_too_large_keeps_the_blocks_completed_before_it():
    decoder = SSEDecoder(max_event_bytes=100)
    with pytest.raises(EventTooLarge) as caught:
        decoder.feed(b"data: one\n\nid: 2\ndata: two\n\ndata: " + b"x" * 500 + b"\n\n")
    assert [e.data for e in caught.value.events] == ["one", "two"]
    assert caught.value.events[1].id == "2"
    assert "x" * 10 not in str(caught.value)
