"""Hostile upstreams: whatever the upstream writes, the client's wire stays well-formed.

Each case checks: the client gets valid SSE (every id unique, no field forged across lines),
a JSON-RPC answer for its request (the upstream's, or the gateway's documented error), and a
second session running at the same time is unaffected.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from mcp_sse_gateway import jsonrpc
from mcp_sse_gateway.web.keys import REGISTRY
from tests.integration.test_managed import _call, _headers, _initialize, _notification, _result
from tests.support.sse_client import read_events
from tests.support.waiting import eventually

DEADLINE_S = 10
OTHER = "sess-bystander"

Wire = Callable[[web.StreamResponse], Awaitable[None]]


def _stream(write: Wire, content_type: str = "text/event-stream") -> Callable:
    async def handle(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Mcp-Session-Id") == OTHER:
            return await _well_behaved(request)
        response = web.StreamResponse(headers={"Content-Type": content_type})
        await response.prepare(request)
        await write(response)
        return response

    return handle


async def _well_behaved(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for index in range(3):
        await response.write(f"data: {json.dumps(_notification(index))}\n\n".encode())
    await response.write(f"data: {json.dumps(_result(body['id']))}\n\n".encode())
    return response


def _check_wire(events) -> list[dict]:
    ids = [e.id for e in events if e.id]
    assert len(ids) == len(set(ids)), "an id was sent twice"
    for event in events:
        for value in (event.id or "", event.event or ""):
            assert "\x00" not in value
    return [json.loads(e.data) for e in events if e.data]


async def _run_case(upstream, gateway, http, write: Wire, **sections) -> list[dict]:
    """The hostile call and a bystander session's call, side by side."""
    async with gateway(upstream.url, **sections) as gw:
        await _initialize(upstream, http, gw)
        await _initialize(upstream, http, gw, session=OTHER)
        upstream.routes["/mcp"] = _stream(write)
        hostile = await http.post(gw.mcp_url, json=_call(7), headers=_headers())
        bystander = await http.post(gw.mcp_url, json=_call(8), headers=_headers(OTHER))
        events, ended = await read_events(hostile, timeout_s=DEADLINE_S)
        assert ended
        others, _ = await read_events(bystander, timeout_s=DEADLINE_S)
        assert _check_wire(others)[-1] == _result(8)  # unaffected
        await eventually(lambda: gw.app[REGISTRY].tasks == 0, timeout_s=DEADLINE_S)
    return _check_wire(events)


def _answer_gets(
    upstream: Any, body: Callable[[web.StreamResponse, int], Awaitable[None]]
) -> list[float]:
    """From now on the upstream answers each GET with an event stream that *body* writes
    (given the GET's number, from 1), and every other request as before.

    Returns:
        The GETs' arrival times (``time.monotonic()``), growing as they come.
    """
    gets: list[float] = []
    before = upstream.routes["/mcp"]

    async def answer(request: web.Request) -> web.StreamResponse:
        if request.method != "GET":
            return await before(request)
        gets.append(time.monotonic())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await body(response, len(gets))
        return response

    upstream.routes["/mcp"] = answer
    return gets


def _is_gateway_error(message: dict, request_id: int = 7) -> bool:
    return message.get("id") == request_id and (
        message.get("error", {}).get("code") == jsonrpc.UPSTREAM_STREAM_BROKEN
    )


async def test_nul_in_ids_and_event_names_and_garbage_retry(upstream, gateway, http):
    async def write(response: web.StreamResponse) -> None:
        await response.write(b'id: a\x00b\nevent: x\x00y\nretry: soon\ndata: {"a": 1}\n\n')
        await response.write(b'id: \r\nevent: \xff\xfe\rdata: {"b": 2}\r\rretry: -5\n')
        await response.write(f"event: message\ndata: {json.dumps(_result(7))}\n\n".encode())

    messages = await _run_case(upstream, gateway, http, write)
    assert messages == [{"a": 1}, {"b": 2}, _result(7)]


async def test_bytes_that_are_not_sse_under_an_sse_content_type(upstream, gateway, http):
    async def write(response: web.StreamResponse) -> None:
        await response.write(bytes(range(256)) * 64)

    messages = await _run_case(upstream, gateway, http, write)
    assert _is_gateway_error(messages[-1])  # the call ended with the gateway's error


async def test_a_reset_mid_event(upstream, gateway, http):
    async def write(response: web.StreamResponse) -> None:
        await response.write(f'data: {json.dumps(_notification(0))}\n\ndata: {{"par'.encode())
        assert response.task is not None
        request_transport = response._req.transport  # type: ignore[union-attr]
        request_transport.abort()

    messages = await _run_case(upstream, gateway, http, write)
    assert messages[0] == _notification(0)
    assert _is_gateway_error(messages[-1])


async def test_a_malformed_chunk_size_mid_stream(upstream, gateway, http):
    # aiohttp's C parser fails on the bad chunk-size line and closes the connection without
    # ending the body it was reading: the gateway must see the body broken, not wait forever.
    relayed = asyncio.Event()

    async def write(response: web.StreamResponse) -> None:
        await response.write(f"data: {json.dumps(_notification(0))}\n\n".encode())
        await asyncio.wait_for(relayed.wait(), DEADLINE_S)  # the body is being read
        request_transport = response._req.transport  # type: ignore[union-attr]
        request_transport.write(b"zz\r\nnot a chunk\r\n")  # not hex: no chunk-size
        await eventually(request_transport.is_closing, timeout_s=DEADLINE_S)

    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = _stream(write)
        hostile = await http.post(gw.mcp_url, json=_call(7), headers=_headers())
        first, _ = await read_events(hostile, until=2)  # the priming event and the notification
        relayed.set()
        rest, ended = await read_events(hostile, timeout_s=DEADLINE_S)
        assert ended
        await eventually(lambda: gw.app[REGISTRY].tasks == 0, timeout_s=DEADLINE_S)
    messages = _check_wire(first + rest)
    assert messages[0] == _notification(0)
    assert _is_gateway_error(messages[-1])


async def test_an_event_of_50_mb_ends_the_call_with_an_error(upstream, gateway, http):
    async def write(response: web.StreamResponse) -> None:
        chunk = b"x" * (1024 * 1024)
        await response.write(b'data: {"huge": "')
        for _ in range(50):
            await response.write(chunk)
        await response.write(b'"}\n\n')

    messages = await _run_case(upstream, gateway, http, write)
    assert len(messages) == 1
    assert _is_gateway_error(messages[0])


async def test_a_stall_mid_event_and_a_stream_that_never_ends(upstream, gateway, http):
    """The client leaves; the pump waits on; the bystander is served; shutdown ends it."""
    stalled = asyncio.Event()

    async def write(response: web.StreamResponse) -> None:
        await response.write(f"data: {json.dumps(_notification(0))}\n\ndata: {{".encode())
        stalled.set()
        await asyncio.sleep(3600)  # never finishes the event, never ends the stream

    async with gateway(upstream.url, server={"drain_timeout_s": 0.5}) as gw:
        await _initialize(upstream, http, gw)
        await _initialize(upstream, http, gw, session=OTHER)
        upstream.routes["/mcp"] = _stream(write)
        hostile = await http.post(gw.mcp_url, json=_call(7), headers=_headers())
        events, _ = await read_events(hostile, until=2)
        await asyncio.wait_for(stalled.wait(), DEADLINE_S)
        hostile.close()
        bystander = await http.post(gw.mcp_url, json=_call(8), headers=_headers(OTHER))
        others, _ = await read_events(bystander)
        assert _check_wire(others)[-1] == _result(8)
        assert gw.app[REGISTRY].tasks == 1  # the stalled pump, waiting on
    assert _check_wire(events) == [_notification(0)]


@pytest.mark.parametrize("status", [301, 307, 308])
async def test_redirects_of_a_managed_call_are_relayed(upstream, gateway, http, status):
    async def redirect(request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, headers={"Location": "http://elsewhere.invalid/mcp"})

    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = redirect
        response = await http.post(
            gw.mcp_url, json=_call(7), headers=_headers(), allow_redirects=False
        )
        assert response.status == status
        assert response.headers["Location"] == "http://elsewhere.invalid/mcp"
        await eventually(lambda: gw.app[REGISTRY].tasks == 0, timeout_s=DEADLINE_S)
    assert len(upstream.requests) == 2  # initialize and the call: the redirect not followed


async def test_a_standalone_get_answered_with_another_content_type_is_relayed(
    upstream, gateway, http
):
    async def html(request: web.Request) -> web.StreamResponse:
        return web.Response(text="<html>hello</html>", content_type="text/html")

    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = html
        response = await http.get(gw.mcp_url, headers=_headers())
        assert response.status == 200
        assert response.content_type == "text/html"
        assert await response.text() == "<html>hello</html>"
        assert gw.app[REGISTRY].tasks == 0  # no standalone pump for a non-stream


async def test_a_standalone_get_the_upstream_closes_at_once_is_reopened_ever_later(
    upstream, gateway, http
):
    """An upstream answering every GET with an event stream it ends at once, no event in it,
    is asked again after growing delays, not every ``retry_ms`` for as long as the session
    lives (D5)."""

    async def closes_at_once(response: web.StreamResponse, number: int) -> None:
        del response, number

    async with gateway(upstream.url, sse={"retry_ms": 100}) as gw:
        await _initialize(upstream, http, gw)
        gets = _answer_gets(upstream, closes_at_once)
        response = await http.get(gw.mcp_url, headers=_headers())
        assert response.status == 200
        response.close()  # no client attached from here on: the pump goes on alone
        await eventually(lambda: len(gets) >= 6, timeout_s=30)
        gaps = [later - earlier for earlier, later in itertools.pairwise(gets)]
        # Without backoff every gap is retry_ms at most (0.1 s); with it the fifth is at least
        # 0.1 s x 2^4 x 0.5 (jitter).
        assert gaps[4] >= 0.7, gaps
        assert gaps[4] > gaps[0]


async def test_a_standalone_get_polled_with_retry_0_and_nothing_in_it_is_reopened_once_a_second(
    upstream, gateway, http
):
    """An upstream priming every GET with ``retry: 0`` and closing it at once, nothing sent:
    polled, yet empty and quick, so at most one GET a second per session, not ten."""

    async def polls_empty(response: web.StreamResponse, number: int) -> None:
        await response.write(f"id: p-{number}\nretry: 0\ndata:\n\n".encode())

    async with gateway(upstream.url, sse={"retry_ms": 100}) as gw:
        await _initialize(upstream, http, gw)
        gets = _answer_gets(upstream, polls_empty)
        response = await http.get(gw.mcp_url, headers=_headers())
        assert response.status == 200
        await eventually(lambda: len(gets) >= 4, timeout_s=20)
        response.close()
    gaps = [later - earlier for earlier, later in itertools.pairwise(gets[:4])]
    assert min(gaps) >= 0.9, gaps


async def test_a_standalone_get_the_upstream_polls_is_reopened_after_its_retry(
    upstream, gateway, http
):
    """An upstream polling its GET stream (SEP-1699: it primes with ``retry``, then closes the
    stream soon) is not failing: every GET is re-opened after its retry, never backed off, so a
    message it queued while no GET was open reaches the client within about one retry."""
    queued: list[str] = []

    async def polls(response: web.StreamResponse, number: int) -> None:
        await response.write(f"id: poll-{number}\nretry: 50\ndata:\n\n".encode())
        while queued:
            await response.write(f"data: {queued.pop(0)}\n\n".encode())
        await asyncio.sleep(0.1)  # the upstream holds the poll open a moment, then closes it

    # The gateway's own retry is long: the upstream's is the one that counts.
    async with gateway(upstream.url, sse={"retry_ms": 2000}) as gw:
        await _initialize(upstream, http, gw)
        gets = _answer_gets(upstream, polls)
        response = await http.get(gw.mcp_url, headers=_headers())
        assert response.status == 200
        # Backed off from 2 s, the eighth GET would come after more than a minute.
        await eventually(lambda: len(gets) >= 8, timeout_s=20)
        note = '{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"queued"}}'
        queued.append(note)
        datas: list[str] = []
        async with asyncio.timeout(20):
            while not datas:
                events, ended = await read_events(response, until=1)
                assert not ended
                datas += [e.data for e in events if e.data]
        assert datas == [note]
        response.close()
