"""Tools for testing a proxy in front of this server: ordered streams, big events, slow calls.

- ``stream_notifications``: many numbered notifications on one response stream (order,
  exactly-once and resumption checks);
- ``big_payload``: one large, deterministic result with multi-byte UTF-8 and every line-break
  style, with its SHA-256 (exact byte-for-byte comparison);
- ``sleep``: a call that is simply slow (timeouts, drains, polling);
- ``update_watched_resource``: a server-initiated message on the standalone GET stream
  (``notifications/resources/updated`` to sessions subscribed to the watched resource).
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from mcp import types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from mcp_sse_gateway.example.conformance import WATCHED_URI, notify_subscribers
from mcp_sse_gateway.example.content import payload_text, sha256_hex
from mcp_sse_gateway.example.protocol import ServerState, is_modern, log_allowed

MAX_NOTIFICATIONS = 100_000
MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
MAX_SLEEP_S = 3600.0
LOGGER_NAME = "stream_notifications"


def register_gateway_tools(server: MCPServer[Any], state: ServerState) -> None:
    """Register the tools a proxy's tests use on *server*."""

    @server.tool()
    async def stream_notifications(
        ctx: Context,
        count: Annotated[int, Field(ge=0, le=MAX_NOTIFICATIONS, description="how many")],
        interval_ms: Annotated[
            float, Field(ge=0, le=60_000, description="pause between two notifications")
        ] = 0,
        payload_bytes: Annotated[
            int, Field(ge=0, le=MAX_PAYLOAD_BYTES, description="ASCII padding in each one")
        ] = 0,
        standalone: Annotated[
            bool,
            Field(description="send them on the session's standalone GET stream instead"),
        ] = False,
    ) -> str:
        """Sends `count` numbered notifications, then returns "sent <count> notifications".

        Notification `i` (0 .. count-1) is a `notifications/message` (level info, logger
        `stream_notifications`, data `{"index": i, "count": count, "payload": "..."}`) when
        logging is allowed for the request (handshake era: unless `logging/setLevel` set a
        level above info; 2026 era: when the request opted in through `_meta`), and a
        `notifications/progress` with `progress: i`, `total: count` when the request carried a
        progressToken. They travel on the call's own response stream, in order, `interval_ms`
        apart, unless `standalone` (handshake-era sessions only: log notifications on the
        session's standalone GET stream, where they are lost while no GET stream is open).
        """
        if standalone and is_modern(ctx):
            raise ToolError("the 2026-07-28 protocol has no standalone stream")
        padding = "x" * payload_bytes
        log = log_allowed(ctx, state, "info")
        for index in range(count):
            if index and interval_ms:
                await asyncio.sleep(interval_ms / 1000)
            if log:
                notification = types.LoggingMessageNotification(
                    params=types.LoggingMessageNotificationParams(
                        level="info",
                        logger=LOGGER_NAME,
                        data={"index": index, "count": count, "payload": padding},
                    )
                )
                related = None if standalone else ctx.request_id
                await ctx.session.send_notification(notification, related_request_id=related)
            if not standalone:
                await ctx.report_progress(index, count, f"notification {index}")
        return f"sent {count} notifications"

    @server.tool()
    def big_payload(
        size_bytes: Annotated[
            int, Field(ge=0, le=MAX_PAYLOAD_BYTES, description="UTF-8 size of the text")
        ],
        multiline: Annotated[bool, Field(description="CR, LF and CRLF line breaks")] = True,
        unicode: Annotated[bool, Field(description="2- to 4-byte UTF-8 characters")] = True,
        seed: Annotated[int, Field(description="seed of the deterministic generator")] = 0,
    ) -> types.CallToolResult:
        """Returns a deterministic text of exactly `size_bytes` UTF-8 bytes, and its SHA-256.

        `content[0]` is the text; `content[1]` reads `sha256:<hex>`;
        `structuredContent` is `{"sha256": hex, "bytes": n, "characters": m}`. The same
        arguments always give the same text.
        """
        text = payload_text(size_bytes, multiline=multiline, unicode=unicode, seed=seed)
        digest = sha256_hex(text)
        return types.CallToolResult(
            content=[
                types.TextContent(type="text", text=text),
                types.TextContent(type="text", text=f"sha256:{digest}"),
            ],
            structured_content={
                "sha256": digest,
                "bytes": len(text.encode("utf-8")),
                "characters": len(text),
            },
        )

    @server.tool()
    async def sleep(
        seconds: Annotated[float, Field(ge=0, le=MAX_SLEEP_S, description="how long")],
    ) -> str:
        """Sleeps for `seconds`, then returns "slept <seconds> s"."""
        await asyncio.sleep(seconds)
        return f"slept {seconds:g} s"

    @server.tool()
    async def update_watched_resource(
        ctx: Context, text: Annotated[str, Field(description="the new content")]
    ) -> str:
        """Changes `test://watched-resource` and notifies its subscribers.

        Sessions that subscribed with `resources/subscribe` receive
        `notifications/resources/updated` on their standalone GET stream (a server-initiated
        message outside any request); 2026-era `subscriptions/listen` streams receive it too.
        """
        state.watched_text = text
        sent = await notify_subscribers(ctx, state, WATCHED_URI)
        return f"notified {sent} session(s)"
