"""The JSON upgrade at its edges: long silent calls, odd bodies, bounds, drains.

Against the scripted JSON-only upstream of :mod:`tests.integration.test_json_upgrade` (its
helpers), on the store under test (memory, or Redis with ``GATEWAY_TEST_STORE=redis``).
"""

from __future__ import annotations

import asyncio
import json
import zlib

import pytest
from aiohttp import web

from mcp_sse_gateway import jsonrpc
from mcp_sse_gateway.web.app import drain
from tests.integration.test_json_upgrade import (
    UPGRADE,
    JsonTool,
    _call,
    _headers,
    _result,
    _session,
    _session_then,
)
from tests.support.sse_client import json_messages, read_events
from tests.support.waiting import eventually


async def test_a_call_silent_for_longer_than_the_session_idle_ttl_is_still_answered(
    upstream, gateway, http
):
    # The client reads the local feed and nothing is appended while the tool works: the pump
    # keeps the session and its streams in the store (on Redis they would expire otherwise).
    tool = JsonTool(delay_s=3.0)
    settings = {"sse": {**UPGRADE, "upgrade_answer_timeout_s": 30}}
    async with gateway(upstream.url, store={"session_idle_ttl_s": 1.2}, **settings) as gw:
        await _session_then(upstream, http, gw, tool)
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        events, ended = await read_events(response, timeout_s=15)
    assert ended
    assert json_messages(events) == [_result(7)]


@pytest.mark.parametrize("wbits", [zlib.MAX_WBITS, -zlib.MAX_WBITS], ids=["zlib", "raw"])
async def test_deflate_is_read_wrapped_or_raw_as_http_clients_do(upstream, gateway, http, wbits):
    packer = zlib.compressobj(wbits=wbits)
    body = packer.compress(json.dumps(_result(7)).encode()) + packer.flush()
    tool = JsonTool(body=body, headers={"Content-Encoding": "deflate"})
    async with gateway(upstream.url, sse=UPGRADE) as gw:
        await _session_then(upstream, http, gw, tool)
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        events, _ = await read_events(response)
    assert json_messages(events) == [_result(7)]


async def test_a_body_with_a_byte_order_mark_is_the_same_json(upstream, gateway, http):
    tool = JsonTool(body=b"\xef\xbb\xbf" + json.dumps(_result(7)).encode())
    async with gateway(upstream.url, sse=UPGRADE) as gw:
        await _session_then(upstream, http, gw, tool)
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        events, _ = await read_events(response)
    assert json_messages(events) == [_result(7)]


@pytest.mark.parametrize("over", [0, 1])
async def test_the_event_bound_is_the_bodys(upstream, gateway, http, over):
    limit = 4096
    head, tail = b'{"jsonrpc": "2.0", "id": 7, "result": {"t": "', b'"}}'
    body = head + b"a" * (limit + over - len(head) - len(tail)) + tail
    tool = JsonTool(body=body)
    async with gateway(upstream.url, sse=UPGRADE, store={"max_event_bytes": limit}) as gw:
        await _session_then(upstream, http, gw, tool)
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        events, _ = await read_events(response)
    (message,) = json_messages(events)
    if over:
        assert message["error"]["code"] == jsonrpc.UPSTREAM_STREAM_BROKEN
    else:
        assert message == json.loads(body)


@pytest.mark.parametrize(
    "prefix", [b"\xef\xbb\xbf", b"\r\n "], ids=["byte order mark", "whitespace"]
)
async def test_a_batch_of_one_is_never_upgraded(upstream, gateway, http, prefix):
    async def answer(request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        if isinstance(body, list):
            return web.json_response([_result(m["id"]) for m in body])
        return web.json_response(_result(body["id"]))

    async with gateway(upstream.url, sse=UPGRADE) as gw:
        await _session(upstream, http, gw)
        upstream.routes["/mcp"] = answer
        data = prefix + json.dumps([_call(1)]).encode()
        headers = {**_headers(), "Content-Type": "application/json"}
        async with http.post(gw.mcp_url, data=data, headers=headers) as response:
            assert response.headers["Content-Type"].startswith("application/json")
            assert await response.json() == [_result(1)]


@pytest.mark.parametrize("upgrade", [True, False], ids=["upgraded", "not upgraded"])
async def test_a_drain_that_ends_before_the_upstream_answered_is_a_503(
    upstream, gateway, http, upgrade
):
    tool = JsonTool(delay_s=30)
    sse = {**UPGRADE, "upgrade_wait_ms": 5000} if upgrade else {}
    async with gateway(upstream.url, sse=sse, server={"drain_timeout_s": 0.3}) as gw:
        await _session_then(upstream, http, gw, tool)
        post = asyncio.ensure_future(http.post(gw.mcp_url, json=_call(), headers=_headers()))
        await eventually(lambda: tool.calls == 1)
        await drain(gw.app)
        response = await asyncio.wait_for(post, 10)
        body = await response.json()
    assert response.status == 503
    assert "Retry-After" in response.headers
    assert body["error"]["code"] == jsonrpc.UPSTREAM_UNAVAILABLE


@pytest.mark.parametrize("headers_after_s", [0.0, 0.5], ids=["within the wait", "after it"])
async def test_the_answer_timeout_bounds_a_json_body_that_never_ends(
    upstream, gateway, http, headers_after_s
):
    async def stall(request: web.Request) -> web.StreamResponse:
        message = await request.json()
        if "id" not in message:
            return web.Response(status=202)
        await asyncio.sleep(headers_after_s)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"jsonrpc": "2.0", "id": 7, ')
        await asyncio.sleep(60)  # the rest never comes
        return response

    async with gateway(upstream.url, sse={**UPGRADE, "upgrade_answer_timeout_s": 1.0}) as gw:
        await _session(upstream, http, gw)
        upstream.routes["/mcp"] = stall
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        assert response.status == 200
        events, ended = await read_events(response, timeout_s=10)
    assert ended
    (error,) = json_messages(events)
    assert error["error"]["code"] == jsonrpc.UPSTREAM_STREAM_BROKEN
