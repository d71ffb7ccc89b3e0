"""The JSON upgrade (``sse.upgrade_json``) against a scripted JSON-only upstream.

What is upgraded (one request, a client that accepts SSE, a resumable session) and what is not;
statuses within ``upgrade_wait_ms`` relayed as they are, and after it as JSON-RPC error events;
the upgraded answer stored first and resumable.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from typing import Any

import pytest
from aiohttp import web

from mcp_sse_gateway import jsonrpc
from mcp_sse_gateway.event_ids import parse_event_id
from mcp_sse_gateway.web.keys import METRICS
from tests.support.sse_client import json_messages, read_events

SESSION = "sess-upgrade-1"
#: Settings of the upgrade under test: a short wait, so "late" is quick to reach.
WAIT_MS = 200
UPGRADE = {"upgrade_json": True, "upgrade_wait_ms": WAIT_MS, "keepalive_s": 0.2}


def _call(request_id: int = 7, method: str = "tools/call") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {"name": "t"}}


def _result(request_id: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text"}]}}


def _headers(accept: str = "application/json, text/event-stream", **extra: str) -> dict[str, str]:
    return {"Mcp-Session-Id": SESSION, "Accept": accept, **extra}


class JsonTool:
    """A JSON-only upstream's tool call: answers after *delay_s* with *status* (and a body)."""

    def __init__(
        self,
        delay_s: float = 0.0,
        status: int = 200,
        *,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        headers_first: bool = False,
    ) -> None:
        self.delay_s, self.status, self.body = delay_s, status, body
        self.headers = headers or {}
        self.headers_first = headers_first
        self.calls = 0
        self.finished = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        message = await request.json()
        self.calls += 1
        if "id" not in message:
            return web.Response(status=202)
        body = self.body if self.body is not None else json.dumps(_result(message["id"])).encode()
        try:
            if self.headers_first:
                # Headers now, the body when the call ends (a server that streams its JSON).
                response = web.StreamResponse(
                    status=self.status,
                    headers={"Content-Type": "application/json", **self.headers},
                )
                await response.prepare(request)
                await asyncio.sleep(self.delay_s)
                await response.write(body)
                return response
            await asyncio.sleep(self.delay_s)
            return web.Response(
                status=self.status,
                body=body,
                headers={"Content-Type": "application/json", **self.headers},
            )
        finally:
            self.finished.set()


async def _session(upstream: Any, http: Any, gw: Any, version: str = "2025-11-25") -> None:
    async def initialize(request: web.Request) -> web.StreamResponse:
        result = {
            "jsonrpc": "2.0",
            "id": 0,
            "result": {
                "protocolVersion": version,
                "capabilities": {},
                "serverInfo": {"name": "json-only", "version": "1"},
            },
        }
        return web.json_response(result, headers={"Mcp-Session-Id": SESSION})

    upstream.routes["/mcp"] = initialize
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}
    accept = {"Accept": "application/json, text/event-stream"}
    async with http.post(gw.mcp_url, json=init, headers=accept) as response:
        assert response.headers["Content-Type"].startswith("application/json")
        assert response.headers["Mcp-Session-Id"] == SESSION


async def test_a_short_call_becomes_one_stored_event(upstream, gateway, http):
    async with gateway(upstream.url, sse=UPGRADE) as gw:
        await _session(upstream, http, gw)
        upstream.routes["/mcp"] = JsonTool(headers={"X-Upstream": "kept"}).handle
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/event-stream"
        assert response.headers["X-Upstream"] == "kept"
        events, ended = await read_events(response)
        assert ended
        assert events[0].data == ""  # priming (2025-11-25)
        assert json_messages(events) == [_result(7)]
        answer = next(e for e in events if e.data)
        stored = parse_event_id(answer.id or "")
        assert stored is not None
        assert stored.offset == 1
        assert gw.app[METRICS].json_upgrades.labels("in_time")._value.get() == 1


async def test_a_long_call_gets_keepalives_and_resumes_after_a_drop(upstream, gateway, http):
    tool = JsonTool(delay_s=1.0)
    async with gateway(upstream.url, sse=UPGRADE) as gw:
        await _session(upstream, http, gw)
        upstream.routes["/mcp"] = tool.handle
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        # The stream starts after upgrade_wait_ms, long before the upstream answers.
        assert response.status == 200
        assert not tool.finished.is_set()
        events, _ = await read_events(response, until=2)
        assert events[0].data == ""
        assert "keepalive" in events[1].comments
        response.close()  # the connection drops while the upstream computes
        await asyncio.wait_for(tool.finished.wait(), 10)
        cursor = events[0].id
        assert cursor is not None
        resumed = await http.get(gw.mcp_url, headers=_headers(**{"Last-Event-ID": cursor}))
        assert resumed.status == 200
        again, ended = await read_events(resumed)
        assert ended
        assert json_messages(again) == [_result(7)]
        assert tool.calls == 1  # never sent upstream twice
        assert gw.app[METRICS].json_upgrades.labels("late")._value.get() == 1


async def test_a_compressed_json_answer_is_decoded_into_its_event(upstream, gateway, http):
    body = gzip.compress(json.dumps(_result(7), indent=2).encode())
    tool = JsonTool(body=body, headers={"Content-Encoding": "gzip"})
    async with gateway(upstream.url, sse=UPGRADE) as gw:
        await _session(upstream, http, gw)
        upstream.routes["/mcp"] = tool.handle
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        assert "Content-Encoding" not in response.headers
        events, _ = await read_events(response)
    assert json_messages(events) == [_result(7)]


@pytest.mark.parametrize("status", [401, 404, 500])
async def test_a_refusal_within_the_wait_is_relayed_as_it_is(upstream, gateway, http, status):
    body = json.dumps(jsonrpc.error_response(7, -32600, "no")).encode()
    headers = {"WWW-Authenticate": 'Bearer resource_metadata="https://x/.well-known"'}
    async with gateway(upstream.url, sse=UPGRADE) as gw:
        await _session_then(upstream, http, gw, JsonTool(status=status, body=body, headers=headers))
        async with http.post(gw.mcp_url, json=_call(), headers=_headers()) as response:
            assert response.status == status
            assert response.headers["Content-Type"].startswith("application/json")
            assert response.headers["WWW-Authenticate"] == headers["WWW-Authenticate"]
            assert await response.read() == body


@pytest.mark.parametrize("status", [401, 404, 500])
async def test_a_refusal_after_the_wait_is_a_json_rpc_error_event(upstream, gateway, http, status):
    tool = JsonTool(delay_s=WAIT_MS / 1000 * 3, status=status, body=b'{"secret": "echo"}')
    async with gateway(upstream.url, sse=UPGRADE) as gw:
        await _session_then(upstream, http, gw, tool)
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        assert response.status == 200
        events, ended = await read_events(response)
    assert ended
    (error,) = json_messages(events)
    assert error["id"] == 7
    assert error["error"]["code"] == jsonrpc.UPSTREAM_HTTP_ERROR
    assert error["error"]["data"] == {"status": status}
    assert "secret" not in json.dumps(error)


async def test_headers_within_the_wait_and_a_late_body_are_still_one_event(upstream, gateway, http):
    tool = JsonTool(delay_s=0.6, headers_first=True)
    async with gateway(upstream.url, sse=UPGRADE) as gw:
        await _session_then(upstream, http, gw, tool)
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        events, _ = await read_events(response)
    assert json_messages(events) == [_result(7)]
    assert any("keepalive" in e.comments for e in events)


async def test_an_upstream_that_cannot_be_reached_after_the_wait_gives_an_error_event(
    upstream, gateway, http
):
    async def hang_up(request: web.Request) -> web.StreamResponse:
        message = await request.json()
        if "id" not in message:
            return web.Response(status=202)
        await asyncio.sleep(WAIT_MS / 1000 * 2)
        assert request.transport is not None
        request.transport.abort()  # no status line at all
        return web.Response()

    async with gateway(upstream.url, sse=UPGRADE) as gw:
        await _session(upstream, http, gw)
        upstream.routes["/mcp"] = hang_up
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        assert response.status == 200
        events, ended = await read_events(response)
    assert ended
    (error,) = json_messages(events)
    assert error["error"]["code"] == jsonrpc.UPSTREAM_STREAM_BROKEN


async def test_a_call_longer_than_the_headers_timeout_is_still_answered(upstream, gateway, http):
    # A JSON-only server sends its headers with the answer: the upgrade waits for it.
    tool = JsonTool(delay_s=0.6)
    upstream_settings = {"headers_timeout_s": 0.3}
    async with gateway(upstream.url, sse=UPGRADE, upstream=upstream_settings) as gw:
        await _session_then(upstream, http, gw, tool)
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        events, _ = await read_events(response)
        late = gw.app[METRICS].json_upgrade_late_answers.labels("json")._value.get()
    assert json_messages(events) == [_result(7)]
    assert late == 1


async def test_a_gzip_bomb_costs_the_event_bound_and_answers_with_an_error(upstream, gateway, http):
    packer = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    bomb = packer.compress(b'{"jsonrpc": "2.0", "id": 7, "result": "' + b"a" * (64 << 20))
    bomb += packer.flush()
    tool = JsonTool(body=bomb, headers={"Content-Encoding": "gzip"})
    async with gateway(upstream.url, sse=UPGRADE, store={"max_event_bytes": 65536}) as gw:
        await _session_then(upstream, http, gw, tool)
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        events, ended = await read_events(response)
    assert ended
    (error,) = json_messages(events)
    assert error["id"] == 7
    assert error["error"]["code"] == jsonrpc.UPSTREAM_STREAM_BROKEN


@pytest.mark.parametrize(
    ("case", "message", "accept"),
    [
        ("notification", {"jsonrpc": "2.0", "method": "notifications/progress"}, None),
        ("response", {"jsonrpc": "2.0", "id": 3, "result": {}}, None),
        ("batch", [_call(1), _call(2)], None),
        ("batch of one", [_call(1)], None),
        ("json only client", _call(), "application/json"),
        ("sse refused by q=0", _call(), "application/json, text/event-stream;q=0"),
    ],
)
async def test_what_is_not_upgraded_gets_the_upstream_answer(  # noqa: PLR0917 - fixtures
    upstream, gateway, http, case, message, accept
):
    async def answer(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if isinstance(body, list):
            return web.json_response([_result(m["id"]) for m in body])
        if "id" not in body or "method" not in body:
            return web.Response(status=202)
        return web.json_response(_result(body["id"]))

    async with gateway(upstream.url, sse=UPGRADE) as gw:
        await _session(upstream, http, gw)
        upstream.routes["/mcp"] = answer
        headers = _headers(accept) if accept else _headers()
        async with http.post(gw.mcp_url, json=message, headers=headers) as response:
            body = await response.read()
    if case in {"notification", "response"}:
        assert response.status == 202
        assert body == b""
    else:
        assert response.headers["Content-Type"].startswith("application/json"), case
        assert json.loads(body)


async def test_without_the_setting_json_stays_json(upstream, gateway, http):
    async with gateway(upstream.url) as gw:
        await _session(upstream, http, gw)
        upstream.routes["/mcp"] = JsonTool(delay_s=0.3).handle
        async with http.post(gw.mcp_url, json=_call(), headers=_headers()) as response:
            assert response.headers["Content-Type"].startswith("application/json")
            assert json.loads(await response.read()) == _result(7)


async def test_an_older_session_is_upgraded_without_priming(upstream, gateway, http):
    async with gateway(upstream.url, sse=UPGRADE) as gw:
        await _session(upstream, http, gw, version="2025-03-26")
        upstream.routes["/mcp"] = JsonTool().handle
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        events, _ = await read_events(response)
    assert all(e.data for e in events if e.data is not None)
    assert json_messages(events) == [_result(7)]


async def _session_then(upstream: Any, http: Any, gw: Any, tool: JsonTool) -> None:
    await _session(upstream, http, gw)
    upstream.routes["/mcp"] = tool.handle
