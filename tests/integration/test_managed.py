"""Managed streams, era rules and resume (DESIGN D2, D4, D6) against a scripted upstream.

The scripted upstream has no event store and drops the answer of a call whose connection
closed: everything a client gets back after a drop comes from the gateway.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from mcp_sse_gateway import jsonrpc
from mcp_sse_gateway.errors import StoreUnavailable
from mcp_sse_gateway.event_ids import parse_event_id
from mcp_sse_gateway.web.app import drain
from mcp_sse_gateway.web.keys import METRICS, REGISTRY, STREAMS
from tests.support.scripted import DEADLINE_S
from tests.support.sse_client import json_messages as _messages
from tests.support.sse_client import parse, read_events
from tests.support.waiting import eventually

SESSION = "sess-managed-1"


def _init_result(version: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 0,
        "result": {
            "protocolVersion": version,
            "capabilities": {},
            "serverInfo": {"name": "scripted", "version": "1"},
        },
    }


def _notification(index: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": index}}


def _result(request_id: int, text: str = "done") -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "result": {"content": [{"type": "text", "text": text}]},
    }


class ToolCall:
    """A scripted tool call: sends notifications 0..n-1 then the result; can pause after k."""

    def __init__(self, total: int, pause_after: int | None = None) -> None:
        self.total = total
        self.pause_after = pause_after
        self.resume = asyncio.Event()
        self.finished = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for index in range(self.total):
                if index == self.pause_after:
                    await asyncio.wait_for(self.resume.wait(), DEADLINE_S)
                await response.write(
                    f"id: upstream-{index}\ndata: {json.dumps(_notification(index))}\n\n".encode()
                )
            if self.pause_after == self.total:
                await asyncio.wait_for(self.resume.wait(), DEADLINE_S)
            await response.write(f"data: {json.dumps(_result(body['id']))}\n\n".encode())
        finally:
            self.finished.set()
        return response


async def _initialize(upstream, http, gw, version: str = "2025-11-25", session: str = SESSION):
    async def initialize(request: web.Request) -> web.StreamResponse:
        return web.json_response(_init_result(version), headers={"Mcp-Session-Id": session})

    upstream.routes["/mcp"] = initialize
    response = await http.post(
        gw.mcp_url,
        json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}},
    )
    assert response.headers["Mcp-Session-Id"] == session
    await response.read()


def _call(request_id: int = 7) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": "t"}}


def _headers(session: str = SESSION, **extra: str) -> dict[str, str]:
    return {"Mcp-Session-Id": session, "Accept": "text/event-stream, application/json", **extra}


async def test_primed_session_gets_priming_then_gateway_ids(upstream, gateway, http):
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = ToolCall(3).handle
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        assert response.headers["Content-Type"] == "text/event-stream"
        assert response.headers["Cache-Control"] == "no-cache, no-transform"
        events, ended = await read_events(response)
    assert ended
    priming, *rest = events
    assert priming.data == ""
    assert priming.retry == 1000
    assert parse_event_id(priming.id).offset == 0
    assert [m.get("params", {}).get("data") for m in _messages(rest)[:3]] == [0, 1, 2]
    assert _messages(rest)[3] == _result(7)
    ids = [e.id for e in rest if e.data]
    assert all(i and not i.startswith("upstream") for i in ids)
    assert len({*ids, priming.id}) == len(ids) + 1
    assert [parse_event_id(i).offset for i in ids] == [1, 2, 3, 4]


@pytest.mark.parametrize("version", ["2025-03-26", "2025-06-18", None])
async def test_older_or_unknown_sessions_get_ids_but_no_priming(upstream, gateway, http, version):
    async with gateway(upstream.url) as gw:
        session = SESSION
        if version is not None:
            await _initialize(upstream, http, gw, version=version)
        else:
            session = "never-initialized-through-the-gateway"
        upstream.routes["/mcp"] = ToolCall(2).handle
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers(session))
        events, _ = await read_events(response)
    assert events[0].data is not None
    assert events[0].data != ""
    assert all(parse_event_id(e.id) for e in events if e.data)
    assert _messages(events)[-1] == _result(7)


async def test_no_session_is_passed_through_with_upstream_ids(upstream, gateway, http):
    async with gateway(upstream.url) as gw:
        upstream.routes["/mcp"] = ToolCall(2).handle
        response = await http.post(gw.mcp_url, json=_call())
        events, _ = await read_events(response)
    assert [e.id for e in events] == ["upstream-0", "upstream-1", None]


@pytest.mark.parametrize("drop_after", [0, 1, 5, 9, 10])
async def test_drop_after_k_and_resume_gets_every_message_once(upstream, gateway, http, drop_after):
    """Drop at the start, middle, just before and just after the last notification."""
    call = ToolCall(10, pause_after=drop_after)
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = call.handle
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        first, _ = await read_events(response, until=1 + drop_after)
        response.close()
        call.resume.set()
        await asyncio.wait_for(call.finished.wait(), DEADLINE_S)
        resumed = await http.get(gw.mcp_url, headers=_headers(**{"Last-Event-ID": first[-1].id}))
        assert resumed.status == 200
        second, ended = await read_events(resumed)
    assert ended
    assert second[0].data == ""  # priming of the resumed connection
    received = _messages(first) + _messages(second)
    indexes = [m["params"]["data"] for m in received if "method" in m]
    assert indexes == list(range(10))
    assert received[-1] == _result(7)


async def test_resume_twice_in_a_row_and_mid_call(upstream, gateway, http):
    call = ToolCall(6, pause_after=4)
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = call.handle
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        first, _ = await read_events(response, until=3)
        response.close()
        again = await http.get(gw.mcp_url, headers=_headers(**{"Last-Event-ID": first[-1].id}))
        second, _ = await read_events(again, until=1)  # the call is still paused upstream
        again.close()
        call.resume.set()
        third_response = await http.get(
            gw.mcp_url, headers=_headers(**{"Last-Event-ID": second[-1].id})
        )
        third, ended = await read_events(third_response)
    assert ended
    received = _messages(first) + _messages(second) + _messages(third)
    assert [m["params"]["data"] for m in received if "method" in m] == list(range(6))
    assert received[-1] == _result(7)


async def test_poll_after_zero_closes_right_after_priming(upstream, gateway, http):
    call = ToolCall(3)
    async with gateway(upstream.url, sse={"poll_after_ms": 0}) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = call.handle
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        events, ended = await read_events(response)
        assert ended
        assert [e.data for e in events if e.data is not None] == [""]
        assert events[-1].retry == 1000
        cursor = events[0].id
        received: list[Any] = []
        for _ in range(20):
            poll = await http.get(gw.mcp_url, headers=_headers(**{"Last-Event-ID": cursor}))
            if poll.status == 204:
                break
            assert poll.status == 200
            got, _ = await read_events(poll)
            received += _messages(got)
            cursor = [e.id for e in got if e.id][-1]
            if received and received[-1].get("id") == 7:
                break
    assert [m["params"]["data"] for m in received if "method" in m] == [0, 1, 2]
    assert received[-1] == _result(7)


@pytest.mark.parametrize(
    "value",
    [
        "garbage",
        "0" * 32 + "-1",
        "../../etc/passwd",
        "x" * 5000,
    ],
)
async def test_bad_or_unknown_cursor_gets_400_without_echo(upstream, gateway, http, value):
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        response = await http.get(gw.mcp_url, headers=_headers(**{"Last-Event-ID": value}))
        assert response.status == 400
        body = await response.text()
        assert value[:20] not in body
        assert json.loads(body)["error"]["code"] == -32600
    assert all(r["method"] != "GET" for r in upstream.requests)


async def test_cursor_of_another_session_gets_400(upstream, gateway, http):
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = ToolCall(2).handle
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        events, _ = await read_events(response)
        await _initialize(upstream, http, gw, session="other-session")
        foreign = await http.get(
            gw.mcp_url, headers=_headers("other-session", **{"Last-Event-ID": events[1].id})
        )
        assert foreign.status == 400


async def test_offset_beyond_what_was_sent_gets_400(upstream, gateway, http):
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = ToolCall(2).handle
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        events, _ = await read_events(response)
        life = parse_event_id(events[0].id).life
        forged = await http.get(gw.mcp_url, headers=_headers(**{"Last-Event-ID": f"{life}-99"}))
        assert forged.status == 400


async def test_cursor_at_end_of_finished_stream_stops_the_client(upstream, gateway, http):
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = ToolCall(1).handle
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        events, _ = await read_events(response)
        last = [e.id for e in events if e.data][-1]
        again = await http.get(gw.mcp_url, headers=_headers(**{"Last-Event-ID": last}))
        assert again.status == 204
        replay = await http.get(gw.mcp_url, headers=_headers(**{"Last-Event-ID": events[0].id}))
        got, ended = await read_events(replay)
    assert ended
    assert _messages(got) == _messages(events)


async def test_deleted_session_gets_404(upstream, gateway, http):
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = ToolCall(1).handle
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        events, _ = await read_events(response)

        async def deleted(request: web.Request) -> web.StreamResponse:
            return web.Response(status=200)

        upstream.routes["/mcp"] = deleted
        assert (await http.delete(gw.mcp_url, headers=_headers())).status == 200
        gone = await http.get(gw.mcp_url, headers=_headers(**{"Last-Event-ID": events[0].id}))
        assert gone.status == 404
        post = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        assert post.status == 404


@pytest.mark.parametrize("answers", [True, False], ids=["upstream_answers", "upstream_stops"])
async def test_a_call_open_when_its_session_is_deleted_still_reaches_its_client(
    upstream, gateway, http, answers
):
    """DELETE drops the session's streams while a call runs: the client attached to the call
    still gets what the upstream sends, its answer or else the gateway's error (without ids:
    nothing is left to resume), then the end of the stream; a resume gets 404."""
    go_on = asyncio.Event()

    async def tool(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for index in range(2):
            await response.write(f"data: {json.dumps(_notification(index))}\n\n".encode())
        await asyncio.wait_for(go_on.wait(), DEADLINE_S)
        await response.write(f"data: {json.dumps(_notification(2))}\n\n".encode())
        if answers:
            await response.write(f"data: {json.dumps(_result(7))}\n\n".encode())
        return response

    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = tool
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        first, _ = await read_events(response, until=3)  # priming and two notifications
        assert [m["params"]["data"] for m in _messages(first)] == [0, 1]

        async def deleted(request: web.Request) -> web.StreamResponse:
            return web.Response(status=200)

        upstream.routes["/mcp"] = deleted
        assert (await http.delete(gw.mcp_url, headers=_headers())).status == 200
        go_on.set()  # the upstream goes on: its next events find no stream to store in
        rest, ended = await read_events(response)
        assert ended
        messages = _messages(rest)
        assert messages[0] == _notification(2)
        if answers:
            assert messages[1:] == [_result(7)]
        else:
            assert [(m["id"], m["error"]["code"]) for m in messages[1:]] == [
                (7, jsonrpc.UPSTREAM_STREAM_BROKEN)
            ]
        assert not any(e.id for e in rest)
        assert rest[-1].retry == 1000
        gone = await http.get(gw.mcp_url, headers=_headers(**{"Last-Event-ID": first[-1].id}))
        assert gone.status == 404
        await eventually(lambda: gw.app[REGISTRY].tasks == 0)
        metrics = gw.app[METRICS].render().decode()
        assert "mcp_sse_gateway_streams_store_lost_total 0.0" in metrics


async def test_a_stream_the_store_lost_while_its_session_lives_counts_as_store_lost(
    upstream, gateway, http
):
    """The store lost a running call's stream (Redis restarted empty, keys evicted) while the
    session lives: the attached client still gets the rest, without ids, and the operator sees
    it as a store outage (``streams_store_lost``, a warning), not as a deleted session."""
    call = ToolCall(1, pause_after=1)  # one notification, then the result once resumed

    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = call.handle
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        first, _ = await read_events(response, until=2)
        cursor = parse_event_id(first[-1].id)
        assert cursor is not None
        await gw.app[STREAMS].ctx.store.drop_stream(SESSION, cursor.life)  # the loss
        call.resume.set()
        rest, ended = await read_events(response)
        assert ended
        assert _messages(rest) == [_result(7)]
        assert not any(e.id for e in rest)
        await eventually(lambda: gw.app[REGISTRY].tasks == 0)
        metrics = gw.app[METRICS].render().decode()
        assert "mcp_sse_gateway_streams_store_lost_total 1.0" in metrics


class _LostCall:
    """A call that sends notification 0, then 1 and 2 once told (into a store outage), then
    its result once told again; it answers the resume authorization's ``ping`` itself, once
    ``probe`` is set (so a test can hold a resume inside its probe)."""

    def __init__(self) -> None:
        self.more, self.end, self.probe = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self.probed = asyncio.Event()
        self.probe.set()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("method") == "ping":
            self.probed.set()
            await asyncio.wait_for(self.probe.wait(), DEADLINE_S)
            return web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": {}})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"data: {json.dumps(_notification(0))}\n\n".encode())
        await asyncio.wait_for(self.more.wait(), DEADLINE_S)
        for index in (1, 2):
            await response.write(f"data: {json.dumps(_notification(index))}\n\n".encode())
        await asyncio.wait_for(self.end.wait(), DEADLINE_S)
        await response.write(f"data: {json.dumps(_result(body['id']))}\n\n".encode())
        return response


def _store_outage(gw, monkeypatch) -> tuple[asyncio.Event, asyncio.Event]:
    """Events that make the store refuse appends (an outage: the pump goes lost) and let it
    drop streams again (until then the lost life stays in the store: its retirement waits)."""
    store = gw.app[STREAMS].ctx.store
    down, drops = asyncio.Event(), asyncio.Event()
    append_many, drop_stream = store.append_many, store.drop_stream

    async def appending(*args: Any, **kwargs: Any) -> int:
        if down.is_set():
            raise StoreUnavailable("down (test)")
        return await append_many(*args, **kwargs)

    async def dropping(*args: Any, **kwargs: Any) -> None:
        if not drops.is_set():
            raise StoreUnavailable("down (test)")
        await drop_stream(*args, **kwargs)

    monkeypatch.setattr(store, "append_many", appending)
    monkeypatch.setattr(store, "drop_stream", dropping)
    return down, drops


async def test_a_resume_of_a_life_lost_to_an_outage_gets_400_while_the_store_still_has_it(
    upstream, gateway, http, monkeypatch
):
    """The store came back, but the lost life is not dropped from it yet (its retirement backs
    off): a resume must not be served, or it gets the stored events and then the lost feed's
    events again, which its first connection already had, without ids (D4: a resume across
    the outage gets 400)."""
    call = _LostCall()
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = call.handle
        down, drops = _store_outage(gw, monkeypatch)
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        first, _ = await read_events(response, until=2)  # priming and notification 0
        stored = first[-1].id
        assert parse_event_id(stored).offset == 1
        down.set()
        call.more.set()
        lost, _ = await read_events(response, until=2)
        assert [m["params"]["data"] for m in _messages(lost)] == [1, 2]
        assert not any(e.id for e in lost)
        down.clear()  # the store is back; the lost life is still in it
        response.close()
        resumed = await http.get(gw.mcp_url, headers=_headers(**{"Last-Event-ID": stored}))
        assert resumed.status == 400
        assert (await resumed.json())["error"]["code"] == -32600  # Invalid Request
        drops.set()
        call.end.set()
        await eventually(lambda: gw.app[REGISTRY].tasks == 0)


async def test_a_resume_whose_life_is_lost_during_its_probe_gets_no_lost_events(
    upstream, gateway, http, monkeypatch
):
    """The life goes lost while a resume waits for its authorization probe: the resume was
    answered for a live life, but must not take over the lost feed (its events went to the
    connection reading then): it ends at once with ``retry``, its next attempt gets 400."""
    call = _LostCall()
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = call.handle
        upstream.answer_pings = False  # the call answers them, when told
        down, drops = _store_outage(gw, monkeypatch)
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        first, _ = await read_events(response, until=2)
        stored = first[-1].id
        call.probe.clear()
        call.probed.clear()
        resume = asyncio.ensure_future(
            http.get(gw.mcp_url, headers=_headers(**{"Last-Event-ID": stored}))
        )
        await asyncio.wait_for(call.probed.wait(), DEADLINE_S)  # the resume is in its probe
        down.set()
        call.more.set()
        lost, _ = await read_events(response, until=2)  # the connection reading gets them
        assert [m["params"]["data"] for m in _messages(lost)] == [1, 2]
        down.clear()
        call.probe.set()
        resumed = await asyncio.wait_for(resume, DEADLINE_S)
        assert resumed.status == 200
        events, ended = await read_events(resumed)
        assert ended
        assert _messages(events) == []
        assert events[-1].retry == 1000
        again = await http.get(gw.mcp_url, headers=_headers(**{"Last-Event-ID": stored}))
        assert again.status == 400
        # The connection reading the lost feed was not replaced: it gets the rest.
        call.end.set()
        rest, ended = await read_events(response)
        assert ended
        assert _messages(rest) == [_result(7)]
        assert not any(e.id for e in rest)
        drops.set()
        await eventually(lambda: gw.app[REGISTRY].tasks == 0)


async def test_a_lost_stream_is_not_closed_for_polling(upstream, gateway, http, monkeypatch):
    """A stream lost to a store outage cannot be resumed: a polling close (SEP-1699) would
    leave its client without the rest. The connection stays past the polling deadline (its
    keepalives show the time passing) and gets the result."""
    call = _LostCall()
    sse = {"poll_after_ms": 100, "keepalive_s": 0.05}
    async with gateway(upstream.url, sse=sse) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = call.handle
        down, drops = _store_outage(gw, monkeypatch)
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        await read_events(response, until=2)  # priming and notification 0
        down.set()
        call.more.set()
        lost, ended = await read_events(response, until=2)
        assert not ended
        assert [m["params"]["data"] for m in _messages(lost)] == [1, 2]
        quiet: list[Any] = []
        while sum(1 for e in quiet if e.comments) < 6:  # 300 ms of keepalives, 3x the deadline
            more, ended = await read_events(response, until=1)
            assert not ended, "closed for polling"
            quiet += more
        assert _messages(quiet) == []
        call.end.set()
        rest, ended = await read_events(response)
        assert ended
        assert _messages(rest) == [_result(7)]
        drops.set()
        await eventually(lambda: gw.app[REGISTRY].tasks == 0)


class _EndLater:
    """A call that sends *messages* and its result at once, and ends its body only once
    ``body_done`` is set: the stream's end is then a store call of its own."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages = messages
        self.body_done = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for message in [*self.messages, _result(body["id"])]:
            await response.write(f"data: {json.dumps(message)}\n\n".encode())
        await asyncio.wait_for(self.body_done.wait(), DEADLINE_S)
        return response


async def test_an_end_the_store_missed_is_stored_once_it_is_back(
    upstream, gateway, http, monkeypatch
):
    """Every event was stored but the terminal marker: the store failed at the very end. The
    marker is stored once the store answers again, so a resume ends (then 204) rather than
    waiting for an end that never comes."""
    call = _EndLater([_notification(0)])
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = call.handle
        store = gw.app[STREAMS].ctx.store
        finish, down = store.finish, asyncio.Event()
        down.set()

        async def finishing(*args: Any, **kwargs: Any) -> None:
            if down.is_set():
                raise StoreUnavailable("down (test)")
            await finish(*args, **kwargs)

        monkeypatch.setattr(store, "finish", finishing)
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        first, _ = await read_events(response, until=3)  # priming, notification, result
        assert _messages(first) == [_notification(0), _result(7)]
        last = first[-1].id
        response.close()
        call.body_done.set()
        await eventually(lambda: not _attached(gw) and gw.app[REGISTRY].request_pumps == 0)
        resumed = await http.get(gw.mcp_url, headers=_headers(**{"Last-Event-ID": last}))
        assert resumed.status == 200
        down.clear()  # the store is back: the marker is stored, and the resume ends
        events, ended = await read_events(resumed)
        assert ended
        assert _messages(events) == []
        done = await http.get(gw.mcp_url, headers=_headers(**{"Last-Event-ID": last}))
        assert done.status == 204
        await eventually(lambda: gw.app[REGISTRY].tasks == 0)


async def test_a_drain_does_not_wait_for_an_end_the_store_missed(
    upstream, gateway, http, monkeypatch
):
    """The store cannot take a call's end marker, and the replica drains: the drain waits for
    upstream requests, not for the store (the marker's retry is cancelled at once), so it is
    not held for its whole timeout."""
    call = _EndLater([])
    async with gateway(upstream.url, server={"drain_timeout_s": 600}) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = call.handle
        store = gw.app[STREAMS].ctx.store
        tried = asyncio.Event()

        async def finishing(*args: Any, **kwargs: Any) -> None:
            tried.set()
            raise StoreUnavailable("down (test)")

        monkeypatch.setattr(store, "finish", finishing)
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        first, _ = await read_events(response, until=2)  # priming and the result
        assert _messages(first) == [_result(7)]
        call.body_done.set()
        await asyncio.wait_for(tried.wait(), DEADLINE_S)
        await eventually(lambda: gw.app[REGISTRY].request_pumps == 0)
        assert gw.app[REGISTRY].tasks == 1  # the marker's retry
        assert await asyncio.wait_for(drain(gw.app), DEADLINE_S) == 0
        assert gw.app[REGISTRY].tasks == 0


async def test_a_call_whose_session_is_deleted_after_its_client_left_is_no_longer_read(
    upstream, gateway, http
):
    """The client left, then DELETE dropped the call's stream: nothing can ever read what the
    upstream still sends (a resume gets 404), so the gateway stops reading it (closing the
    upstream request) instead of buffering it for no one until the upstream is done."""
    go_on, cut = asyncio.Event(), asyncio.Event()
    blob = "x" * 4096

    async def tool(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"data: {json.dumps(_notification(0))}\n\n".encode())
        await asyncio.wait_for(go_on.wait(), DEADLINE_S)
        try:
            for index in range(10_000):  # at most ~40 MiB, ~20 s
                note = {**_notification(index), "params": {"data": index, "blob": blob}}
                await response.write(f"data: {json.dumps(note)}\n\n".encode())
                await asyncio.sleep(0.002)
        except (ConnectionError, asyncio.CancelledError):
            cut.set()  # the gateway closed the request: cancelled, or the write failed
            raise
        return response

    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = tool
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        first, _ = await read_events(response, until=2)  # priming and the first notification
        response.close()  # the client goes away
        await eventually(lambda: not _attached(gw))

        async def deleted(request: web.Request) -> web.StreamResponse:
            return web.Response(status=200)

        upstream.routes["/mcp"] = deleted
        assert (await http.delete(gw.mcp_url, headers=_headers())).status == 200
        go_on.set()
        await asyncio.wait_for(cut.wait(), DEADLINE_S)
        gone = await http.get(gw.mcp_url, headers=_headers(**{"Last-Event-ID": first[-1].id}))
        assert gone.status == 404
        await eventually(lambda: gw.app[REGISTRY].tasks == 0)


def _attached(gw) -> bool:
    """Whether a client connection of *gw* reads any stream."""
    return bool(gw.app[REGISTRY].attachments())


async def test_upstream_break_gives_jsonrpc_error_for_each_pending_request(upstream, gateway, http):
    async def breaks(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"data: {json.dumps(_notification(0))}\n\n".encode())
        await response.write(f"data: {json.dumps(_result(2))}\n\n".encode())
        request.transport.close()  # the upstream dies mid-call
        return response

    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = breaks
        batch = [_call(1), _call(2), _call(3)]
        response = await http.post(gw.mcp_url, json=batch, headers=_headers())
        events, ended = await read_events(response)
    assert ended
    messages = _messages(events)
    assert messages[1] == _result(2)
    errors = {m["id"]: m["error"] for m in messages if "error" in m}
    assert set(errors) == {1, 3}
    assert {e["code"] for e in errors.values()} == {jsonrpc.UPSTREAM_STREAM_BROKEN}


async def test_resumable_upstream_is_resumed_with_its_own_last_event_id(upstream, gateway, http):
    """An upstream with an event store primes, closes on purpose, and expects a GET."""

    async def primes_and_closes(request: web.Request) -> web.StreamResponse:
        if request.method == "POST":
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b"id: up-0\nretry: 10\ndata:\n\n")
            await response.write(f"id: up-1\ndata: {json.dumps(_notification(0))}\n\n".encode())
            return response
        assert request.headers["Last-Event-ID"] == "up-1"
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"id: up-2\ndata: {json.dumps(_result(7))}\n\n".encode())
        return response

    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = primes_and_closes
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        events, ended = await read_events(response)
    assert ended
    assert _messages(events) == [_notification(0), _result(7)]
    assert [r["method"] for r in upstream.requests][-2:] == ["POST", "GET"]
    assert upstream.header(len(upstream.requests) - 1, "Mcp-Session-Id") == [SESSION]


async def test_newer_resume_replaces_the_older_connection(upstream, gateway, http):
    call = ToolCall(4, pause_after=2)
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = call.handle
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        first, _ = await read_events(response, until=3)
        older = await http.get(gw.mcp_url, headers=_headers(**{"Last-Event-ID": first[-1].id}))
        await read_events(older, until=1)
        newer = await http.get(gw.mcp_url, headers=_headers(**{"Last-Event-ID": first[-1].id}))
        await read_events(newer, until=1)
        closed, ended = await read_events(older)
        assert ended
        assert closed[-1].retry == 1000
        call.resume.set()
        rest, ended = await read_events(newer)
    assert ended
    assert _messages(rest)[-1] == _result(7)


async def test_keepalive_comments_on_an_idle_stream(upstream, gateway, http):
    call = ToolCall(1, pause_after=1)
    async with gateway(upstream.url, sse={"keepalive_s": 0.05}) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = call.handle
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        events, _ = await read_events(response, until=4)
        call.resume.set()
        rest, _ = await read_events(response)
    assert any("keepalive" in e.comments for e in events + rest)
    assert _messages(events + rest)[-1] == _result(7)


async def test_parse_helper_is_independent():
    assert parse(b"id: a\r\ndata: x\r\n\r\n: c\n\n")[0].id == "a"


class StandaloneUpstream:
    """The upstream's GET stream: sends what the test queues; counts GETs; closes on demand."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.gets = 0
        self.authorizations: list[str | None] = []
        self.opened = asyncio.Condition()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert request.method == "GET"
        assert "Last-Event-ID" not in request.headers
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        async with self.opened:
            self.gets += 1
            self.authorizations.append(request.headers.get("Authorization"))
            self.opened.notify_all()
        while (item := await self.queue.get()) is not None:
            await response.write(item)
        return response

    async def wait_gets(self, count: int) -> None:
        async with self.opened:
            await asyncio.wait_for(self.opened.wait_for(lambda: self.gets >= count), DEADLINE_S)

    def send(self, index: int) -> None:
        self.queue.put_nowait(f"data: {json.dumps(_notification(index))}\n\n".encode())


async def test_standalone_stream_is_stored_while_the_client_is_away(upstream, gateway, http):
    standalone = StandaloneUpstream()
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = standalone.handle
        response = await http.get(gw.mcp_url, headers=_headers())
        assert response.status == 200
        await standalone.wait_gets(1)
        standalone.send(0)
        first, _ = await read_events(response, until=2)
        response.close()
        standalone.send(1)
        standalone.send(2)
        standalone.queue.put_nowait(None)  # the upstream closes its GET: the gateway re-opens it
        await standalone.wait_gets(2)
        standalone.send(3)
        resumed = await http.get(gw.mcp_url, headers=_headers(**{"Last-Event-ID": first[-1].id}))
        got, _ = await read_events(resumed, until=4)
        resumed.close()
        standalone.queue.put_nowait(None)
    indexes = [m["params"]["data"] for m in _messages(first) + _messages(got)]
    assert indexes == [0, 1, 2, 3]
    lives = {parse_event_id(e.id).life for e in first + got if e.id}
    assert len(lives) == 1  # one stream life for the whole session


async def test_standalone_plain_get_replaces_the_older_connection(upstream, gateway, http):
    standalone = StandaloneUpstream()
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = standalone.handle
        older = await http.get(gw.mcp_url, headers=_headers())
        await standalone.wait_gets(1)
        standalone.send(0)
        await read_events(older, until=2)
        newer = await http.get(gw.mcp_url, headers=_headers())
        closed, ended = await read_events(older)
        assert ended
        assert closed[-1].retry == 1000
        standalone.send(1)
        got, _ = await read_events(newer, until=2)
        newer.close()
        assert standalone.gets == 1  # still one upstream GET for the session
    assert [m["params"]["data"] for m in _messages(got)] == [1]  # starts at the live end


async def test_standalone_upstream_405_is_relayed(upstream, gateway, http):
    async def no_get(request: web.Request) -> web.StreamResponse:
        return web.Response(status=405, headers={"Allow": "POST, DELETE"})

    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = no_get
        response = await http.get(gw.mcp_url, headers=_headers())
        assert response.status == 405
        assert response.headers["Allow"] == "POST, DELETE"


async def test_injected_line_break_in_last_event_id_gets_400(upstream, gateway, http):
    """A raw request (clients refuse to send it) with a bare CR inside Last-Event-ID."""
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(
            b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nMcp-Session-Id: "
            + SESSION.encode()
            + b"\r\nLast-Event-ID: "
            + b"f" * 32
            + b"-1\revent: injected\r\n"
            b"Connection: close\r\n\r\n"
        )
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), DEADLINE_S)
        writer.close()
    status = answer.split(b"\r\n", 1)[0]
    assert status.split()[1] == b"400"
    assert b"injected" not in answer


@pytest.mark.parametrize(
    ("total", "size"),
    # 24 MB either way: more than loopback socket buffers hold. Small events' writes each fit
    # the transport's buffer until it fills: they go without a timer until then.
    [(120, 200_000), (6_000, 4_000)],
    ids=["large events", "small events"],
)
async def test_slow_reader_is_cut_without_stalling_the_pump(upstream, gateway, http, total, size):
    """A client that stops reading is cut after slow_reader_cut_s and resumes from the store."""
    pumped = asyncio.Event()

    async def flood(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for index in range(total):
            message = {**_notification(index), "pad": "x" * size}
            await response.write(f"data: {json.dumps(message)}\n\n".encode())
        await response.write(f"data: {json.dumps(_result(7))}\n\n".encode())
        pumped.set()
        return response

    async with gateway(upstream.url, sse={"slow_reader_cut_s": 0.3}) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = flood
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        first, _ = await read_events(response, until=1)  # the priming event, then stop reading
        # The upstream is read to the end while this client reads nothing.
        await asyncio.wait_for(pumped.wait(), DEADLINE_S)
        await eventually(lambda: not gw.app[REGISTRY].attachments())
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()  # cut mid-stream, not delivered to the end
        resumed = await http.get(gw.mcp_url, headers=_headers(**{"Last-Event-ID": first[0].id}))
        rest, ended = await read_events(resumed, timeout_s=30)
    assert ended
    messages = _messages(rest)
    assert [m["params"]["data"] for m in messages if "method" in m] == list(range(total))
    assert messages[-1] == _result(7)


async def test_streams_per_session_bound_refuses_before_forwarding(upstream, gateway, http):
    call = ToolCall(1, pause_after=0)
    async with gateway(upstream.url, store={"max_streams_per_session": 1}) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = call.handle
        first = await http.post(gw.mcp_url, json=_call(1), headers=_headers())
        await read_events(first, until=1)
        forwarded = len(upstream.requests)
        refused = await http.post(gw.mcp_url, json=_call(2), headers=_headers())
        assert refused.status == 503
        assert refused.headers["Retry-After"] == "1"
        refusal = await refused.json()
        assert refusal["error"]["message"] == "Too many open streams"
        assert refusal["id"] == 2  # the refused request's own id
        assert len(upstream.requests) == forwarded  # nothing forwarded
        call.resume.set()
        await read_events(first)


async def test_json_answers_leave_no_stream_behind(upstream, gateway, http):
    async def json_answer(request: web.Request) -> web.StreamResponse:
        return web.json_response(_result((await request.json())["id"]))

    async with gateway(upstream.url, store={"max_streams_per_session": 1}) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = json_answer
        for request_id in range(3):
            response = await http.post(gw.mcp_url, json=_call(request_id), headers=_headers())
            assert await response.json() == _result(request_id)


async def test_event_over_the_size_bound_ends_the_call_with_an_error(upstream, gateway, http):
    async def huge(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"data: {json.dumps(_notification(0))}\n\n".encode())
        await response.write(b"data: " + b"x" * 5000 + b"\n\n")
        return response

    async with gateway(upstream.url, store={"max_event_bytes": 1000}) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = huge
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        events, ended = await read_events(response)
    assert ended
    messages = _messages(events)
    assert messages[0] == _notification(0)
    assert messages[-1]["error"]["code"] == jsonrpc.UPSTREAM_STREAM_BROKEN
    assert messages[-1]["id"] == 7


async def test_metrics_count_stored_and_delivered_events(upstream, gateway, http):
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = ToolCall(3).handle
        response = await http.post(gw.mcp_url, json=_call(), headers=_headers())
        await read_events(response)
        registry = gw.app[METRICS].registry
        # The pump counts after its stream finished, which may be just after the client's EOF.
        await eventually(lambda: registry.get_sample_value("mcp_sse_gateway_events_stored_total"))
        metrics = await (await http.get(gw.base_url + "/metrics")).text()
    assert "mcp_sse_gateway_events_stored_total 4.0" in metrics
    assert "mcp_sse_gateway_events_delivered_total 4.0" in metrics
    assert 'mcp_sse_gateway_stream_connections_ended_total{reason="finished"} 1.0' in metrics


async def test_standalone_pump_stops_when_the_session_goes_idle(upstream, gateway, http):
    standalone = StandaloneUpstream()
    async with gateway(upstream.url, store={"session_idle_ttl_s": 0.4}) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = standalone.handle
        response = await http.get(gw.mcp_url, headers=_headers())
        await standalone.wait_gets(1)
        assert gw.app[STREAMS].standalone.pumps
        response.close()
        # No request refreshes the session: its record expires and the pump lets go.
        await eventually(lambda: not gw.app[STREAMS].standalone.pumps, timeout_s=DEADLINE_S)
        standalone.queue.put_nowait(None)


async def test_concurrent_plain_gets_open_one_upstream_get(upstream, gateway, http):
    standalone = StandaloneUpstream()
    async with gateway(upstream.url) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = standalone.handle
        responses = await asyncio.gather(
            *(http.get(gw.mcp_url, headers=_headers()) for _ in range(4))
        )
        await standalone.wait_gets(1)
        standalone.send(0)
        last = responses[-1]
        for response in responses:
            response.close()
        assert standalone.gets == 1
        assert last.status == 200
        standalone.queue.put_nowait(None)


async def test_standalone_reopens_with_the_newest_client_credentials(upstream, gateway, http):
    standalone = StandaloneUpstream()
    async with gateway(upstream.url, sse={"retry_ms": 0}) as gw:
        await _initialize(upstream, http, gw)
        upstream.routes["/mcp"] = standalone.handle
        first = await http.get(gw.mcp_url, headers=_headers(Authorization="Bearer OLD"))
        await standalone.wait_gets(1)
        second = await http.get(gw.mcp_url, headers=_headers(Authorization="Bearer NEW"))
        await read_events(first)  # replaced by the newer connection
        standalone.queue.put_nowait(None)  # the upstream closes its GET: re-opened
        await standalone.wait_gets(2)
        second.close()
        standalone.queue.put_nowait(None)
    assert standalone.authorizations[:2] == ["Bearer OLD", "Bearer NEW"]
    # The newer GET joined the open upstream GET: its credentials were checked first (D8).
    assert [dict(headers).get("Authorization") for headers in upstream.pings] == ["Bearer NEW"]


@pytest.mark.redis
async def test_standalone_stream_that_lost_events_starts_again_and_old_cursors_get_400(
    upstream, gateway, http, private_redis
):
    """Redis refuses writes (out of memory) while the standalone stream receives: the event is
    lost, so the stream life starts again after every offset it used; a cursor from before the
    gap gets 400 (never a silent gap), and a new GET receives what follows."""
    standalone = StandaloneUpstream()
    store = {"backend": "redis", "redis_url": private_redis.url, "key_prefix": uuid.uuid4().hex}
    admin = aioredis.Redis.from_url(private_redis.url)
    try:
        async with gateway(upstream.url, store=store, sse={"retry_ms": 100}) as gw:
            await _initialize(upstream, http, gw)
            upstream.routes["/mcp"] = standalone.handle
            response = await http.get(gw.mcp_url, headers=_headers())
            await standalone.wait_gets(1)
            standalone.send(0)
            first, _ = await read_events(response, until=2)
            cursor = first[-1].id
            await admin.config_set("maxmemory-policy", "noeviction")
            await admin.config_set("maxmemory", "1")
            standalone.send(1)  # cannot be stored
            registry = gw.app[METRICS].registry
            await eventually(
                lambda: registry.get_sample_value("mcp_sse_gateway_streams_store_lost_total")
            )
            await admin.config_set("maxmemory", "0")
            # The attached connection ends (with retry) once the life started again ...
            _, ended = await read_events(response, timeout_s=DEADLINE_S)
            assert ended
            # ... and its cursor is refused: event 1 was lost, and that is not hidden.
            resumed = await http.get(gw.mcp_url, headers=_headers(**{"Last-Event-ID": cursor}))
            assert resumed.status == 400
            await standalone.wait_gets(2)
            fresh = await http.get(gw.mcp_url, headers=_headers())
            assert fresh.status == 200
            await read_events(fresh, until=1)  # priming: attached
            standalone.send(2)
            got, _ = await read_events(fresh, until=1)
            fresh.close()
            standalone.queue.put_nowait(None)
        assert [m["params"]["data"] for m in _messages(got)] == [2]
        old, new = parse_event_id(cursor), parse_event_id(next(e.id for e in got if e.data))
        assert new.life == old.life
        assert new.offset > old.offset
    finally:
        await admin.aclose()
