"""The JSON upgrade's pieces without sockets (mcp_sse_gateway.streams.upgrade)."""

from __future__ import annotations

import json
import zlib

import pytest

from mcp_sse_gateway import jsonrpc
from mcp_sse_gateway.errors import EventTooLarge, UpstreamBroken
from mcp_sse_gateway.sse import SSEDecoder
from mcp_sse_gateway.streams.upgrade import (
    accepts_event_stream,
    json_as_events,
    status_error_events,
    upgradable,
)
from tests.support.fake_upstream import ScriptedResponse


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        ("application/json, text/event-stream", True),
        ("text/event-stream", True),
        ("TEXT/Event-Stream;q=0.5", True),
        ("application/json, text/event-stream;q=0", False),
        ("application/json, text/event-stream;q=bogus", False),
        ("application/json", False),
        ("*/*", False),
        ("text/*", False),
        ("", False),
        (None, False),
    ],
)
def test_accept_must_name_the_event_stream(accept: str | None, expected: bool) -> None:
    assert accepts_event_stream(accept) is expected


@pytest.mark.parametrize(
    ("status", "content_type", "coding", "expected"),
    [
        (200, "application/json", None, True),
        (201, "application/json", "gzip", True),
        (200, "application/json", "deflate", True),
        (200, "application/json", "br", False),
        (200, "text/html", None, False),
        (202, "application/json", None, True),
        (401, "application/json", None, False),
        (500, "application/json", None, False),
    ],
)
def test_upgradable_answers(
    status: int, content_type: str, coding: str | None, expected: bool
) -> None:
    headers = [("Content-Encoding", coding)] if coding else []
    response = ScriptedResponse(status=status, content_type=content_type, headers=headers)
    assert upgradable(response) is expected


async def _decoded(response: ScriptedResponse) -> list[str]:
    decoder = SSEDecoder(max_event_bytes=1 << 20)
    events = []
    async for chunk in json_as_events(response, max_bytes=1 << 20):
        events += decoder.feed(chunk)
    return [e.data for e in events]


async def test_a_pretty_printed_body_split_anywhere_is_one_event_of_the_same_json() -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"a": [1, 2]}}, indent=2)
    wire = body.replace("\n", "\r\n").encode()
    chunks = [wire[i : i + 3] for i in range(0, len(wire), 3)]  # CR and LF land apart
    response = ScriptedResponse(content_type="application/json", body=chunks)
    (data,) = await _decoded(response)
    assert json.loads(data) == json.loads(body)


async def test_gzip_is_decoded_and_garbage_breaks() -> None:
    body = b'{"jsonrpc": "2.0", "id": 1, "result": {}}'
    packer = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    packed = packer.compress(body) + packer.flush()
    gz = [("Content-Encoding", "gzip")]
    json_type = "application/json"
    packed_body = [packed[:5], packed[5:]]
    (data,) = await _decoded(ScriptedResponse(content_type=json_type, body=packed_body, headers=gz))
    assert json.loads(data) == json.loads(body)
    garbage = ScriptedResponse(content_type=json_type, body=[b"not gzip at all"], headers=gz)
    with pytest.raises(UpstreamBroken):
        await _decoded(garbage)


async def test_status_errors_name_each_request_and_carry_only_the_status() -> None:
    decoder = SSEDecoder(max_event_bytes=1 << 20)
    events = []
    async for chunk in status_error_events([1, "b"], 401):
        events += decoder.feed(chunk)
    errors = [json.loads(e.data) for e in events]
    assert [e["id"] for e in errors] == [1, "b"]
    assert {e["error"]["code"] for e in errors} == {jsonrpc.UPSTREAM_HTTP_ERROR}
    assert all(e["error"]["data"] == {"status": 401} for e in errors)


def _gzip(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


async def _wire(response: ScriptedResponse, max_bytes: int) -> bytes:
    return b"".join([chunk async for chunk in json_as_events(response, max_bytes=max_bytes)])


async def test_a_gzip_bomb_is_decoded_no_further_than_the_event_bound() -> None:
    bomb = _gzip(b'{"jsonrpc": "2.0", "id": 1, "result": "' + b"a" * (64 << 20) + b'"}')
    assert len(bomb) < 1 << 20
    chunks = [bomb[i : i + 4096] for i in range(0, len(bomb), 4096)]
    gz = [("Content-Encoding", "gzip")]
    response = ScriptedResponse(content_type="application/json", body=chunks, headers=gz)
    wire = await _wire(response, max_bytes=10_000)
    assert 10_000 < len(wire) <= 10_000 + 16  # the bound plus one byte, "data: " and the end
    decoder = SSEDecoder(max_event_bytes=10_000)
    with pytest.raises(EventTooLarge):
        decoder.feed(wire)


async def test_every_member_of_a_multi_member_gzip_body_is_decoded() -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"text": "x" * 5000}}).encode()
    packed = _gzip(body[:1000]) + _gzip(body[1000:3000]) + _gzip(body[3000:])
    gz = [("Content-Encoding", "gzip")]
    for size in (7, 1000, len(packed)):  # members split across chunks, or in one
        chunks = [packed[i : i + size] for i in range(0, len(packed), size)]
        response = ScriptedResponse(content_type="application/json", body=chunks, headers=gz)
        (data,) = await _decoded(response)
        assert json.loads(data) == json.loads(body)


async def test_a_truncated_gzip_body_breaks_rather_than_passing_for_a_short_answer() -> None:
    packed = _gzip(json.dumps({"jsonrpc": "2.0", "id": 1, "result": {}}).encode())
    gz = [("Content-Encoding", "gzip")]
    response = ScriptedResponse(content_type="application/json", body=[packed[:-6]], headers=gz)
    with pytest.raises(UpstreamBroken):
        await _decoded(response)


async def test_the_event_is_one_data_line_as_long_as_the_body() -> None:
    body = json.dumps({"a": ["x\ny"] * 200}, indent=4).replace("\n", "\r\n").encode()
    response = ScriptedResponse(content_type="application/json", body=[body])
    wire = await _wire(response, max_bytes=len(body))
    assert wire == b"data: " + body.replace(b"\r", b" ").replace(b"\n", b" ") + b"\n\n"
    (event,) = SSEDecoder(max_event_bytes=len(body) + 8).feed(wire)
    assert json.loads(event.data) == json.loads(body)
