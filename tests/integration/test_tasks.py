"""The Tasks extension served by the gateway (DESIGN D11), against the real example server.

The example server (the official Python SDK, no Tasks support, no event store) runs as a
process; the gateway runs with ``deploy/examples/tasks.toml``'s ``[tasks]`` section, on the
store under test (memory, or Redis with ``GATEWAY_TEST_STORE=redis``: the fixture then checks
that every key it wrote expires). The client is raw HTTP of the 2026-07-28 era
(:mod:`tests.support.modern_client`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import select
import subprocess
import sys
import threading
import time
import tomllib
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from mcp_sse_gateway import jsonrpc
from mcp_sse_gateway.web.keys import METRICS, STREAMS
from tests.support import modern_client as mc
from tests.support.mcp_http import open_session
from tests.support.processes import stop_popen
from tests.support.sse_client import json_messages, read_events
from tests.support.waiting import eventually

TASKS_TOML = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "tasks.toml"
TASKS = tomllib.loads(TASKS_TOML.read_text())["tasks"]
#: Faster polling than the default, so cancellations from "elsewhere" are seen quickly.
SETTINGS = {**TASKS, "poll_interval_ms": 100}
START_TIMEOUT_S, STOP_TIMEOUT_S = 30.0, 10.0


@pytest.fixture(scope="module")
def example() -> Iterator[str]:
    """The example server, one process for the module's tests (each test has its gateway)."""
    command = [sys.executable, "-m", "mcp_sse_gateway.example", "--host", "127.0.0.1"]
    process = subprocess.Popen(
        [*command, "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert process.stdout is not None
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        line = b""
        while not line.startswith(b"LISTENING "):
            ready, _, _ = select.select([process.stdout], [], [], deadline - time.monotonic())
            if not ready or process.poll() is not None:
                raise RuntimeError("the example server did not announce itself")
            line = process.stdout.readline()
        # Whatever it prints later is read, so its pipe never fills.
        threading.Thread(target=process.stdout.read, daemon=True).start()
        yield line.split()[1].decode()
    finally:
        stop_popen(process, STOP_TIMEOUT_S)


def _text(detailed: dict[str, Any]) -> str:
    return str(detailed["result"]["content"][0]["text"])


async def test_a_task_runs_upstream_and_its_result_is_inlined(example, gateway, http):
    async with gateway(example, tasks=SETTINGS) as gw:
        created = await mc.call(
            http, gw.mcp_url, "tools/call", {"name": "slow_compute", "arguments": {"seconds": 0.5}}
        )
        assert created["resultType"] == "task"
        assert created["status"] == "working"
        assert created["ttlMs"] == TASKS.get("default_ttl_ms", 3_600_000)
        assert isinstance(created["pollIntervalMs"], int)
        working = await mc.call(http, gw.mcp_url, "tasks/get", {"taskId": created["taskId"]})
        assert working["status"] == "working"
        assert "result" not in working
        done = await mc.poll(http, gw.mcp_url, created["taskId"])
        metrics = gw.app[METRICS]
        assert metrics.tasks_settled.labels("completed")._value.get() == 1
    assert done["status"] == "completed"
    assert done["resultType"] == "complete"
    assert _text(done) == "Computed result in 0.5 s"
    assert done["lastUpdatedAt"] >= done["createdAt"]


async def test_tool_errors_complete_and_protocol_errors_fail(example, gateway, http):
    async with gateway(example, tasks=SETTINGS) as gw:
        tool_error = await mc.call(http, gw.mcp_url, "tools/call", {"name": "failing_job"})
        protocol = await mc.call(http, gw.mcp_url, "tools/call", {"name": "protocol_error_job"})
        errored = await mc.poll(http, gw.mcp_url, tool_error["taskId"])
        failed = await mc.poll(http, gw.mcp_url, protocol["taskId"])
    assert errored["status"] == "completed"
    assert errored["result"]["isError"] is True
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == -32603  # the upstream's own error, inlined
    assert "result" not in failed


async def test_input_required_then_partial_answers_then_the_call_is_reissued(
    example, gateway, http
):
    async with gateway(example, tasks=SETTINGS) as gw:
        created = await mc.call(http, gw.mcp_url, "tools/call", {"name": "multi_input"})
        task_id = created["taskId"]
        waiting = await mc.poll(http, gw.mcp_url, task_id, until={"input_required"})
        assert set(waiting["inputRequests"]) == {"name", "confirm"}
        assert "requestState" not in waiting
        first = {"name": {"action": "accept", "content": {"name": "Ada"}}, "bogus": {}}
        ack = await mc.call(
            http, gw.mcp_url, "tasks/update", {"taskId": task_id, "inputResponses": first}
        )
        assert ack == {"resultType": "complete"}
        partial = await mc.call(http, gw.mcp_url, "tasks/get", {"taskId": task_id})
        assert partial["status"] == "input_required"
        assert set(partial["inputRequests"]) == {"confirm"}
        second = {"confirm": {"action": "accept", "content": {"confirm": True}}}
        await mc.call(
            http, gw.mcp_url, "tasks/update", {"taskId": task_id, "inputResponses": second}
        )
        done = await mc.poll(http, gw.mcp_url, task_id)
    assert done["status"] == "completed"
    assert _text(done) == "Thanks, Ada"


async def test_an_input_request_at_once_is_relayed_before_any_task(example, gateway, http):
    async with gateway(example, tasks=SETTINGS) as gw:
        round1 = await mc.call(http, gw.mcp_url, "tools/call", {"name": "test_tool_with_task"})
        assert round1["resultType"] == "input_required"
        assert "taskId" not in round1
        (key,) = round1["inputRequests"]
        answers = {key: {"action": "accept", "content": {"name": "Alice"}}}
        params = {"name": "test_tool_with_task", "inputResponses": answers}
        if "requestState" in round1:
            params["requestState"] = round1["requestState"]
        round2 = await mc.call(http, gw.mcp_url, "tools/call", params)
        assert round2["resultType"] == "task"
        assert "requestState" not in round2
        done = await mc.poll(http, gw.mcp_url, round2["taskId"])
        created = gw.app[METRICS].tasks_created._value.get()
    assert _text(done) == "Hello, Alice!"
    assert created == 1


async def test_cancel_closes_the_upstream_request_and_is_idempotent(upstream, gateway, http):
    closed = asyncio.Event()

    async def forever(request: web.Request) -> web.StreamResponse:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            closed.set()  # the gateway closed the upstream request
            raise
        return web.json_response({})

    upstream.routes["/mcp"] = forever
    async with gateway(upstream.url, tasks=SETTINGS) as gw:
        created = await mc.call(http, gw.mcp_url, "tools/call", {"name": "slow_compute"})
        await asyncio.wait_for(_upstream_called(upstream), 10)
        ack = await mc.call(http, gw.mcp_url, "tasks/cancel", {"taskId": created["taskId"]})
        assert ack == {"resultType": "complete"}
        await asyncio.wait_for(closed.wait(), 10)
        again = await mc.call(http, gw.mcp_url, "tasks/cancel", {"taskId": created["taskId"]})
        status = await mc.call(http, gw.mcp_url, "tasks/get", {"taskId": created["taskId"]})
        assert gw.app[STREAMS].tasks.running == 0
    assert again == {"resultType": "complete"}
    assert status["status"] == "cancelled"


async def _upstream_called(upstream: Any) -> None:
    while not upstream.requests:
        await asyncio.sleep(0.01)


async def test_the_task_surface_is_gated_on_the_clients_declaration(example, gateway, http):
    async with gateway(example, tasks=SETTINGS) as gw:
        sync = await mc.call(
            http,
            gw.mcp_url,
            "tools/call",
            {"name": "slow_compute", "arguments": {"seconds": 0}},
            declare_tasks=False,
        )
        assert sync.get("resultType") != "task"
        assert sync["content"][0]["text"].startswith("Computed")
        for method, params in [
            ("tools/call", {"name": "failing_job"}),
            ("tasks/get", {"taskId": "x"}),
            ("tasks/cancel", {"taskId": "x"}),
            ("tasks/update", {"taskId": "x", "inputResponses": {}}),
        ]:
            with pytest.raises(mc.RpcError) as refused:
                await mc.call(http, gw.mcp_url, method, params, declare_tasks=False)
            assert refused.value.code == -32021, method
            assert mc.TASKS in refused.value.data["requiredCapabilities"]["extensions"]
        discovered = await mc.call(http, gw.mcp_url, "server/discover")
    assert mc.TASKS in discovered["capabilities"]["extensions"]


@pytest.mark.parametrize(
    ("method", "params", "code"),
    [
        ("tasks/get", {"taskId": "nope"}, -32602),
        ("tasks/get", {"taskId": 7}, -32602),
        ("tasks/update", {"taskId": "nope", "inputResponses": []}, -32602),
        ("tasks/result", {"taskId": "nope"}, -32601),
        ("tasks/list", {}, -32601),
    ],
)
async def test_bad_task_requests_get_json_rpc_errors(  # noqa: PLR0917 - fixtures, parameters
    example, gateway, http, method, params, code
):
    async with gateway(example, tasks=SETTINGS) as gw:
        with pytest.raises(mc.RpcError) as refused:
            await mc.call(http, gw.mcp_url, method, params)
    assert refused.value.code == code
    assert refused.value.status == 200


async def test_routing_headers_that_disagree_with_the_body_are_refused(example, gateway, http):
    async with gateway(example, tasks=SETTINGS) as gw:
        created = await mc.call(http, gw.mcp_url, "tools/call", {"name": "slow_compute"})
        with pytest.raises(mc.RpcError) as refused:
            await mc.call(
                http,
                gw.mcp_url,
                "tasks/get",
                {"taskId": created["taskId"]},
                headers={"Mcp-Name": "another-task"},
            )
        await mc.call(http, gw.mcp_url, "tasks/cancel", {"taskId": created["taskId"]})
    assert refused.value.code == -32020
    assert refused.value.status == 400


async def test_another_clients_task_is_unknown(example, gateway, http):
    alice, bob = {"Authorization": "Bearer alice"}, {"Authorization": "Bearer bob"}
    async with gateway(example, tasks=SETTINGS) as gw:
        created = await mc.call(
            http, gw.mcp_url, "tools/call", {"name": "slow_compute"}, headers=alice
        )
        task = {"taskId": created["taskId"]}
        for who in (bob, {}):
            for method in ("tasks/get", "tasks/cancel"):
                with pytest.raises(mc.RpcError) as refused:
                    await mc.call(http, gw.mcp_url, method, task, headers=who)
                assert refused.value.code == -32602
        mine = await mc.call(http, gw.mcp_url, "tasks/get", task, headers=alice)
        await mc.call(http, gw.mcp_url, "tasks/cancel", task, headers=alice)
    assert mine["status"] == "working"


async def test_a_legacy_session_is_served_as_before(example, gateway, http):
    async with gateway(example, tasks=SETTINGS) as gw:
        session = await open_session(http, gw.mcp_url)
        call = {
            "jsonrpc": "2.0",
            "id": 5,
            "method": "tools/call",
            "params": {"name": "slow_compute", "arguments": {"seconds": 0.1}},
        }
        response = await http.post(gw.mcp_url, json=call, headers=session)
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events, _ = await read_events(response)
        created = gw.app[METRICS].tasks_created._value.get()
    (answer,) = [m for m in json_messages(events) if m.get("id") == 5]
    assert "taskId" not in answer["result"]
    assert created == 0


async def test_tasks_off_relays_everything(example, gateway, http):
    async with gateway(example) as gw:
        sync = await mc.call(
            http, gw.mcp_url, "tools/call", {"name": "slow_compute", "arguments": {"seconds": 0}}
        )
        with pytest.raises(mc.RpcError) as upstream_said:
            await mc.call(http, gw.mcp_url, "tasks/get", {"taskId": "x"})
    assert "taskId" not in sync
    assert upstream_said.value.code != jsonrpc.UPSTREAM_STREAM_BROKEN  # the upstream's answer


def _jwt(exp: int) -> str:
    """An unsigned JWT of ``alice`` expiring at *exp* (the gateway reads its claims)."""

    def part(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part({'sub': 'alice', 'exp': exp})}.c2ln"


async def test_an_expired_token_is_asked_about_and_the_upstreams_refusal_relayed(
    upstream, gateway, http
):
    async def refuse_expired(request: web.Request) -> web.StreamResponse:
        message = await request.json()
        if message.get("method") == "server/discover":  # the gateway's check, past exp
            return web.json_response(
                {"error": "expired"},
                status=401,
                headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
            )
        result = {"content": [{"type": "text", "text": "done"}]}
        return web.json_response({"jsonrpc": "2.0", "id": message["id"], "result": result})

    upstream.answer_pings = False
    upstream.routes["/mcp"] = refuse_expired
    exp = int(time.time()) + 3  # whole seconds: at least 2 s to create and read the task
    token = {"Authorization": f"Bearer {_jwt(exp)}"}
    async with gateway(upstream.url, tasks=SETTINGS) as gw:
        created = await mc.call(
            http, gw.mcp_url, "tools/call", {"name": "slow_compute"}, headers=token
        )
        task = {"taskId": created["taskId"]}
        fresh = await mc.call(http, gw.mcp_url, "tasks/get", task, headers=token)
        await eventually(lambda: time.time() > exp, timeout_s=10)
        body = mc.request_body("tasks/get", task)
        headers = {**mc.request_headers("tasks/get", task), **token}
        async with http.post(gw.mcp_url, json=body, headers=headers) as refused:
            status, challenge = refused.status, refused.headers.get("WWW-Authenticate")
    assert fresh["status"] in {"working", "completed"}
    assert status == 401
    assert challenge == 'Bearer error="invalid_token"'


def _gzip(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


async def test_compressed_and_streamed_answers_are_read_as_clients_read_them(
    upstream, gateway, http
):
    never_ends = asyncio.Event()

    async def answer(request: web.Request) -> web.StreamResponse:
        message = await request.json()
        reply = {"jsonrpc": "2.0", "id": message["id"]}
        if message["method"] == "server/discover":
            # An SSE stream that stays open after its response.
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            result = {**reply, "result": {"capabilities": {}}}
            await response.write(f"data: {json.dumps(result)}\n\n".encode())
            await never_ends.wait()
            return response
        result = {**reply, "result": {"content": [{"type": "text", "text": "zipped"}]}}
        return web.Response(
            body=_gzip(json.dumps(result).encode()),
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )

    upstream.routes["/mcp"] = answer
    try:
        async with gateway(upstream.url, tasks=SETTINGS) as gw:
            discovered = await asyncio.wait_for(mc.call(http, gw.mcp_url, "server/discover"), 5)
            created = await mc.call(http, gw.mcp_url, "tools/call", {"name": "slow_compute"})
            done = await mc.poll(http, gw.mcp_url, created["taskId"])
    finally:
        never_ends.set()
    assert mc.TASKS in discovered["capabilities"]["extensions"]
    assert _text(done) == "zipped"


async def test_a_discover_answer_the_gateway_cannot_read_is_relayed_or_a_502(
    upstream, gateway, http
):
    async def refuse(request: web.Request) -> web.StreamResponse:
        return web.Response(
            status=401,
            body=_gzip(b'{"error": "no"}'),
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )

    upstream.routes["/mcp"] = refuse
    async with gateway(upstream.url, tasks=SETTINGS) as gw:
        body = mc.request_body("server/discover")
        headers = {**mc.request_headers("server/discover", None), "Accept-Encoding": "gzip"}
        async with http.post(gw.mcp_url, json=body, headers=headers) as response:
            status, decoded = response.status, await response.json()
    assert status == 401
    assert decoded == {"error": "no"}  # relayed with its Content-Encoding: the client decodes


@pytest.mark.parametrize("method", [["tasks/get"], {"a": 1}, 7, None])
async def test_a_request_whose_method_is_not_a_string_is_the_upstreams(
    example, gateway, http, method
):
    async with gateway(example, tasks=SETTINGS) as gw:
        body = {**mc.request_body("tasks/get", {"taskId": "x"}), "method": method}
        headers = mc.request_headers("tasks/get", {"taskId": "x"})
        del headers["Mcp-Method"]
        async with http.post(gw.mcp_url, json=body, headers=headers) as response:
            status = response.status
    assert status < 500
