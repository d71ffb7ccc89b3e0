"""The Tasks extension's fixtures (SEP-2663 ``tasks-*`` scenarios), as ordinary synchronous tools.

This server does not implement the Tasks extension: ``slow_compute`` just runs, ``confirm_delete``
asks for input with an MRTR round trip (SEP-2322), and so on. The gateway with
``deploy/examples/tasks.toml`` (``[tasks]`` on, these tools listed) serves them as tasks: that is
how the conformance run checks DESIGN D11.
"""

from __future__ import annotations

import asyncio
from typing import Any

from mcp import types
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError

from mcp_sse_gateway.example.protocol import elicit_request, exchange, form_value

#: How long ``failing_job`` works before it reports its error, seconds (the suite: "~1 s").
FAILING_JOB_S = 1.0
#: How long ``test_tool_with_task`` works once it has the user's name, seconds.
COMPOSED_WORK_S = 0.5


def _schema(**properties: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": kind} for name, kind in properties.items()},
        "required": list(properties),
    }


def register_task_fixtures(server: MCPServer[Any]) -> None:  # noqa: C901 - one per fixture
    """Register the ``tasks-*`` scenarios' tools on *server*."""

    @server.tool()
    def greet(name: str) -> str:
        """Greets *name* (synchronous in every configuration)."""
        return f"Hello, {name}!"

    @server.tool()
    async def slow_compute(seconds: float = 1.0, label: str = "") -> str:
        """Works for *seconds*, then answers; a cancellation (the request closed) stops it."""
        await asyncio.sleep(max(0.0, seconds))
        return f"Computed {label or 'result'} in {seconds:g} s"

    @server.tool()
    async def failing_job() -> types.CallToolResult:
        """Works about a second, then reports a tool execution error (``isError``)."""
        await asyncio.sleep(FAILING_JOB_S)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text="The job failed")], is_error=True
        )

    @server.tool()
    async def protocol_error_job() -> str:
        """Fails with a JSON-RPC (protocol) error instead of a tool result."""
        await asyncio.sleep(0)
        raise MCPError(code=types.INTERNAL_ERROR, message="The job crashed")

    @server.tool()
    async def confirm_delete(filename: str, ctx: Context) -> str | types.InputRequiredResult:
        """Asks to confirm (one ``elicitation/create``), then deletes *filename* (pretends to)."""
        question = elicit_request(f"Delete {filename}?", _schema(confirm="boolean"))
        answers = await exchange(ctx, {"confirm": question})
        if isinstance(answers, types.InputRequiredResult):
            return answers
        confirmed = form_value(answers["confirm"], "confirm")
        return f"Deleted {filename}" if confirmed else f"Kept {filename}"

    @server.tool()
    async def multi_input(ctx: Context) -> str | types.InputRequiredResult:
        """Asks two questions at once (two pending input requests), then answers."""
        answers = await exchange(
            ctx,
            {
                "name": elicit_request("Your name?", _schema(name="string")),
                "confirm": elicit_request("Go ahead?", _schema(confirm="boolean")),
            },
        )
        if isinstance(answers, types.InputRequiredResult):
            return answers
        return f"Thanks, {form_value(answers['name'], 'name')}"

    @server.tool()
    async def test_tool_with_task(ctx: Context) -> str | types.InputRequiredResult:
        """Asks the user's name at once (an MRTR round), then works a while and greets them."""
        answers = await exchange(
            ctx, {"user_name": elicit_request("What is your name?", _schema(name="string"))}
        )
        if isinstance(answers, types.InputRequiredResult):
            return answers
        await asyncio.sleep(COMPOSED_WORK_S)
        return f"Hello, {form_value(answers['user_name'], 'name') or 'stranger'}!"
