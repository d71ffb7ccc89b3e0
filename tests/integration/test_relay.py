"""The transparent relay (DESIGN D3) over real HTTP on loopback, against a scripted upstream."""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import Any

import aiohttp
import pytest
import structlog
from aiohttp import web
from yarl import URL

from mcp_sse_gateway.store.base import session_digest
from mcp_sse_gateway.web.keys import STORE
from tests.support.ports import free_port
from tests.support.scripted import DEADLINE_S


def _jsonrpc(method: str, request_id: int | None = 1, **params: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if request_id is not None:
        message["id"] = request_id
    return message


async def test_post_forwards_end_to_end_headers_and_drops_hop_by_hop(upstream, gateway, http):
    async with gateway(upstream.url) as gw:
        response = await http.post(
            URL(gw.mcp_url + "?tenant=a%2Fb%26c&x", encoded=True),
            json=_jsonrpc("tools/list"),
            headers={
                "Authorization": "Bearer t0ken",
                "Cookie": "a=1",
                "Mcp-Session-Id": "s-1",
                "MCP-Protocol-Version": "2025-06-18",
                "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "Connection": "keep-alive, X-Hop",
                "X-Hop": "secret",
                "Keep-Alive": "timeout=5",
                "Proxy-Authorization": "Basic Zm9vOmJhcg==",
                "TE": "trailers",
                "Last-Event-ID": "forged",
                "Accept-Encoding": "gzip",
                "Accept": "application/json, text/event-stream",
            },
        )
        assert response.status == 200
        assert await response.json() == {"path": "/mcp"}
    seen = upstream.requests[0]
    assert seen["query"] == "tenant=a%2Fb%26c&x"
    assert upstream.header(0, "Authorization") == ["Bearer t0ken"]
    assert upstream.header(0, "Cookie") == ["a=1"]
    assert upstream.header(0, "Mcp-Session-Id") == ["s-1"]
    assert upstream.header(0, "MCP-Protocol-Version") == ["2025-06-18"]
    assert upstream.header(0, "traceparent")
    for dropped in ("X-Hop", "Keep-Alive", "Proxy-Authorization", "TE", "Last-Event-ID"):
        assert upstream.header(0, dropped) == [], dropped
    assert upstream.header(0, "Accept-Encoding") == ["identity"]
    assert upstream.header(0, "Host") == [upstream.url.split("/")[2]]
    assert upstream.header(0, "X-Forwarded-For") == ["127.0.0.1"]
    assert upstream.header(0, "X-Forwarded-Proto") == ["http"]
    assert upstream.header(0, "X-Forwarded-Host") == [f"127.0.0.1:{gw.port}"]
    assert json.loads(seen["body"]) == _jsonrpc("tools/list")


async def test_untrusted_forwarded_headers_are_replaced(upstream, gateway, http):
    async with gateway(upstream.url) as gw:
        await http.post(
            gw.mcp_url,
            json=_jsonrpc("ping"),
            headers={"X-Forwarded-For": "6.6.6.6", "X-Forwarded-Host": "evil.example"},
        )
    assert upstream.header(0, "X-Forwarded-For") == ["127.0.0.1"]
    assert upstream.header(0, "X-Forwarded-Host") == [f"127.0.0.1:{gw.port}"]


async def test_trusted_proxy_forwarded_headers_are_extended(upstream, gateway, http):
    async with gateway(upstream.url, server={"trusted_proxies": ["127.0.0.0/8"]}) as gw:
        await http.post(
            gw.mcp_url,
            json=_jsonrpc("ping"),
            headers={"X-Forwarded-For": "203.0.113.7", "X-Forwarded-Proto": "https"},
        )
    assert upstream.header(0, "X-Forwarded-For") == ["203.0.113.7, 127.0.0.1"]
    assert upstream.header(0, "X-Forwarded-Proto") == ["https"]


async def test_401_and_www_authenticate_relayed_verbatim(upstream, gateway, http):
    async def unauthorized(request: web.Request) -> web.StreamResponse:
        response = web.json_response({"error": "invalid_token"}, status=401)
        response.headers.add(
            "WWW-Authenticate", 'Bearer resource_metadata="https://x/.well-known/y"'
        )
        response.headers.add("WWW-Authenticate", 'Basic realm="r"')
        response.headers.add("Set-Cookie", "a=1")
        response.headers.add("Set-Cookie", "b=2")
        return response

    upstream.routes["/mcp"] = unauthorized
    async with gateway(upstream.url) as gw:
        response = await http.post(gw.mcp_url, json=_jsonrpc("initialize"))
        assert response.status == 401
        assert response.headers.getall("WWW-Authenticate") == [
            'Bearer resource_metadata="https://x/.well-known/y"',
            'Basic realm="r"',
        ]
        assert response.headers.getall("Set-Cookie") == ["a=1", "b=2"]
        assert await response.json() == {"error": "invalid_token"}


async def test_redirects_are_relayed_not_followed(upstream, gateway, http):
    async def redirect(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound("/elsewhere")

    upstream.routes["/mcp"] = redirect
    async with gateway(upstream.url) as gw:
        response = await http.post(gw.mcp_url, json=_jsonrpc("ping"), allow_redirects=False)
        assert response.status == 302
        assert response.headers["Location"] == "/elsewhere"
    assert [r["path"] for r in upstream.requests] == ["/mcp"]


async def test_other_paths_relayed_untouched_and_own_paths_answered(upstream, gateway, http):
    async def metadata(request: web.Request) -> web.StreamResponse:
        return web.json_response({"resource": "x"}, headers={"Content-Encoding": "identity"})

    upstream.routes["/.well-known/oauth-protected-resource/mcp"] = metadata
    async with gateway(upstream.url) as gw:
        response = await http.get(gw.base_url + "/.well-known/oauth-protected-resource/mcp?q=1")
        assert response.status == 200
        assert await response.json() == {"resource": "x"}
        for path in ("/healthz", "/readyz", "/metrics"):
            own = await http.get(gw.base_url + path)
            assert own.status == 200, path
        missing = await http.get(gw.base_url + "/nope")
        assert missing.status == 200  # the scripted upstream's word, not the gateway's
    assert [(r["path"], r["query"]) for r in upstream.requests] == [
        ("/.well-known/oauth-protected-resource/mcp", "q=1"),
        ("/nope", ""),
    ]


async def test_upstream_unreachable_gives_502_with_jsonrpc_error(gateway, http):
    closed_port = free_port()  # nothing listens there
    async with gateway(f"http://127.0.0.1:{closed_port}/mcp") as gw:
        response = await http.post(gw.mcp_url, json=_jsonrpc("ping"))
        assert response.status == 502
        body = await response.json()
        assert body["jsonrpc"] == "2.0"
        assert body["error"]["code"] == -32002
        assert "Traceback" not in json.dumps(body)
        assert str(closed_port) not in json.dumps(body)
        assert body["id"] == 1  # the request's own id (JSON-RPC 2.0 §5)
        named = await http.post(gw.mcp_url, json=_jsonrpc("ping", request_id="req-7"))
        assert (await named.json())["id"] == "req-7"
        # null only where the id cannot be determined: a batch, a notification
        batch = await http.post(gw.mcp_url, json=[_jsonrpc("ping", 3), _jsonrpc("ping", 4)])
        notification = await http.post(gw.mcp_url, json=_jsonrpc("notifications/x", None))
        for response in (batch, notification):
            assert response.status == 502
            assert (await response.json())["id"] is None


async def test_headers_timeout_gives_502(upstream, gateway, http):
    never = asyncio.Event()

    async def hang(request: web.Request) -> web.StreamResponse:
        await never.wait()
        raise AssertionError("unreachable")

    upstream.routes["/mcp"] = hang
    async with gateway(upstream.url, upstream={"headers_timeout_s": 0.2}) as gw:
        response = await http.post(gw.mcp_url, json=_jsonrpc("ping"))
        assert response.status == 502


async def test_quiet_stream_is_not_cut_by_the_headers_timeout(upstream, gateway, http):
    async def quiet_stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        # The quiet period under test: three times the gateway's headers timeout.
        await asyncio.sleep(0.6)
        await response.write(b'data: {"jsonrpc":"2.0","id":1,"result":{}}\n\n')
        return response

    upstream.routes["/mcp"] = quiet_stream
    async with gateway(upstream.url, upstream={"headers_timeout_s": 0.2}) as gw:
        response = await http.post(gw.mcp_url, json=_jsonrpc("tools/call"))
        assert response.status == 200
        assert await response.read() == b'data: {"jsonrpc":"2.0","id":1,"result":{}}\n\n'


async def test_body_over_limit_gives_413_and_nothing_forwarded(upstream, gateway, http):
    async with gateway(upstream.url, server={"max_body_bytes": 1024}) as gw:
        declared = await http.post(gw.mcp_url, data=b"x" * 2048)
        assert declared.status == 413

        async def chunks():
            for _ in range(4):
                yield b"y" * 512

        streamed = await http.post(gw.mcp_url, data=chunks())
        assert streamed.status == 413
        assert (await streamed.json())["error"]["message"] == "Request body too large"
        ok = await http.post(gw.mcp_url, data=b"z" * 1024)
        assert ok.status == 200
    assert len(upstream.requests) == 1


async def test_bodies_beyond_the_buffered_bound_get_503_and_release_what_they_held(
    upstream, gateway, http
):
    async with gateway(
        upstream.url, server={"max_body_bytes": 4096, "max_buffered_body_bytes": 1500}
    ) as gw:
        whole = await http.post(gw.mcp_url, data=b"x" * 2000)  # arrives with its headers
        assert whole.status == 503
        assert whole.headers["Retry-After"]

        async def chunks():
            for _ in range(4):
                yield b"y" * 500  # sent chunked, piece by piece

        pieces = await http.post(gw.mcp_url, data=chunks())
        assert pieces.status == 503
        for _ in range(3):  # nothing stays held: the bound admits bodies again
            ok = await http.post(gw.mcp_url, data=b"z" * 1000)
            assert ok.status == 200
    assert len(upstream.requests) == 3


async def test_a_relayed_metrics_path_releases_the_body_it_held(upstream, gateway, http):
    # With metrics off, GET /metrics is relayed upstream like any path: its body counts
    # toward the buffered bound, and must be released like any other request's.
    async with gateway(
        upstream.url,
        server={"max_body_bytes": 4096, "max_buffered_body_bytes": 1500},
        metrics={"enabled": False},
    ) as gw:
        for _ in range(3):
            relayed = await http.get(f"{gw.base_url}/metrics", data=b"m" * 1000)
            assert relayed.status == 200
        ok = await http.post(gw.mcp_url, data=b"z" * 1000)
        assert ok.status == 200


async def test_a_compressed_body_goes_upstream_decoded_without_its_coding(upstream, gateway, http):
    message = json.dumps(_jsonrpc("ping", 9)).encode()
    async with gateway(upstream.url) as gw:
        response = await http.post(
            gw.mcp_url,
            data=gzip.compress(message),
            headers={
                "Content-Type": "application/json",
                "Content-Encoding": "gzip",
                "Content-Digest": "sha-256=:AAAA:",
            },
        )
        assert response.status == 200
        broken = await http.post(
            gw.mcp_url,
            data=b"not gzip at all",
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )
        assert broken.status == 400
        assert (await broken.json())["error"][
            "message"
        ] == "Bad Request: the body cannot be decoded"
    sent = upstream.pings[0] if upstream.pings else upstream.requests[0]["headers"]
    assert not [v for n, v in sent if n.lower() in {"content-encoding", "content-digest"}]
    assert len(upstream.pings) + len(upstream.requests) == 1


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({"Host": "evil.example"}, "Host"),
        ({"Origin": "https://evil.example"}, "Origin"),
        ({"Origin": "null"}, "Origin"),
    ],
)
async def test_host_and_origin_checked_before_forwarding(upstream, gateway, http, headers, reason):
    async with gateway(upstream.url) as gw:
        response = await http.post(gw.mcp_url, json=_jsonrpc("ping"), headers=headers)
        assert response.status == 403
        body = await response.json()
        assert reason in body["error"]["message"]
        assert "evil" not in json.dumps(body)
        other = await http.get(gw.base_url + "/.well-known/x", headers=headers)
        assert other.status == 403
        health = await http.get(gw.base_url + "/healthz", headers=headers)
        assert health.status == 200
    assert upstream.requests == []


async def test_allowed_origin_any_port_passes(upstream, gateway, http):
    async with gateway(upstream.url) as gw:
        response = await http.post(
            gw.mcp_url, json=_jsonrpc("ping"), headers={"Origin": "http://localhost:6274"}
        )
        assert response.status == 200


async def test_sse_is_relayed_event_by_event(upstream, gateway, http):
    first_seen = asyncio.Event()

    async def two_events(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"id: up-1\ndata: one\n\n")
        await asyncio.wait_for(first_seen.wait(), DEADLINE_S)
        await response.write(b"data: two\r\n\r\n")
        return response

    upstream.routes["/mcp"] = two_events
    async with gateway(upstream.url) as gw:
        response = await http.post(
            gw.mcp_url, json=_jsonrpc("tools/call"), headers={"Accept": "text/event-stream"}
        )
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert response.headers["Cache-Control"] == "no-cache, no-transform"
        assert response.headers["X-Accel-Buffering"] == "no"
        assert "Content-Encoding" not in response.headers
        received = b""
        while b"\n\n" not in received:
            received += await response.content.readany()
        assert received == b"id: up-1\ndata: one\n\n"
        first_seen.set()
        assert received + await response.content.read() == (
            b"id: up-1\ndata: one\n\ndata: two\r\n\r\n"
        )


async def test_client_disconnect_closes_the_pass_through_upstream_request(upstream, gateway, http):
    upstream_done = asyncio.Event()

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for index in range(10_000):
                await response.write(f"data: {index}\n\n".encode())
                await asyncio.sleep(0.01)
        finally:
            upstream_done.set()
        return response

    upstream.routes["/mcp"] = endless
    async with gateway(upstream.url) as gw:
        response = await http.post(gw.mcp_url, json=_jsonrpc("tools/call"))
        assert (await response.content.readany()).startswith(b"data: 0")
        response.close()
        await asyncio.wait_for(upstream_done.wait(), DEADLINE_S)


async def test_no_connection_pool_cap_queues_calls(upstream, gateway, http):
    """aiohttp's default pool (100) would queue the 101st call behind 100 open streams."""
    calls = 120
    arrived = 0
    all_arrived = asyncio.Event()

    async def hold(request: web.Request) -> web.StreamResponse:
        nonlocal arrived
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        arrived += 1
        if arrived == calls:
            all_arrived.set()
        await asyncio.wait_for(all_arrived.wait(), DEADLINE_S)
        await response.write(b"data: done\n\n")
        return response

    upstream.routes["/mcp"] = hold
    connector = aiohttp.TCPConnector(limit=0)
    async with gateway(upstream.url) as gw, aiohttp.ClientSession(connector=connector) as many:

        async def call() -> bytes:
            async with many.post(gw.mcp_url, json=_jsonrpc("tools/call")) as response:
                return await response.read()

        bodies = await asyncio.wait_for(asyncio.gather(*(call() for _ in range(calls))), 30)
    assert bodies == [b"data: done\n\n"] * calls


async def test_a_burst_beyond_the_requests_per_turn_is_served_whole(upstream, gateway, http):
    """Started 2 per loop turn, 120 calls sent at once are all answered, each its own answer."""
    calls = 120

    async def answer(request: web.Request) -> web.StreamResponse:
        message = await request.json()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"data: {message['params']['n']}\n\n".encode())
        return response

    upstream.routes["/mcp"] = answer
    connector = aiohttp.TCPConnector(limit=0)
    async with (
        gateway(upstream.url, server={"max_requests_per_turn": 2}) as gw,
        aiohttp.ClientSession(connector=connector) as many,
    ):

        async def call(n: int) -> bytes:
            body = {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"n": n}}
            async with many.post(gw.mcp_url, json=body) as response:
                return await response.read()

        async def probe() -> int:
            async with many.get(gw.base_url + "/healthz") as response:
                return response.status

        *bodies, health = await asyncio.wait_for(
            asyncio.gather(*(call(n) for n in range(calls)), probe()), 30
        )
    assert bodies == [f"data: {n}\n\n".encode() for n in range(calls)]
    assert health == 200


INIT_RESULT = {
    "jsonrpc": "2.0",
    "id": 1,
    "result": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "serverInfo": {"name": "scripted", "version": "1"},
    },
}


@pytest.mark.parametrize("as_sse", [False, True])
async def test_initialize_records_the_session_version(upstream, gateway, http, as_sse):
    async def initialize(request: web.Request) -> web.StreamResponse:
        headers = {"Mcp-Session-Id": "sess-42"}
        if not as_sse:
            return web.json_response(INIT_RESULT, headers=headers)
        response = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream"})
        await response.prepare(request)
        wire = f"event: message\ndata: {json.dumps(INIT_RESULT)}\n\n".encode()
        for cut in range(0, len(wire), 7):  # the InitializeResult arrives in small pieces
            await response.write(wire[cut : cut + 7])
        return response

    upstream.routes["/mcp"] = initialize
    async with gateway(upstream.url) as gw:
        merge = [structlog.contextvars.merge_contextvars]  # the request's context, as served
        with structlog.testing.capture_logs(processors=merge) as logs:
            response = await http.post(
                gw.mcp_url, json=_jsonrpc("initialize", protocolVersion="2025-11-25")
            )
            assert response.headers["Mcp-Session-Id"] == "sess-42"
            raw = await response.read()
        assert json.dumps(INIT_RESULT).encode() in raw
        record = await gw.app[STORE].get_session("sess-42")
    assert record is not None
    assert record.protocol_version == "2025-11-25"
    assert record.key == session_digest("sess-42")
    # The line names the new session (by digest), though the request came without one.
    (recorded,) = [e for e in logs if e["event"] == "session.recorded"]
    assert recorded["session"] == session_digest("sess-42")[:12]


async def test_delete_tombstones_the_session(upstream, gateway, http):
    upstream.routes["/mcp"] = lambda _request: _respond(web.Response(status=200))
    async with gateway(upstream.url) as gw:
        await gw.app[STORE].record_session("sess-del", "2025-11-25")
        response = await http.delete(gw.mcp_url, headers={"Mcp-Session-Id": "sess-del"})
        assert response.status == 200
        record = await gw.app[STORE].get_session("sess-del")
    assert record is not None
    assert record.deleted


async def _respond(response: web.StreamResponse) -> web.StreamResponse:
    return response


async def test_upstream_closing_before_headers_gives_502(gateway, http):
    async def slam(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        writer.close()

    server = await asyncio.start_server(slam, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with gateway(f"http://127.0.0.1:{port}/mcp") as gw:
            response = await http.post(gw.mcp_url, json=_jsonrpc("ping"))
            assert response.status == 502
            assert (await response.json())["error"]["code"] == -32002
    finally:
        server.close()
        await server.wait_closed()


async def test_healthcheck_probes_liveness_and_ready_probes_readiness(upstream, gateway, capsys):
    """A container health check (``healthcheck``) must pass while the gateway drains."""
    import asyncio

    from mcp_sse_gateway.cli import main
    from mcp_sse_gateway.web.keys import STATE

    async with gateway(upstream.url) as gw:
        port = ["--port", str(gw.port)]
        assert await asyncio.to_thread(main, ["healthcheck", *port]) == 0
        assert await asyncio.to_thread(main, ["healthcheck", "--ready", *port]) == 0
        gw.app[STATE].draining = True  # what SIGTERM sets first
        assert await asyncio.to_thread(main, ["healthcheck", *port]) == 0
        capsys.readouterr()
        assert await asyncio.to_thread(main, ["healthcheck", "--ready", *port]) == 1
        assert (
            capsys.readouterr().err == f"healthcheck: http://127.0.0.1:{gw.port}/readyz: HTTP 503\n"
        )
        gw.app[STATE].draining = False
    assert await asyncio.to_thread(main, ["healthcheck", *port]) == 1  # nothing listens
    assert capsys.readouterr().err.startswith(f"healthcheck: http://127.0.0.1:{gw.port}/healthz: ")


async def test_readiness_does_not_wait_on_a_stalled_store(upstream):
    """A store that does not answer (a paused Redis) is reported, within half a second, and
    the replica stays ready: the store is shared, so every replica would drop out at once."""
    import asyncio
    import time

    import aiohttp

    from mcp_sse_gateway.server import run_gateway
    from mcp_sse_gateway.store.memory import MemoryStore
    from tests.conftest import make_settings

    class StalledStore(MemoryStore):
        async def ping(self) -> None:
            await asyncio.sleep(3600)

    settings = make_settings(upstream.url)
    async with (
        run_gateway(settings, store=StalledStore.from_settings(settings.store)) as gw,
        aiohttp.ClientSession() as http,
    ):
        started = time.monotonic()
        async with http.get(f"{gw.base_url}/readyz") as response:
            body = await response.json()
            status = response.status
        took_s = time.monotonic() - started
    assert (status, body) == (200, {"status": "ready", "store": "unavailable"})
    assert took_s < 2  # bounded by READY_STORE_PING_S (0.5 s), far below probe timeouts


async def test_probes_are_logged_at_debug_other_requests_at_info(upstream, gateway, http):
    """A health check every few seconds must not flood the log; a failing probe still shows."""
    import structlog

    async with gateway(upstream.url) as gw:
        merge = [structlog.contextvars.merge_contextvars]  # the request's path is bound there
        with structlog.testing.capture_logs(processors=merge) as logs:
            for path in ("/healthz", "/readyz", "/metrics"):
                async with http.get(gw.base_url + path) as response:
                    assert response.status == 200
            async with http.post(gw.mcp_url, json=_jsonrpc("tools/list")) as response:
                await response.read()
    finished = [e for e in logs if e["event"] == "request.finished"]
    probes = [e for e in finished if e.get("path") in ("/healthz", "/readyz", "/metrics")]
    others = [e for e in finished if e.get("path") == "/mcp"]
    assert probes  # seen by the capture, at debug
    assert {e["log_level"] for e in probes} == {"debug"}
    assert [e["log_level"] for e in others] == ["info"]
