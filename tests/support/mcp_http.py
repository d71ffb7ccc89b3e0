"""Raw MCP over HTTP for tests that decide exactly where a connection drops."""

from __future__ import annotations

from typing import Any

import aiohttp

ACCEPT = {"Accept": "application/json, text/event-stream"}
PROTOCOL_VERSION = "2025-11-25"
#: The ``clientInfo`` name of the tests' raw clients.
CLIENT_NAME = "mcp-sse-gateway-tests"


def initialize_request(
    version: str = PROTOCOL_VERSION, *, client_name: str = CLIENT_NAME, request_id: int = 0
) -> dict[str, Any]:
    """An ``initialize`` request asking for protocol *version*."""
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "initialize",
        "params": {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": {"name": client_name, "version": "1"},
        },
    }


async def open_session(
    http: aiohttp.ClientSession,
    url: str,
    *,
    version: str = PROTOCOL_VERSION,
    headers: dict[str, str] | None = None,
    client_name: str = CLIENT_NAME,
    request_id: int = 0,
    version_header: bool = False,
) -> dict[str, str]:
    """Initialize a session at *url* (and send ``notifications/initialized``).

    Args:
        http: the client.
        url: the MCP endpoint.
        version: the protocol version asked for.
        headers: extra headers of every request (``Authorization`` …).
        client_name: the ``clientInfo`` name.
        request_id: the id of the ``initialize`` request.
        version_header: whether the later requests carry ``MCP-Protocol-Version: version``.

    Returns:
        The headers of the session's later requests (``Accept``, ``Mcp-Session-Id``,
        ``MCP-Protocol-Version`` if asked for, and *headers*).
    """
    extra = headers or {}
    request = initialize_request(version, client_name=client_name, request_id=request_id)
    async with http.post(url, headers={**ACCEPT, **extra}, json=request) as init:
        assert init.status == 200, init.status
        session = {**ACCEPT, **extra, "Mcp-Session-Id": init.headers["Mcp-Session-Id"]}
        await init.read()
    if version_header:
        session["MCP-Protocol-Version"] = version
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    async with http.post(url, headers=session, json=initialized) as response:
        assert response.status == 202
    return session


def stream_notifications_call(
    count: int, interval_ms: float, request_id: int = 1
) -> dict[str, Any]:
    """A ``tools/call`` of the example server's ``stream_notifications`` tool."""
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {
            "name": "stream_notifications",
            "arguments": {"count": count, "interval_ms": interval_ms},
        },
    }
