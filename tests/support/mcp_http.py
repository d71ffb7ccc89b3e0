"""Raw MCP over HTTP for tests that decide exactly where a connection drops."""

from __future__ import annotations

from typing import Any

import aiohttp

ACCEPT = {"Accept": "application/json, text/event-stream"}


async def open_session(
    http: aiohttp.ClientSession,
    url: str,
    *,
    version: str = "2025-11-25",
    headers: dict[str, str] | None = None,
) -> dict[str, str]:
    """Initialize a session at *url* (and send ``notifications/initialized``).

    Args:
        http: the client.
        url: the MCP endpoint.
        version: the protocol version asked for.
        headers: extra headers of every request (``Authorization`` …).

    Returns:
        The headers of the session's later requests (``Accept``, ``Mcp-Session-Id`` and
        *headers*).
    """
    extra = headers or {}
    init = await http.post(
        url,
        headers={**ACCEPT, **extra},
        json={
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": version,
                "capabilities": {},
                "clientInfo": {"name": "mcp-sse-gateway-tests", "version": "1"},
            },
        },
    )
    assert init.status == 200, init.status
    headers = {**ACCEPT, **extra, "Mcp-Session-Id": init.headers["Mcp-Session-Id"]}
    await init.read()
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    response = await http.post(url, headers=headers, json=initialized)
    assert response.status == 202
    return headers


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
