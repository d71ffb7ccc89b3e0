"""Property-based fuzzing of every client-controlled input on the MCP endpoint (hypothesis).

Each input gets its own test; every example is one real request over loopback (a raw socket,
so any byte can be sent) to one gateway in front of a scripted upstream. What must hold, for
every example:

* the gateway answers 5xx itself only as its documented 502 or 503 (with a JSON-RPC body);
* it never crashes (``/healthz`` answers after every example) and never echoes the input;
* once the upstream requests have ended, its task count returns to the baseline.

Seeded (:data:`FUZZ_SEED`, ``GATEWAY_FUZZ_SEED`` to vary): the same cases every run.
``GATEWAY_FUZZ_EXAMPLES`` sets the cases per input: 200 in ``.ci/run``; the deep profile is
``GATEWAY_FUZZ_EXAMPLES=10000 SKIP_INSTALL=1 .ci/run -k fuzz``.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from mcp_sse_gateway.web.keys import REGISTRY
from tests.support.waiting import eventually

FUZZ_EXAMPLES = int(os.environ.get("GATEWAY_FUZZ_EXAMPLES", "200"))
SESSION = "fuzz-session-0123456789"
ANSWER_DEADLINE_S = 10.0
#: Inputs shorter than this may occur in any answer by chance; longer ones must never.
ECHO_MIN_LEN = 12
#: 5xx statuses the gateway documents answering itself.
DOCUMENTED_5XX = {502, 503}

pytestmark = pytest.mark.timeout(max(120, FUZZ_EXAMPLES * 0.1))

#: The seed of every fuzz test: the same cases every run (``GATEWAY_FUZZ_SEED`` to vary).
FUZZ_SEED = int(os.environ.get("GATEWAY_FUZZ_SEED", "20261201"))
FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)

#: Header values: printable ASCII mostly, some Latin-1, tabs, and now and then CR, LF or NUL
#: (which break the HTTP framing: the gateway's HTTP parser must refuse them cleanly).
_header_bytes = st.one_of(
    st.binary(max_size=200).map(lambda b: bytes(c for c in b if c >= 0x20 or c == 9)),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=300).map(
        str.encode
    ),
    st.binary(max_size=40),
    st.sampled_from(
        [b"", b" ", b"\t", b"*/*", b"text/event-stream", b"application/json", b"null", b"\xff"]
    ),
)
#: Values that occur in the gateway's own answers anyway (not an echo).
_VOCABULARY = (
    b"text/event-stream application/json, text/event-stream Content-Type application/json "
    b"mcp-sse-gateway"
)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(children, max_size=5) | st.dictionaries(
        st.text(max_size=10), children, max_size=5
    )


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    _containers,
    max_leaves=30,
)


def _deep(depth: int) -> bytes:
    return b'{"jsonrpc":"2.0","id":1,"method":"x","params":' + b"[" * depth + b"]" * depth + b"}"


_bodies = st.one_of(
    st.binary(max_size=2000),
    _json_values.map(lambda v: json.dumps(v).encode()),
    st.builds(
        lambda method, rid, params: json.dumps(
            {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        ).encode(),
        st.sampled_from(["tools/call", "ping", "initialize", "notifications/x", ""]),
        st.one_of(st.integers(), st.text(max_size=10), st.none(), st.lists(st.integers())),
        _json_values,
    ),
    st.lists(
        st.fixed_dictionaries(
            {"jsonrpc": st.just("2.0"), "id": st.integers(0, 9), "method": st.just("ping")}
        ),
        max_size=20,
    ).map(lambda batch: json.dumps(batch).encode()),
    st.integers(1, 100_000).map(_deep),
    st.integers(0, 300_000).map(lambda n: b'{"jsonrpc":"2.0","id":1,"method":"' + b"a" * n + b'"}'),
)


def _sse_answer(request_id: Any) -> bytes:
    note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"n": 1}}
    result = {"jsonrpc": "2.0", "id": request_id, "result": {}}
    return f"data: {json.dumps(note)}\n\ndata: {json.dumps(result)}\n\n".encode()


async def _upstream_mcp(request: web.Request) -> web.StreamResponse:
    """A plain MCP server: JSON initialize, SSE answers to requests, 202 for the rest.

    It never echoes what it received, so an echo in an answer can only be the gateway's, and
    never answers 5xx, so a 5xx can only be the gateway's own.
    """
    if request.method == "GET":
        return web.Response(status=405)
    if request.method == "DELETE":
        return web.Response(status=200)
    try:
        message = json.loads(await request.read())
    except (ValueError, RecursionError):
        return web.json_response({"error": "parse"}, status=400)
    if isinstance(message, dict) and message.get("method") == "initialize":
        result = {"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {}}
        return web.json_response(
            {"jsonrpc": "2.0", "id": 0, "result": result}, headers={"Mcp-Session-Id": SESSION}
        )
    if isinstance(message, dict) and "method" in message and "id" in message:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(_sse_answer(message["id"]))
        return response
    return web.Response(status=202)


class Target:
    """The gateway under fuzz and what the cases got."""

    def __init__(self, port: int, app: web.Application) -> None:
        self.port = port
        self.app = app
        self.statuses: collections.Counter[int] = collections.Counter()
        self.cursor = ""

    async def send(self, head: bytes, body: bytes = b"") -> tuple[int, bytes]:
        """One request on a fresh connection; the status (0: closed unanswered) and all bytes."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(head + body)
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), ANSWER_DEADLINE_S)
        except (ConnectionResetError, BrokenPipeError):
            answer = b""
        finally:
            writer.close()
        status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.") else 0
        self.statuses[status] += 1
        return status, answer


def _request(
    method: str, headers: dict[str, bytes], body: bytes = b"", *, length: bool = True
) -> bytes:
    lines = [f"{method} /mcp HTTP/1.1".encode()]
    for name, value in headers.items():
        lines.append(name.encode() + b": " + value)
    lines.append(b"Connection: close")
    if length and (method == "POST" or body):
        lines.append(b"Content-Length: " + str(len(body)).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n"


_BASE = {
    "Host": b"127.0.0.1",
    "Accept": b"application/json, text/event-stream",
    "Content-Type": b"application/json",
}
_CALL = b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"t"}}'


@pytest.fixture
async def target(upstream, gateway):
    upstream.routes["/mcp"] = _upstream_mcp
    async with gateway(
        upstream.url,
        server={"header_timeout_s": 2, "body_timeout_s": 2, "max_body_bytes": 1024 * 1024},
    ) as gw:
        fuzzed = Target(gw.port, gw.app)
        init = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}'
        status, _ = await fuzzed.send(_request("POST", _BASE, init), init)
        assert status == 200
        call_headers = {**_BASE, "Mcp-Session-Id": SESSION.encode()}
        status, answer = await fuzzed.send(_request("POST", call_headers, _CALL), _CALL)
        assert status == 200
        fuzzed.cursor = next(
            line[4:].decode() for line in answer.split(b"\n") if line.startswith(b"id: ")
        )
        await eventually(lambda: gw.app[REGISTRY].tasks == 0, timeout_s=ANSWER_DEADLINE_S)
        baseline = len(asyncio.all_tasks())
        fuzzed.statuses.clear()
        yield fuzzed
        # Pumps outlive their requests by design (D1): they end when their upstream answers.
        await eventually(lambda: gw.app[REGISTRY].tasks == 0, timeout_s=ANSWER_DEADLINE_S)
        await eventually(lambda: len(asyncio.all_tasks()) <= baseline, timeout_s=ANSWER_DEADLINE_S)
        print(f"\nfuzz cases by status: {dict(sorted(fuzzed.statuses.items()))}")


async def _check(target: Target, status: int, answer: bytes, value: bytes) -> None:
    assert status != 0 or not answer, "answered without a status line"
    if status >= 500:
        assert status in DOCUMENTED_5XX, answer[:300]
        body = answer.partition(b"\r\n\r\n")[2]
        assert json.loads(body)["jsonrpc"] == "2.0"
    if len(value) >= ECHO_MIN_LEN and value.strip() and value not in _VOCABULARY:
        assert value not in answer, "input echoed"
    health, _ = await target.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    target.statuses[health] -= 1
    assert health == 200


def _with(name: str, value: bytes) -> dict[str, bytes]:
    return {**_BASE, "Mcp-Session-Id": SESSION.encode(), name: value}


@FUZZ
@seed(FUZZ_SEED)
@given(value=st.one_of(_header_bytes, st.integers(0, 2**64).map(str).map(str.encode)))
async def test_fuzz_last_event_id(target, value):
    cursor = value
    if value.isdigit():  # a real stream life with an arbitrary offset
        cursor = target.cursor.rsplit("-", 2)[0].encode() + b"-" + value
    status, answer = await target.send(_request("GET", _with("Last-Event-ID", cursor)))
    # A valid cursor is the start of the ids that follow it: not an echo.
    await _check(target, status, answer, b"" if value.isdigit() else cursor)


@FUZZ
@seed(FUZZ_SEED)
@given(value=_header_bytes)
async def test_fuzz_session_id(target, value):
    headers = {**_BASE, "Mcp-Session-Id": value}
    status, answer = await target.send(_request("POST", headers, _CALL), _CALL)
    await _check(target, status, answer, value)


@pytest.mark.parametrize(
    "name", ["Accept", "Content-Type", "Origin", "Host", "Authorization", "Cookie"]
)
@FUZZ
@seed(FUZZ_SEED)
@given(value=_header_bytes)
async def test_fuzz_request_headers(target, name, value):
    status, answer = await target.send(_request("POST", _with(name, value), _CALL), _CALL)
    await _check(target, status, answer, value)


@FUZZ
@seed(FUZZ_SEED)
@given(body=_bodies, method=st.sampled_from(["POST", "POST", "DELETE"]))
async def test_fuzz_bodies(target, body, method):
    headers = {**_BASE, "Mcp-Session-Id": SESSION.encode()} if method == "POST" else _BASE
    status, answer = await target.send(_request(method, headers, body), body)
    await _check(target, status, answer, body[:200])
