"""Wire fidelity (DESIGN D3): what the upstream wrote and what the client sent, as they were.

* SSE fields the gateway keeps go out as the upstream wrote them: ``event: message`` too,
  identically on the live frame and on the replayed one;
* the client's ``Accept`` reaches the upstream exactly as sent, and none when it sent none; the
  HTTP client library adds no header of its own (``User-Agent``, ``Accept``,
  ``Accept-Encoding`` beyond the gateway's documented ``identity`` on the MCP endpoint).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from mcp_sse_gateway.web.keys import STORE
from tests.integration.test_managed import SESSION, _call, _headers, _initialize
from tests.support.sse_client import read_events

#: The upstream's frames: an explicit default type, a custom type, an empty type, none.
FRAMES = [
    ("message", {"jsonrpc": "2.0", "method": "notifications/message", "params": {"i": 0}}),
    ("custom", {"jsonrpc": "2.0", "method": "notifications/message", "params": {"i": 1}}),
    ("", {"jsonrpc": "2.0", "method": "notifications/message", "params": {"i": 2}}),
    (None, {"jsonrpc": "2.0", "id": 7, "result": {"content": []}}),
]


async def _typed_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for event, message in FRAMES:
        field = "" if event is None else (f"event: {event}\n" if event else "event:\n")
        await response.write(f"{field}data: {json.dumps(message)}\n\n".encode())
    return response


async def test_event_field_goes_out_as_written_live_and_on_replay(upstream, gateway, http):
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = _typed_stream
        live = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        live_events, ended = await read_events(live)
        assert ended
        priming = live_events[0]
        replay = await http.get(gw.mcp_url, headers=_headers(**{"Last-Event-ID": priming.id}))
        replayed_events, _ = await read_events(replay)
    live_data = [e for e in live_events if e.data]
    replayed_data = [e for e in replayed_events if e.data]
    assert [(e.event, json.loads(e.data)) for e in live_data] == FRAMES
    assert [(e.event, e.data, e.id) for e in replayed_data] == [
        (e.event, e.data, e.id) for e in live_data
    ]


async def _echo_headers(request: web.Request) -> web.StreamResponse:
    return web.json_response(
        {"jsonrpc": "2.0", "id": 7, "result": {"headers": list(request.headers.items())}}
    )


def _received(upstream, index: int = -1) -> dict[str, list[str]]:
    names: dict[str, list[str]] = {}
    for name, value in upstream.requests[index]["headers"]:
        names.setdefault(name.lower(), []).append(value)
    return names


async def test_accept_reaches_the_upstream_exactly_as_sent(upstream, gateway, http):
    odd = "application/json;q=0.9,  text/event-stream;q=0.8"
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = _echo_headers
        async with http.post(
            gw.mcp_url, json=_call(), headers={"Mcp-Session-Id": SESSION, "Accept": odd}
        ) as response:
            assert response.status == 200
        sent = _received(upstream)
        assert sent["accept"] == [odd]
        async with http.post(
            gw.mcp_url,
            json=_call(),
            headers={"Mcp-Session-Id": SESSION},
            skip_auto_headers=("Accept", "User-Agent"),
        ) as response:
            assert response.status == 200
        sent = _received(upstream)
    assert "accept" not in sent
    assert "user-agent" not in sent
    # The one header the gateway sets on the MCP endpoint itself, by design (it reads bodies).
    assert sent["accept-encoding"] == ["identity"]


async def test_no_accept_gets_the_upstreams_own_answer(upstream, gateway, http):
    async def strict(request: web.Request) -> web.StreamResponse:
        # Accepts "*/*" (what HTTP client libraries send by default), refuses no Accept at all.
        if "Accept" not in request.headers:
            return web.json_response(
                {
                    "jsonrpc": "2.0",
                    "id": None,
                    "error": {"code": -32600, "message": "Not Acceptable"},
                },
                status=406,
            )
        return await _typed_stream(request)

    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = strict
        async with http.post(
            gw.mcp_url,
            json=_call(),
            headers={"Mcp-Session-Id": SESSION},
            skip_auto_headers=("Accept",),
        ) as response:
            assert response.status == 406
            assert (await response.json())["error"]["message"] == "Not Acceptable"


async def test_other_paths_get_no_invented_headers(upstream, gateway, http):
    async with gateway(upstream.url) as gw:
        async with http.get(
            f"{gw.base_url}/.well-known/oauth-protected-resource",
            skip_auto_headers=("Accept", "User-Agent", "Accept-Encoding"),
        ) as response:
            assert response.status == 200
        sent = _received(upstream)
    for name in ("accept", "user-agent", "accept-encoding", "content-type"):
        assert name not in sent, name


async def _raw(port: int, method: str, target: str, body: bytes = b"") -> tuple[int, bytes]:
    """One request with *target* exactly as written (HTTP clients normalize paths)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = (
            f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode() + body)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


@pytest.mark.parametrize(
    "target", ["/MCP", "/mcp/", "//mcp", "/mcp;x=1", "/mcp%2F", "/Mcp/", "/%256Dcp", "/x/..//mcp"]
)
async def test_variants_of_the_mcp_path_get_400_and_reach_nothing(upstream, gateway, target):
    async with gateway(upstream.url) as gw:
        before = len(upstream.requests)
        status, body = await _raw(
            gw.port, "POST", target, b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
        )
    assert status == 400
    assert b"ambiguous path" in body
    assert target.encode() not in body  # never echoed
    assert len(upstream.requests) == before


@pytest.mark.parametrize("target", ["/a/../mcp", "/%6Dcp", "/./mcp"])
async def test_paths_that_normalize_to_the_mcp_endpoint_are_it(upstream, gateway, target):
    async def initialize(request: web.Request) -> web.StreamResponse:
        result = {"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {}}
        return web.json_response(
            {"jsonrpc": "2.0", "id": 0, "result": result}, headers={"Mcp-Session-Id": "s-norm"}
        )

    upstream.routes["/mcp"] = initialize
    async with gateway(upstream.url) as gw:
        status, _ = await _raw(
            gw.port,
            "POST",
            target,
            b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}',
        )
        # Served as the MCP endpoint: the session's version was recorded (only done there).
        record = await gw.app[STORE].get_session("s-norm")
    assert status == 200
    assert upstream.requests[-1]["path"] == "/mcp"
    assert record is not None
    assert record.protocol_version == "2025-11-25"


@pytest.mark.parametrize(
    ("target", "status"),
    [("http://127.0.0.1/MCP", 400), ("http://127.0.0.1/mcp/", 400), ("http://127.0.0.1//mcp", 400)],
)
async def test_absolute_form_targets_are_classified_by_their_path(
    upstream, gateway, target, status
):
    async with gateway(upstream.url) as gw:
        before = len(upstream.requests)
        got, body = await _raw(gw.port, "POST", target, b'{"jsonrpc":"2.0","id":1,"method":"x"}')
    assert got == status
    assert b"ambiguous path" in body
    assert len(upstream.requests) == before


async def test_a_repeated_session_id_gets_400(upstream, gateway, http):
    async with gateway(upstream.url) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(
            b"DELETE /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nMcp-Session-Id: victim\r\n"
            b"Mcp-Session-Id: attacker\r\nConnection: close\r\n\r\n"
        )
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    assert answer.startswith(b"HTTP/1.1 400")
    assert b"victim" not in answer
    assert not upstream.requests
