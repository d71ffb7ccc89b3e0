"""The one JSON-RPC response an upstream answer carries, read as an MCP client reads it.

For the answers the gateway itself must understand rather than relay (a task's ``tools/call``,
``server/discover``; DESIGN D11): a JSON body read whole, its content coding undone (gzip,
deflate, as :mod:`.upgrade` does), or an SSE stream read until that response, never longer.
Sans-IO towards HTTP (an :class:`~mcp_sse_gateway.streams.upstream.UpstreamResponse`).
"""

from __future__ import annotations

import json
from typing import Any

from mcp_sse_gateway.sse import SSEDecoder
from mcp_sse_gateway.streams.upgrade import ContentDecoder, content_coding, decodable
from mcp_sse_gateway.streams.upstream import UpstreamResponse, is_event_stream

__all__ = ["jsonrpc_response", "response_in"]

_UTF8_BOM = "\ufeff"


async def jsonrpc_response(response: UpstreamResponse, *, max_bytes: int) -> dict[str, Any] | None:
    """The first JSON-RPC response (a result or an error) in *response*, or None.

    None when there is none: another body, a coding the gateway does not read, a JSON body over
    *max_bytes*, an event stream that ended without one.

    Raises:
        UpstreamBroken: the body broke off, or does not decode.
        EventTooLarge: an SSE event over *max_bytes*.
    """
    if is_event_stream(response):
        decoder = SSEDecoder(max_event_bytes=max_bytes)
        async for chunk in response.chunks():
            for event in decoder.feed(chunk):
                message = response_in(event.data) if event.data else None
                if message is not None:
                    return message
        return None
    if not decodable(response):
        return None
    body = ContentDecoder(content_coding(response), max_bytes)
    text = bytearray()
    async for chunk in response.chunks():
        text += body.feed(chunk)
        if body.full:
            return None
    text += body.flush()
    return response_in(text.decode("utf-8", "replace"))


def response_in(data: str) -> dict[str, Any] | None:
    """The JSON-RPC response (result or error) *data* holds, or None."""
    try:
        message = json.loads(data.removeprefix(_UTF8_BOM))
    except (json.JSONDecodeError, RecursionError):
        return None
    if (
        isinstance(message, dict)
        and "id" in message
        and ("result" in message or "error" in message)
    ):
        return message
    return None
