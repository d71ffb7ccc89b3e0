"""The bundled example MCP server, run as a process and driven by the official ``mcp`` client.

It is the upstream of the gateway's integration and conformance tests, so these tests pin what
those rely on: the ``LISTENING`` announcement, the surface, ordered exactly-once notification
streams, exact large payloads, server-to-client requests, and no resumability of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from mcp import ClientSession, types
from mcp.client.context import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client

from mcp_sse_gateway.example.content import payload_text, sha256_hex
from tests.support.mcp_http import ACCEPT, PROTOCOL_VERSION, initialize_request, open_session
from tests.support.upstream import (
    UpstreamStartError,
    example_upstream_process,
    start_example_upstream,
)

DEADLINE_S = 30
BIG_PAYLOAD_BYTES = 3 * 1024 * 1024
#: The ``clientInfo`` name and ``initialize`` id of this file's raw clients.
CLIENT_NAME, INITIALIZE_ID = "test", 1
INITIALIZE = initialize_request(PROTOCOL_VERSION, client_name=CLIENT_NAME, request_id=INITIALIZE_ID)


@pytest.fixture
async def upstream_url() -> AsyncIterator[str]:
    async with start_example_upstream() as url:
        yield url


@contextlib.asynccontextmanager
async def mcp_session(url: str, **callbacks: Any) -> AsyncIterator[ClientSession]:
    """An initialized official-SDK client session on *url* (SSE events up to 16 MiB)."""
    async with (
        asyncio.timeout(DEADLINE_S),
        streamable_http_client(url, max_sse_event_size=16 * 1024 * 1024) as (read, write),
        ClientSession(read, write, **callbacks) as session,
    ):
        await session.initialize()
        yield session


async def test_announces_a_loopback_url_and_stops_cleanly_on_sigterm() -> None:
    async with example_upstream_process() as upstream:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/mcp", upstream.url)
        assert upstream.port > 0
        process = upstream.process
    assert process.returncode == 0, upstream.stderr_tail()
    assert upstream.stdout_lines == []  # one line on stdout, nothing after it


async def test_custom_path_and_a_failed_start_is_reported() -> None:
    async with start_example_upstream("--path", "/custom/mcp") as url:
        assert url.endswith("/custom/mcp")
        async with mcp_session(url) as session:
            assert (await session.send_ping()) is not None
    with pytest.raises(UpstreamStartError, match="exited with code 2"):
        async with start_example_upstream("--no-such-option"):
            pass


async def test_lists_the_conformance_surface_and_the_gateway_tools(upstream_url: str) -> None:
    async with mcp_session(upstream_url) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        resources = {str(r.uri) for r in (await session.list_resources()).resources}
        templates = {
            t.uri_template for t in (await session.list_resource_templates()).resource_templates
        }
        prompts = {prompt.name for prompt in (await session.list_prompts()).prompts}
    assert {
        "test_simple_text",
        "test_image_content",
        "test_audio_content",
        "test_embedded_resource",
        "test_multiple_content_types",
        "test_tool_with_logging",
        "test_tool_with_progress",
        "test_error_handling",
        "test_sampling",
        "test_elicitation",
        "test_elicitation_sep1034_defaults",
        "test_elicitation_sep1330_enums",
        "test_reconnection",
        "json_schema_2020_12_tool",
        "stream_notifications",
        "big_payload",
        "sleep",
    } <= set(tools)
    assert all(tool.description for tool in tools.values())
    assert tools["json_schema_2020_12_tool"].input_schema["$schema"].endswith("2020-12/schema")
    assert {
        "test://static-text",
        "test://static-binary",
        "test://watched-resource",
        "skill://mcp-sse-gateway/resumable-streams/SKILL.md",
    } <= resources
    assert "test://template/{id}/data" in templates
    assert {
        "test_simple_prompt",
        "test_prompt_with_arguments",
        "test_prompt_with_embedded_resource",
        "test_prompt_with_image",
    } <= prompts


async def test_stream_notifications_arrive_in_order_exactly_once(upstream_url: str) -> None:
    logged: list[int] = []
    progress: list[float] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        assert isinstance(params.data, dict)
        logged.append(params.data["index"])

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        assert total == 50
        progress.append(value)

    async with mcp_session(upstream_url, logging_callback=on_log) as session:
        result = await session.call_tool(
            "stream_notifications",
            {"count": 50, "interval_ms": 1, "payload_bytes": 100},
            progress_callback=on_progress,
        )
    assert not result.is_error
    assert isinstance(result.content[0], types.TextContent)
    assert result.content[0].text == "sent 50 notifications"
    assert logged == list(range(50))
    assert progress == list(range(50))


async def test_big_payload_is_exact_and_verifiable(upstream_url: str) -> None:
    async with mcp_session(upstream_url) as session:
        result = await session.call_tool("big_payload", {"size_bytes": BIG_PAYLOAD_BYTES})
    text, summary = result.content
    assert isinstance(text, types.TextContent)
    assert isinstance(summary, types.TextContent)
    data = text.text.encode("utf-8")
    digest = hashlib.sha256(data).hexdigest()
    assert sha256_hex(text.text) == digest
    assert len(data) == BIG_PAYLOAD_BYTES
    assert result.structured_content == {
        "sha256": digest,
        "bytes": BIG_PAYLOAD_BYTES,
        "characters": len(text.text),
    }
    assert summary.text == f"sha256:{digest}"
    assert text.text == payload_text(BIG_PAYLOAD_BYTES)  # deterministic: same bytes every time
    # The content a proxy has to carry intact: every line-break style and multi-byte UTF-8.
    assert "\r\n" in text.text
    assert re.search("\r[^\n]", text.text)
    assert re.search("[^\r]\n", text.text)
    assert {len(ch.encode()) for ch in text.text} >= {1, 2, 3, 4}


def test_payload_text_options() -> None:
    plain = payload_text(10_000, multiline=False, unicode=False, seed=7)
    assert len(plain.encode()) == 10_000
    assert plain.isascii()
    assert "\n" not in plain
    assert "\r" not in plain
    assert payload_text(10_000, multiline=False, unicode=False, seed=7) == plain
    assert payload_text(10_000, seed=8) != payload_text(10_000, seed=9)
    assert payload_text(0) == ""
    for size in (1, 2, 3, 5, 17):  # never a character cut in half, always the exact size
        assert len(payload_text(size, seed=size).encode("utf-8")) == size


async def test_elicitation_and_sampling_round_trips(upstream_url: str) -> None:
    asked: list[str] = []

    async def on_elicit(
        context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        asked.append(params.message)
        return types.ElicitResult(
            action="accept", content={"username": "ada", "email": "ada@example.org"}
        )

    async def on_sample(
        context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult:
        content = params.messages[0].content
        assert isinstance(content, types.TextContent)
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text=f"echo: {content.text}"),
            model="test-model",
            stop_reason="endTurn",
        )

    async with mcp_session(
        upstream_url, elicitation_callback=on_elicit, sampling_callback=on_sample
    ) as session:
        elicited = await session.call_tool("test_elicitation", {"message": "Who are you?"})
        sampled = await session.call_tool("test_sampling", {"prompt": "hello"})
    assert asked == ["Who are you?"]
    assert elicited.content[0] == types.TextContent(
        type="text",
        text='User response: action=accept, content={"email":"ada@example.org","username":"ada"}',
    )
    assert sampled.content[0] == types.TextContent(type="text", text="LLM response: echo: hello")


async def test_sleep_and_tool_errors(upstream_url: str) -> None:
    async with mcp_session(upstream_url) as session:
        slept = await session.call_tool("sleep", {"seconds": 0.05})
        failed = await session.call_tool("test_error_handling", {})
    assert slept.content[0] == types.TextContent(type="text", text="slept 0.05 s")
    assert failed.is_error
    assert failed.content[0] == types.TextContent(
        type="text", text="This tool intentionally returns an error for testing"
    )


async def _sse_events(response: aiohttp.ClientResponse) -> list[dict[str, str]]:
    """The events of a whole SSE body (the SDK writes CRLF line ends)."""
    body = (await response.read()).decode().replace("\r\n", "\n")
    events = []
    for block in body.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            name, _, value = line.partition(":")
            if name:
                fields[name] = fields.get(name, "") + value.removeprefix(" ")
        if fields:
            events.append(fields)
    return events


async def _open_session(http: aiohttp.ClientSession, url: str) -> dict[str, str]:
    """Initialize a session by hand; returns the headers of its later requests."""
    return await open_session(
        http, url, client_name=CLIENT_NAME, request_id=INITIALIZE_ID, version_header=True
    )


async def _request(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], method: str, params: Any
) -> dict[str, Any]:
    """One JSON-RPC request on a session; returns its response message."""
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
    response = await http.post(url, headers=headers, json=body)
    messages = [json.loads(event["data"]) for event in await _sse_events(response)]
    return next(message for message in messages if message.get("id") == 7)


async def test_skills_extension(upstream_url: str) -> None:
    skill_md = "skill://mcp-sse-gateway/resumable-streams/SKILL.md"
    timeout = aiohttp.ClientTimeout(total=DEADLINE_S)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        headers = await _open_session(http, upstream_url)
        listed = await _request(http, upstream_url, headers, "skills/list", {})
        unknown = await _request(
            http, upstream_url, headers, "skills/get", {"uri": "skill://nope/nope/SKILL.md"}
        )
        read = await _request(http, upstream_url, headers, "resources/read", {"uri": skill_md})
        directory = await _request(
            http,
            upstream_url,
            headers,
            "resources/directory/read",
            {"uri": "skill://mcp-sse-gateway/resumable-streams"},
        )
    (entry,) = listed["result"]["skills"]
    assert entry["uri"] == skill_md
    assert entry["frontmatter"]["name"] == "resumable-streams"
    text = read["result"]["contents"][0]["text"]
    manifest = next(r for r in entry["resources"] if r["uri"] == skill_md)
    assert manifest == {
        "uri": skill_md,
        "digest": f"sha256:{sha256_hex(text)}",
        "size": len(text.encode()),
    }
    assert unknown["error"]["code"] == -32602
    children = {child["uri"].rsplit("/", 1)[1]: child for child in directory["result"]["resources"]}
    assert children["references"]["mimeType"] == "inode/directory"
    assert children["SKILL.md"]["mimeType"] == "text/markdown"


async def test_no_resumability_of_its_own(upstream_url: str) -> None:
    """No event ids, no priming event, no ``retry``: resumability is left to the gateway."""
    timeout = aiohttp.ClientTimeout(total=DEADLINE_S)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        headers = await _open_session(http, upstream_url)
        call = await http.post(
            upstream_url,
            headers=headers,
            json={
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "stream_notifications", "arguments": {"count": 3}},
            },
        )
        assert call.headers["Content-Type"].startswith("text/event-stream")
        events = await _sse_events(call)
        assert [json.loads(e["data"]).get("id") for e in events] == [None, None, None, 2]
        assert not any("id" in e or "retry" in e for e in events)
        deleted = await http.delete(upstream_url, headers=headers)
        assert deleted.status == 200


async def test_json_response_and_stateless_modes() -> None:
    timeout = aiohttp.ClientTimeout(total=DEADLINE_S)
    async with start_example_upstream("--json-response") as url:
        async with aiohttp.ClientSession(timeout=timeout) as http:
            response = await http.post(url, headers=ACCEPT, json=INITIALIZE)
            assert response.headers["Content-Type"].startswith("application/json")
            assert "Mcp-Session-Id" in response.headers
            assert (await response.json())["result"]["protocolVersion"] == PROTOCOL_VERSION
        async with mcp_session(url) as session:
            result = await session.call_tool("test_simple_text", {})
        assert result.content[0] == types.TextContent(
            type="text", text="This is a simple text response for testing."
        )
    async with start_example_upstream("--stateless") as url:
        async with aiohttp.ClientSession(timeout=timeout) as http:
            response = await http.post(url, headers=ACCEPT, json=INITIALIZE)
            await response.read()
        assert response.status == 200
        assert "Mcp-Session-Id" not in response.headers


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Host": "evil.example"}, 421),
        ({"Origin": "http://evil.example"}, 403),
        ({"Host": "localhost"}, 200),
        ({"Origin": "http://localhost:5173"}, 200),
    ],
)
async def test_dns_rebinding_protection(
    upstream_url: str, headers: dict[str, str], status: int
) -> None:
    timeout = aiohttp.ClientTimeout(total=DEADLINE_S)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        response = await http.post(upstream_url, headers={**ACCEPT, **headers}, json=INITIALIZE)
        await response.read()
    assert response.status == status
