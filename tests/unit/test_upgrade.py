"""The JSON upgrade's pieces without sockets (mcp_sse_gateway.streams.upgrade)."""

from __future__ import annotations

import json
import zlib

import pytest

from mcp_sse_gateway import jsonrpc
from mcp_sse_gateway.errors import UpstreamBroken
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
    async for chunk in json_as_events(response):
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
