"""Resume authorization at its edges (DESIGN D8), against scripted upstreams.

Each case is an attack that once worked or a refusal that must stay: a DELETE redirected by an
SSO front, a probe answered by a sign-in page, credentials the configuration does not name,
requests nobody authorized pushing a user's stored answers out, refused GETs growing memory.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web

from mcp_sse_gateway.web import managed
from mcp_sse_gateway.web.keys import METRICS, STORE, STREAMS
from tests.integration.test_managed import SESSION, ToolCall, _call, _headers, _initialize
from tests.support.sse_client import read_events
from tests.support.waiting import eventually


async def _finished_stream(upstream, http, gw, request_id: int = 7, **auth: str) -> str:
    """A finished tool-call stream of the session; returns its priming id (a cursor)."""
    upstream.routes["/mcp"] = ToolCall(2).handle
    response = await http.post(gw.mcp_url, json=_call(request_id), headers=_headers(**auth))
    assert response.status == 200
    events, ended = await read_events(response)
    assert ended
    return events[0].id


async def _finished_stream_via(http, gw, request_id: int, auth: dict[str, str]) -> str:
    """Like :func:`_finished_stream`, through whatever route the upstream has now."""
    response = await http.post(gw.mcp_url, json=_call(request_id), headers=_headers(**auth))
    assert response.status == 200
    events, ended = await read_events(response)
    assert ended
    return events[0].id


async def _resume_status(http, gw, cursor: str, **auth: str) -> int:
    async with http.get(gw.mcp_url, headers=_headers(**{"Last-Event-ID": cursor}, **auth)) as r:
        await r.read()
        return r.status


@pytest.mark.parametrize("status", [301, 302, 303, 307])
async def test_a_redirected_delete_does_not_end_the_session(upstream, gateway, http, status):
    """An SSO front answers a stranger's DELETE with a redirect to its sign-in page."""
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        cursor = await _finished_stream(upstream, http, gw, Authorization="Bearer alice")

        async def sign_in(request: web.Request) -> web.StreamResponse:
            return web.Response(status=status, headers={"Location": "/login"})

        upstream.routes["/mcp"] = sign_in
        deleted = await http.delete(gw.mcp_url, headers=_headers(), allow_redirects=False)
        assert deleted.status == status
        record = await gw.app[STORE].get_session(SESSION)
    assert record is not None
    assert not record.deleted
    del cursor


@pytest.mark.parametrize(
    "answer",
    [
        ("text/html", "<html>Please sign in</html>", 200),
        ("application/json", '{"ok": true}', 200),
        ("application/json", '{"jsonrpc": "2.0", "id": "someone-else", "result": {}}', 200),
        ("application/json", "", 202),
        ("text/event-stream", 'data: {"jsonrpc": "2.0", "method": "x"}\n\n', 200),
        ("application/json", '{"jsonrpc": "2.0", "id": "@", "error": {"code": -32001}}', 200),
    ],
    ids=[
        "sign-in-page",
        "json-not-jsonrpc",
        "another-id",
        "202",
        "sse-without-answer",
        "in-dispatcher-unauthorized",
    ],
)
async def test_a_2xx_that_does_not_answer_the_ping_is_refused(upstream, gateway, http, answer):
    content_type, body, status = answer
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        cursor = await _finished_stream(upstream, http, gw, Authorization="Bearer alice")
        upstream.answer_pings = False

        async def front(request: web.Request) -> web.StreamResponse:
            ping = await request.json()
            text = body.replace('"@"', json.dumps(ping["id"]))  # answers this very ping
            return web.Response(status=status, text=text, content_type=content_type)

        upstream.routes["/mcp"] = front
        got = await _resume_status(http, gw, cursor, Authorization="Bearer mallory")
        assert await _resume_status(http, gw, cursor, Authorization="Bearer alice") == 200
    assert got == 403


@pytest.mark.parametrize("framing", ["json", "sse", "sse-kept-open", "json-method-not-found"])
async def test_a_2xx_that_answers_the_ping_authorizes(upstream, gateway, http, framing):
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        cursor = await _finished_stream(upstream, http, gw, Authorization="Bearer alice")
        upstream.answer_pings = False

        async def server(request: web.Request) -> web.StreamResponse:
            ping = await request.json()
            answer = {"jsonrpc": "2.0", "id": ping["id"], "result": {}}
            if framing == "json-method-not-found":  # an old server without ping: dispatched
                error = {"code": -32601, "message": "Method not found"}
                answer = {"jsonrpc": "2.0", "id": ping["id"], "error": error}
            if framing.startswith("json"):
                return web.json_response(answer)
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b": hello\n\n")
            await response.write(f"data: {json.dumps(answer)}\n\n".encode())
            if framing == "sse-kept-open":
                await asyncio.get_running_loop().create_future()  # never ends (cancelled)
            return response

        upstream.routes["/mcp"] = server
        got = await _resume_status(http, gw, cursor, Authorization="Bearer alice-refreshed")
    assert got == 200


async def test_credentials_the_configuration_does_not_name_are_asked_about_every_time(
    upstream, gateway, http
):
    """The upstream authenticates by X-Api-Key, which auth.credential_headers does not list:
    to the gateway every request is anonymous, so none passes for the creator and no check
    is cached. Anyone without a key is refused by the upstream, every time."""
    keys = {"alice-key": "alice"}
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        cursor = await _finished_stream(upstream, http, gw, **{"X-Api-Key": "alice-key"})
        upstream.answer_pings = False

        async def api_key_server(request: web.Request) -> web.StreamResponse:
            if request.headers.get("X-Api-Key") not in keys:
                return web.json_response({"error": "no key"}, status=401)
            ping = await request.json()
            return web.json_response({"jsonrpc": "2.0", "id": ping["id"], "result": {}})

        upstream.routes["/mcp"] = api_key_server
        statuses = [
            await _resume_status(http, gw, cursor, **{"X-Api-Key": "alice-key"}),
            await _resume_status(http, gw, cursor),  # no key: not "the same as alice"
            await _resume_status(http, gw, cursor, **{"X-Api-Key": "alice-key"}),
            await _resume_status(http, gw, cursor),  # nor served from alice's check
        ]
        probes = gw.app[METRICS].registry.get_sample_value(
            "mcp_sse_gateway_auth_probes_total", {"outcome": "ok"}
        )
    assert statuses == [200, 401, 200, 401]
    assert probes == 2


async def test_requests_nobody_authorized_cannot_push_out_a_users_stored_streams(
    upstream, gateway, http
):
    async with gateway(upstream.url, store={"max_streams_per_session": 2}) as gw:
        await _initialize(upstream, http, gw)
        first = await _finished_stream(upstream, http, gw, 1, Authorization="Bearer alice")
        second = await _finished_stream(upstream, http, gw, 2, Authorization="Bearer alice")

        async def refuse(request: web.Request) -> web.StreamResponse:
            return web.json_response({"error": "invalid_token"}, status=401)

        upstream.routes["/mcp"] = refuse
        flood = [
            await http.post(gw.mcp_url, json=_call(9), headers=_headers(Authorization="Bearer x"))
            for _ in range(5)
        ]
        assert {r.status for r in flood} == {503}  # no room, and alice's are not theirs
        assert await _resume_status(http, gw, first, Authorization="Bearer alice") == 200
        # Alice's own next call makes room by evicting her oldest finished stream.
        await _finished_stream(upstream, http, gw, 3, Authorization="Bearer alice")
        assert await _resume_status(http, gw, first, Authorization="Bearer alice") == 400
        assert await _resume_status(http, gw, second, Authorization="Bearer alice") == 200


async def test_refused_plain_gets_leave_nothing_behind(upstream, gateway, http):
    async def gone(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": "session not found"}, status=404)

    async with gateway(upstream.url) as gw:
        upstream.routes["/mcp"] = gone
        for index in range(50):
            async with http.get(gw.mcp_url, headers=_headers(f"unknown-{index}")) as response:
                assert response.status == 404
        standalone = gw.app[STREAMS].standalone
        assert not standalone._locks
        assert not standalone.calls


async def test_principal_mode_checks_an_unverified_jwt_on_its_own(upstream, gateway, http):
    """Bob sends his API key (which the upstream accepts) and a forged JWT naming alice: the
    probe carries the JWT alone, so the upstream's acceptance of his key proves nothing."""
    import jwt

    alice = jwt.encode({"iss": "i", "sub": "alice", "exp": 2**40}, "real-key" * 4, "HS256")
    forged = jwt.encode({"iss": "i", "sub": "alice", "exp": 2**40}, "wrong-key" * 4, "HS256")
    async with gateway(upstream.url, auth={"resume": "principal"}) as gw:
        await _initialize(upstream, http, gw)
        cursor = await _finished_stream(upstream, http, gw, Authorization=f"Bearer {alice}")
        upstream.answer_pings = False

        async def server(request: web.Request) -> web.StreamResponse:
            token = request.headers.get("Authorization", "").removeprefix("Bearer ")
            valid_token = token == alice
            if not valid_token and request.headers.get("X-Api-Key") != "bob-key":
                return web.json_response({"error": "invalid_token"}, status=401)
            ping = await request.json()
            return web.json_response({"jsonrpc": "2.0", "id": ping["id"], "result": {}})

        upstream.routes["/mcp"] = server
        forged_with_key = await _resume_status(
            http, gw, cursor, Authorization=f"Bearer {forged}", **{"X-Api-Key": "bob-key"}
        )
        refreshed = await _resume_status(http, gw, cursor, Authorization=f"Bearer {alice}")
    assert forged_with_key == 401
    assert refreshed == 200


def _api_key_server(keys: set[str], *, ping_delay_s: float = 0) -> object:
    """An upstream that authenticates by X-Api-Key (a header the gateway is not told about)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.headers.get("X-Api-Key") not in keys:
            return web.json_response({"error": "no key"}, status=401)
        message = await request.json()
        if message.get("method") == "ping":
            await asyncio.sleep(ping_delay_s)
            return web.json_response({"jsonrpc": "2.0", "id": message["id"], "result": {}})
        return await ToolCall(2).handle(request)

    return handle


async def test_an_anonymous_resume_never_gets_another_ones_probe_answer(upstream, gateway, http):
    """The victim's (key-carrying, to the gateway anonymous) probe is slow; an attacker's
    resume without the key arrives meanwhile: it is asked about on its own, and refused."""
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        cursor = await _finished_stream(upstream, http, gw, **{"X-Api-Key": "alice-key"})
        upstream.answer_pings = False
        upstream.routes["/mcp"] = _api_key_server({"alice-key"}, ping_delay_s=0.5)
        victim = asyncio.ensure_future(
            _resume_status(http, gw, cursor, **{"X-Api-Key": "alice-key"})
        )
        # initialize, the call, then the victim's probe: it is at the upstream, sleeping.
        await eventually(lambda: len(upstream.requests) >= 3, timeout_s=10)
        attacker = await _resume_status(http, gw, cursor)
        assert await victim == 200
    assert attacker == 401


async def test_a_request_without_credentials_evicts_no_credentialed_stream(upstream, gateway, http):
    async with gateway(upstream.url, store={"max_streams_per_session": 2}) as gw:
        await _initialize(upstream, http, gw)
        first = await _finished_stream(upstream, http, gw, 1, Authorization="Bearer alice")
        await _finished_stream(upstream, http, gw, 2, Authorization="Bearer alice")
        refused = await http.post(gw.mcp_url, json=_call(3), headers=_headers())
        assert refused.status == 503  # full, and nothing of its own kind to evict
        await refused.read()
        assert await _resume_status(http, gw, first, Authorization="Bearer alice") == 200


async def test_calls_without_credentials_make_room_among_themselves(upstream, gateway, http):
    """In front of an upstream without authorization a session makes many calls."""
    async with gateway(upstream.url, store={"max_streams_per_session": 2}) as gw:
        await _initialize(upstream, http, gw)
        cursors = [await _finished_stream(upstream, http, gw, i) for i in range(1, 6)]
        assert await _resume_status(http, gw, cursors[-1]) == 200
        assert await _resume_status(http, gw, cursors[0]) == 400  # evicted for the later ones


async def test_a_stream_evicted_while_its_resume_is_authorized_gets_400(upstream, gateway, http):
    """The resume's lookup finds the finished stream; a new call evicts it (the session's
    bound) while the upstream answers the resume's authorization probe: 400, as for any
    stream the session no longer has, never a 200 with a priming event and nothing else."""
    async with gateway(upstream.url, store={"max_streams_per_session": 1}) as gw:
        await _initialize(upstream, http, gw)
        cursor = await _finished_stream(upstream, http, gw, 1)
        probe_held = asyncio.Event()
        answer_probe = asyncio.Event()
        call = ToolCall(2)

        async def slow_probe(request: web.Request) -> web.StreamResponse:
            message = json.loads(await request.read())
            if message.get("method") != "ping":
                return await call.handle(request)
            probe_held.set()
            await answer_probe.wait()
            return web.json_response({"jsonrpc": "2.0", "id": message["id"], "result": {}})

        upstream.answer_pings = False
        upstream.routes["/mcp"] = slow_probe
        resume = asyncio.ensure_future(_resume_status(http, gw, cursor))
        await asyncio.wait_for(probe_held.wait(), 10)
        newer = await http.post(gw.mcp_url, json=_call(2), headers=_headers())
        assert newer.status == 200  # the bound: the finished stream made room for it
        _, ended = await read_events(newer)
        assert ended
        answer_probe.set()
        assert await asyncio.wait_for(resume, 10) == 400


async def test_a_slow_first_read_holds_the_resume_back_a_bounded_time(
    upstream, gateway, http, monkeypatch
):
    """A store slow to answer the resume's first read (a stalled Redis) holds its 200 back
    FIRST_BATCH_WAIT_S at most; the delivery then takes the read on and sends what it finds."""
    monkeypatch.setattr(managed, "FIRST_BATCH_WAIT_S", 0.05)
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        cursor = await _finished_stream(upstream, http, gw, 1)
        store = gw.app[STREAMS].ctx.store
        read, held, release = store.read, asyncio.Event(), asyncio.Event()

        async def stalled_read(*args: Any, **kwargs: Any) -> Any:
            held.set()
            await release.wait()
            return await read(*args, **kwargs)

        monkeypatch.setattr(store, "read", stalled_read)
        async with http.get(gw.mcp_url, headers=_headers(**{"Last-Event-ID": cursor})) as resumed:
            assert resumed.status == 200  # answered while the read is still held
            assert held.is_set()
            assert not release.is_set()
            release.set()
            events, ended = await read_events(resumed)
    assert ended
    messages = [json.loads(e.data) for e in events if e.data]
    assert [m["id"] for m in messages if "id" in m] == [1]  # the result, once, at the end
    assert "id" in messages[-1]
