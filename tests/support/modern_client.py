"""A raw 2026-07-28 era client over HTTP: self-contained requests, the Tasks extension declared.

No SDK speaks the Tasks extension of that era yet, so tests speak it as its specification says
(SEP-2575 ``_meta``, SEP-2243 ``Mcp-Method``/``Mcp-Name`` headers, SEP-2663 tasks): every request
is one POST without a session, answered as JSON or as an SSE stream whose response is read.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import aiohttp

from tests.support.waiting import DEADLINE_S, eventually

MODERN_VERSION = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
CLIENT_INFO = {"name": "mcp-sse-gateway-tests", "version": "1"}
TERMINAL = {"completed", "failed", "cancelled"}

_ids = itertools.count(1)


class RpcError(Exception):
    """A JSON-RPC error answer: ``code``, ``message``, ``data`` and the HTTP status."""

    def __init__(self, error: dict[str, Any], status: int) -> None:
        super().__init__(f"{error.get('code')}: {error.get('message')} (HTTP {status})")
        self.code = error.get("code")
        self.data = error.get("data")
        self.status = status


def request_body(
    method: str, params: dict[str, Any] | None = None, *, declare_tasks: bool = True
) -> dict[str, Any]:
    """A JSON-RPC request of the era: ``_meta`` with version, client info and capabilities."""
    capabilities: dict[str, Any] = {"elicitation": {}}
    if declare_tasks:
        capabilities["extensions"] = {TASKS: {}}
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
        "io.modelcontextprotocol/clientInfo": CLIENT_INFO,
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    }
    return {
        "jsonrpc": "2.0",
        "id": next(_ids),
        "method": method,
        "params": {**(params or {}), "_meta": meta},
    }


def request_headers(method: str, params: dict[str, Any] | None) -> dict[str, str]:
    """The era's headers: version, ``Mcp-Method``, and ``Mcp-Name`` for a name-shaped field."""
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN_VERSION,
        "Mcp-Method": method,
    }
    name = (params or {}).get("name" if method == "tools/call" else "taskId")
    if isinstance(name, str):
        headers["Mcp-Name"] = name
    return headers


async def call(
    http: aiohttp.ClientSession,
    url: str,
    method: str,
    params: dict[str, Any] | None = None,
    *,
    declare_tasks: bool = True,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Send one request; its result.

    Raises:
        RpcError: the answer is a JSON-RPC error.
    """
    body = request_body(method, params, declare_tasks=declare_tasks)
    sent = {**request_headers(method, params), **(headers or {})}
    async with http.post(url, json=body, headers=sent) as response:
        text = await response.text()
        if response.content_type == "text/event-stream":
            messages = [
                json.loads(line[5:])
                for line in text.splitlines()
                if line.startswith("data:") and line[5:].strip()
            ]
            answer = next(m for m in messages if m.get("id") == body["id"])
        else:
            answer = json.loads(text)
    if "error" in answer:
        raise RpcError(answer["error"], response.status)
    result: dict[str, Any] = answer["result"]
    return result


async def poll(
    http: aiohttp.ClientSession,
    url: str,
    task_id: str,
    *,
    until: frozenset[str] | set[str] = frozenset(TERMINAL),
    timeout_s: float = DEADLINE_S,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``tasks/get`` until the task's status is in *until*; its last DetailedTask."""
    seen: dict[str, Any] = {}

    async def reached() -> bool:
        seen.update(await call(http, url, "tasks/get", {"taskId": task_id}, headers=headers))
        return seen["status"] in until

    await eventually(reached, timeout_s=timeout_s, poll_s=0.05)
    return seen
