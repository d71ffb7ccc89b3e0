"""One tool call by an official SDK client: the Python ``mcp`` package, or the TypeScript
``@modelcontextprotocol/sdk`` (``tests/conformance/ts_client.mjs`` on the pinned Node), each
with its own reconnection."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import LoggingMessageNotificationParams

NODE_DIR = Path(__file__).resolve().parents[1] / "conformance"
NODE = Path(os.environ.get("MCP_CONFORMANCE_NODE", NODE_DIR / "node_modules/node/bin/node"))
# Next to the Node packages it imports (ES modules resolve from the script's directory).
TS_CLIENT = NODE_DIR / "ts_client.mjs"
TS_POLLING_UPSTREAM = NODE_DIR / "ts_polling_upstream.mjs"
START_TIMEOUT_S = 30
CALL_TIMEOUT_S = 60


async def python_call(
    url: str, tool: str, arguments: dict[str, Any], *, max_event_bytes: int = 1024 * 1024
) -> tuple[list[Any], Any]:
    """Call *tool* with the Python SDK; returns the data of its log notifications and its result."""
    logged: list[Any] = []

    async def on_log(params: LoggingMessageNotificationParams) -> None:
        logged.append(params.data)

    async with (
        streamable_http_client(url, max_sse_event_size=max_event_bytes) as (read, write),
        ClientSession(read, write, logging_callback=on_log) as session,
    ):
        await session.initialize()
        result = await asyncio.wait_for(session.call_tool(tool, arguments), CALL_TIMEOUT_S)
    return logged, result


def node_available() -> bool:
    return NODE.exists()


def _require_node() -> None:
    """Skip the test without the Node toolchain (fail it when ``$CI`` is set)."""
    if not node_available():
        if os.environ.get("CI"):
            pytest.fail(f"Node 22 not found at {NODE}; .ci/run installs it")
        pytest.skip("Node 22 toolchain not installed (run .ci/run once)")


@contextlib.asynccontextmanager
async def ts_polling_upstream(closes: int, gap_ms: int) -> AsyncIterator[str]:
    """A TypeScript SDK server with an event store (``ts_polling_upstream.mjs``): its
    ``close_and_answer`` tool closes its stream *closes* times, *gap_ms* apart, then answers.

    Yields its MCP URL; the process is killed on exit.
    """
    from tests.support.ports import free_port

    _require_node()
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        str(NODE),
        str(TS_POLLING_UPSTREAM),
        str(port),
        str(closes),
        str(gap_ms),
        cwd=NODE_DIR,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), START_TIMEOUT_S)
        assert line.strip() == b"listening", line.decode(errors="replace")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


async def ts_call(url: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Call *tool* with the TypeScript SDK; returns what ts_client.mjs printed last (parsed).

    Skips the test without the Node toolchain (fails it when ``$CI`` is set).
    """
    _require_node()
    process = await asyncio.create_subprocess_exec(
        str(NODE),
        str(TS_CLIENT),
        url,
        tool,
        json.dumps(arguments),
        cwd=NODE_DIR,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), CALL_TIMEOUT_S)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()[-2000:]
    return json.loads(out.decode().strip().splitlines()[-1])
