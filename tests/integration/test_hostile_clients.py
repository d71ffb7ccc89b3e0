"""Slow and hostile clients: header and body deadlines, header limits, capacity bounds.

Raw sockets on loopback, so the test decides every byte and every pause.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from mcp_sse_gateway.web.keys import METRICS, REGISTRY, STATE
from tests.integration.test_managed import ToolCall, _call, _headers, _initialize
from tests.support.waiting import eventually

DEADLINE_S = 10


async def _closed_within(reader: asyncio.StreamReader, timeout_s: float) -> bytes:
    """Everything the gateway sends until it closes the connection (bounded by *timeout_s*)."""
    return await asyncio.wait_for(reader.read(), timeout_s)


async def test_headers_trickling_in_are_cut_at_the_deadline(upstream, gateway, loop_errors):
    async with gateway(upstream.url, server={"header_timeout_s": 0.3}) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        await writer.drain()
        closed = False
        for index in range(100):  # one header line every 50 ms, never the blank line
            writer.write(f"X-Slow-{index}: x\r\n".encode())
            try:
                chunk = await asyncio.wait_for(reader.read(1), 0.05)
            except TimeoutError:
                continue
            assert chunk == b""  # closed, not answered
            closed = True
            break
        assert closed
        leftover = await _closed_within(reader, DEADLINE_S)
        writer.close()
    assert leftover == b""  # closed without an answer
    assert index < 40  # within about 0.3 s of 50 ms steps, not 5 s
    assert not upstream.requests
    assert not loop_errors  # closed quietly (an info line), no callback failed


async def test_a_silent_new_connection_is_closed(upstream, gateway, loop_errors):
    async with gateway(upstream.url, server={"header_timeout_s": 0.2}) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        assert await _closed_within(reader, DEADLINE_S) == b""
        writer.close()
    assert not loop_errors  # closed quietly (an info line), no callback failed


async def test_an_idle_kept_alive_connection_is_not_cut_by_the_header_deadline(upstream, gateway):
    async with gateway(upstream.url, server={"header_timeout_s": 0.2}) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        writer.write(request)
        first = await asyncio.wait_for(reader.readuntil(b'"ok"}'), DEADLINE_S)
        assert first.startswith(b"HTTP/1.1 200")
        with pytest.raises(TimeoutError):  # still open well past the header deadline
            await asyncio.wait_for(reader.read(1), 0.6)
        writer.write(request)
        second = await asyncio.wait_for(reader.readuntil(b'"ok"}'), DEADLINE_S)
        writer.close()
    assert second.startswith(b"HTTP/1.1 200")


async def test_a_body_that_stalls_gets_408(upstream, gateway):
    async with gateway(upstream.url, server={"body_timeout_s": 0.3}) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"jsonrpc":'
        )
        await writer.drain()
        answer = await asyncio.wait_for(reader.readuntil(b'timed out"}}'), DEADLINE_S)
        writer.close()
        rejected = gw.app[METRICS].registry.get_sample_value(
            "mcp_sse_gateway_requests_rejected_total", {"reason": "body_timeout"}
        )
    assert answer.startswith(b"HTTP/1.1 408")
    assert b"\r\nConnection: close\r\n" in answer  # the rest of the body is not waited for
    assert rejected == 1
    assert not upstream.requests


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        (b"".join(b"X-H-%d: v\r\n" % i for i in range(200)), b"400"),
        (b"X-Long: " + b"a" * 10_000 + b"\r\n", b"400"),
    ],
    ids=["too-many", "too-long"],
)
async def test_header_limits(upstream, gateway, headers, status):
    async with gateway(upstream.url) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers + b"\r\n")
        await writer.drain()
        answer = await _closed_within(reader, DEADLINE_S)
        writer.close()
    assert answer.split(b" ")[1] == status
    assert b"X-H-" not in answer
    assert b"aaaa" not in answer  # never echoed
    assert not upstream.requests


async def test_requests_beyond_the_cap_get_503_and_probes_still_answer(upstream, gateway, http):
    calls = [ToolCall(2, pause_after=1) for _ in range(2)]
    async with gateway(upstream.url, server={"max_concurrent_requests": 2}) as gw:
        await _initialize(upstream, http, gw)
        handlers = iter(calls)

        async def next_call(request: web.Request) -> web.StreamResponse:
            return await next(handlers).handle(request)

        upstream.routes["/mcp"] = next_call
        held = [await http.post(gw.mcp_url, json=_call(i), headers=_headers()) for i in (1, 2)]
        refused = await http.post(gw.mcp_url, json=_call(3), headers=_headers())
        body = await refused.json()
        health = await http.get(f"{gw.base_url}/healthz")
        ready = await http.get(f"{gw.base_url}/readyz")
        metrics = await http.get(f"{gw.base_url}/metrics")
        assert refused.status == 503
        assert refused.headers["Retry-After"] == "1"
        assert body["error"]["message"] == "Gateway at capacity, retry later"
        assert (health.status, ready.status, metrics.status) == (200, 200, 200)
        for call in calls:
            call.resume.set()
        for response in held:  # the running streams were not disturbed
            text = await response.text()
            assert '"result"' in text
        await eventually(lambda: gw.app[STATE].in_flight == 0, timeout_s=DEADLINE_S)
        again = await http.post(gw.mcp_url, json=_call(4), headers=_headers())
        assert again.status != 503
        again.close()


async def test_pumps_beyond_the_cap_get_503_and_the_running_one_goes_on(upstream, gateway, http):
    call = ToolCall(3, pause_after=1)
    async with gateway(upstream.url, server={"max_pumps": 1}) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = call.handle
        running = await http.post(gw.mcp_url, json=_call(1), headers=_headers())
        assert running.status == 200
        await eventually(lambda: gw.app[REGISTRY].tasks == 1, timeout_s=DEADLINE_S)
        refused = await http.post(gw.mcp_url, json=_call(2), headers=_headers())
        assert refused.status == 503
        assert refused.headers["Retry-After"] == "1"
        await refused.read()
        call.resume.set()
        messages = [
            json.loads(line[6:])
            for line in (await running.text()).splitlines()
            if line.startswith("data: {")
        ]
        rejected = gw.app[METRICS].registry.get_sample_value(
            "mcp_sse_gateway_requests_rejected_total", {"reason": "pumps"}
        )
    assert messages[-1]["id"] == 1
    assert rejected == 1
    assert len(upstream.requests) == 2  # initialize + the call


async def test_other_methods_on_the_probe_paths_count_against_the_cap(upstream, gateway, http):
    call = ToolCall(2, pause_after=1)
    async with gateway(upstream.url, server={"max_concurrent_requests": 1}) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = call.handle
        held = await http.post(gw.mcp_url, json=_call(1), headers=_headers())
        for method, path in [("POST", "/healthz"), ("PUT", "/metrics"), ("DELETE", "/readyz")]:
            async with http.request(method, f"{gw.base_url}{path}", data=b"x" * 1000) as r:
                assert r.status == 503, (method, path)
        async with http.get(f"{gw.base_url}/healthz") as r:
            assert r.status == 200
        call.resume.set()
        await held.read()


async def test_standalone_pumps_never_use_up_what_tool_calls_need(upstream, gateway, http):
    from tests.integration.test_managed import StandaloneUpstream

    standalone = StandaloneUpstream()
    call = ToolCall(1)
    async with gateway(upstream.url, server={"max_pumps": 1}) as gw:
        await _initialize(upstream, http, gw)

        async def route(request: web.Request) -> web.StreamResponse:
            if request.method == "GET":
                return await standalone.handle(request)
            return await call.handle(request)

        upstream.routes["/mcp"] = route
        listening = await http.get(gw.mcp_url, headers=_headers())
        assert listening.status == 200
        await standalone.wait_gets(1)
        listening.close()  # the standalone pump runs on without its client (D5)
        tool = await http.post(gw.mcp_url, json=_call(1), headers=_headers())
        assert tool.status == 200
        await tool.read()
        notification = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {}}
        upstream.routes["/mcp"] = _accepted
        sent = await http.post(gw.mcp_url, json=notification, headers=_headers())
        assert sent.status == 202
        standalone.queue.put_nowait(None)


async def _accepted(request: web.Request) -> web.StreamResponse:
    del request
    return web.Response(status=202)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer SECRET" + b"Z" * 9000,
        b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: session=SECRET" + b"C" * 9000,
        b"GET /mcp?access_token=SECRET" + b"Q" * 9000 + b" HTTP/1.1\r\nHost: 127.0.0.1",
    ],
    ids=["authorization", "cookie", "query"],
)
async def test_a_line_too_long_is_refused_without_logging_what_it_held(
    upstream, gateway, caplog, request_bytes
):
    """aiohttp's parser quotes the start of a line it refuses; no log line may carry it."""
    import logging

    import structlog

    caplog.set_level(logging.DEBUG)
    async with gateway(upstream.url) as gw:
        with structlog.testing.capture_logs() as logs:
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            writer.write(request_bytes + b"\r\n\r\n")
            await writer.drain()
            answer = await _closed_within(reader, DEADLINE_S)
            writer.close()
    assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request")  # HTTP/1.0: unparsed
    assert b"SECRET" not in answer
    assert "SECRET" not in repr(logs)
    assert "SECRET" not in caplog.text
    assert all(record.exc_info is None for record in caplog.records)
    assert [e for e in logs if e["event"] == "client.bad_request"]
    assert not upstream.requests


@pytest.mark.parametrize(
    "case",
    [(RuntimeError("SECRET"), b" 500 Internal Server Error"), (TimeoutError("SECRET"), b" 504 ")],
    ids=["bug", "timeout"],
)
async def test_a_failing_handler_is_an_error_line_without_what_the_request_held(
    upstream, gateway, caplog, monkeypatch, case
):
    """A failure of the gateway's own (a bug; a timeout escaping a handler, which aiohttp
    answers 504) is logged at error with its type and frames, for the operator, and never its
    message, nor the request's token or cookie; the client gets the bare status."""
    import logging

    import structlog

    from mcp_sse_gateway.web import relay

    failure, status = case

    def fails(*args: object, **kwargs: object) -> None:
        raise failure

    monkeypatch.setattr(relay, "_forward_headers", fails)
    caplog.set_level(logging.DEBUG)
    async with gateway(upstream.url) as gw:
        with structlog.testing.capture_logs() as logs:
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            writer.write(
                b"GET /other?token=SECRET HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Cookie: a=SECRET\r\nConnection: close\r\n\r\n"
            )
            await writer.drain()
            answer = await _closed_within(reader, DEADLINE_S)
            writer.close()
    assert status in answer.split(b"\r\n", 1)[0]
    assert b"SECRET" not in answer
    assert "SECRET" not in repr(logs)
    assert "SECRET" not in caplog.text
    failed = [e for e in logs if e["event"] == "server.request_failed"]
    assert [(e["log_level"], e["error"]) for e in failed] == [("error", type(failure).__name__)]
    assert "fails" in failed[0]["stack"]


async def test_an_undecodable_body_is_refused_without_an_error_line(upstream, gateway, caplog):
    """A gzip body that does not decode is the client's fault: a 400, and no error logged."""
    import logging

    import structlog

    caplog.set_level(logging.DEBUG)
    body = b"\x1f\x8b\x08\x00garbage-that-is-not-deflate" * 4
    async with gateway(upstream.url) as gw:
        with structlog.testing.capture_logs() as logs:
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            writer.write(
                b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body) + body
            )
            await writer.drain()
            answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_S)
            writer.close()
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert [e for e in logs if e["log_level"] in {"error", "critical"}] == []
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
