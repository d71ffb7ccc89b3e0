"""The MCP conformance suite's test-server surface (``@modelcontextprotocol/conformance``).

Every tool, resource, resource template, prompt, completion, logging and subscription
behaviour the suite's server scenarios (0.1.16 and 0.2.0-alpha.12) call for, with the names,
arguments and content they check. Registered on a server by :func:`register_conformance`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer, UserMessage
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.shared.exceptions import MCPError
from pydantic import Field

from mcp_sse_gateway.example.content import PNG_BASE64, PNG_BYTES, WAV_BASE64
from mcp_sse_gateway.example.protocol import (
    ServerState,
    elicit_request,
    exchange,
    form_value,
    is_modern,
    sampling_request,
    send_log,
    text_of,
)

STATIC_TEXT = "This is the content of the static text resource."
WATCHED_URI = "test://watched-resource"
JSON_SCHEMA_TOOL = "json_schema_2020_12_tool"

#: The inputSchema of ``json_schema_2020_12_tool``: JSON Schema 2020-12 keywords that an SDK
#: might strip (``$schema``, ``$defs`` with an ``$anchor``, ``$ref``, composition and
#: conditional keywords, ``additionalProperties``); scenario ``json-schema-2020-12``.
JSON_SCHEMA_2020_12: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}

#: ``tools-call-elicitation``: the schema of ``test_elicitation``.
USER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "username": {"type": "string", "description": "User's response"},
        "email": {"type": "string", "description": "User's email address"},
    },
    "required": ["username", "email"],
}

#: ``elicitation-sep1034-defaults``: a default for every primitive type.
DEFAULTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "User name", "default": "John Doe"},
        "age": {"type": "integer", "description": "User age", "default": 30},
        "score": {"type": "number", "description": "User score", "default": 95.5},
        "status": {
            "type": "string",
            "description": "User status",
            "enum": ["active", "inactive", "pending"],
            "default": "active",
        },
        "verified": {"type": "boolean", "description": "Verification status", "default": True},
    },
}

#: ``elicitation-sep1330-enums``: the five enum shapes of SEP-1330.
ENUMS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "untitledSingle": {
            "type": "string",
            "description": "Untitled single-select",
            "enum": ["option1", "option2", "option3"],
        },
        "titledSingle": {
            "type": "string",
            "description": "Titled single-select",
            "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"},
            ],
        },
        "legacyEnum": {
            "type": "string",
            "description": "Legacy titled enum",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        "untitledMulti": {
            "type": "array",
            "description": "Untitled multi-select",
            "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
        },
        "titledMulti": {
            "type": "array",
            "description": "Titled multi-select",
            "items": {
                "anyOf": [
                    {"const": "value1", "title": "First Choice"},
                    {"const": "value2", "title": "Second Choice"},
                    {"const": "value3", "title": "Third Choice"},
                ]
            },
        },
    },
}


def _object_schema(**properties: str) -> dict[str, Any]:
    names = list(properties)
    return {
        "type": "object",
        "properties": {name: {"type": kind} for name, kind in properties.items()},
        "required": names,
    }


NAME_SCHEMA = _object_schema(name="string")


#: Completion candidates: prompt argument name or template variable -> values.
COMPLETIONS: dict[str, list[str]] = {
    "arg1": ["paris", "park", "party", "test", "testing"],
    "arg2": ["world", "work", "test"],
    "id": ["1", "12", "123", "1234"],
}


def _image() -> types.ImageContent:
    return types.ImageContent(type="image", data=PNG_BASE64, mime_type="image/png")


def _elicitation_text(prefix: str, answer: types.InputResponse) -> str:
    if not isinstance(answer, types.ElicitResult):
        raise ToolError("the client answered the elicitation with something else")
    content = json.dumps(answer.content or {}, sort_keys=True, separators=(",", ":"))
    return f"{prefix}: action={answer.action}, content={content}"


def _json_schema_tool() -> Tool:
    def json_schema_2020_12_tool() -> str:
        return "json_schema_2020_12_tool called"

    tool = Tool.from_function(
        json_schema_2020_12_tool,
        name=JSON_SCHEMA_TOOL,
        description="Tool with JSON Schema 2020-12 features",
    )
    return tool.model_copy(update={"parameters": JSON_SCHEMA_2020_12})


def conformance_tools() -> list[Tool]:
    """Tools that cannot be declared with the decorator (a hand-written inputSchema)."""
    return [_json_schema_tool()]


def register_conformance(server: MCPServer[Any], state: ServerState) -> None:  # noqa: C901
    """Register the conformance suite's test-server surface on *server*."""
    _register_content_tools(server)
    _register_interactive_tools(server, state)
    _register_input_required_tools(server)
    _register_resources(server, state)
    _register_prompts(server)
    _register_protocol_handlers(server, state)

    @server.tool()
    async def test_tool_with_logging(ctx: Context) -> str:
        """Sends three info log notifications, ~50 ms apart, while it runs."""
        for index, message in enumerate(
            ("Tool execution started", "Tool processing data", "Tool execution completed")
        ):
            if index:
                await asyncio.sleep(0.05)
            await send_log(ctx, state, "info", message)
        return "Tool with logging executed successfully"

    @server.tool()
    async def test_logging_tool(ctx: Context) -> str:
        """Logs three messages at info level; 2026 era: only when the request opted in."""
        sent = 0
        for step in range(3):
            sent += await send_log(ctx, state, "info", f"log message {step + 1} of 3")
        return f"Logged {sent} of 3 messages"

    @server.tool()
    async def test_tool_with_progress(ctx: Context) -> str:
        """Reports progress 0, 50 and 100 of 100, ~50 ms apart (when a progressToken is given)."""
        for index, progress in enumerate((0, 50, 100)):
            if index:
                await asyncio.sleep(0.05)
            await ctx.report_progress(progress, 100, f"Completed step {progress} of 100")
        return "Progress reported: 0, 50, 100 of 100"

    @server.tool()
    async def test_reconnection(ctx: Context) -> str:
        """SSE polling (SEP-1699): logs, asks the transport to close the stream, logs, returns.

        Without an event store the SDK cannot close the stream (the call is a no-op), so the
        whole call travels on the POST stream; behind the gateway, the gateway closes and
        resumes it.
        """
        await send_log(ctx, state, "info", "Before disconnect")
        await ctx.close_sse_stream()
        await asyncio.sleep(0.2)
        await send_log(ctx, state, "info", "After reconnect")
        return "Reconnection test completed"

    @server.tool()
    async def test_trigger_tool_change(ctx: Context) -> str:
        """Announces a tools list change to ``subscriptions/listen`` streams (SEP-2575).

        The list itself stays the same, so concurrent ``tools/list`` readers always see one
        stable, ordered set of tools.
        """
        await ctx.notify_tools_changed()
        return "tool list changed"

    @server.tool()
    async def test_trigger_prompt_change(ctx: Context) -> str:
        """Announces a prompts list change to ``subscriptions/listen`` streams (SEP-2575)."""
        await ctx.notify_prompts_changed()
        return "prompt list changed"

    @server.tool()
    def test_error_handling() -> types.CallToolResult:
        """Always fails: returns a tool result with isError true and the error message."""
        message = "This tool intentionally returns an error for testing"
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=message)], is_error=True
        )

    @server.tool()
    def test_x_mcp_header(
        region: Annotated[
            str,
            Field(
                description="Mirrored into the Mcp-Param-Region header (SEP-2243)",
                json_schema_extra={"x-mcp-header": "Region"},
            ),
        ] = "<none>",
    ) -> str:
        """Echoes its argument; the parameter is mirrored into a custom ``Mcp-Param-`` header."""
        return f"region={region}"

    @server.tool()
    async def test_missing_capability(ctx: Context) -> str:
        """Needs the client's sampling capability: without it, a -32021 protocol error."""
        caps = ctx.client_capabilities
        if caps is None or caps.sampling is None:
            raise MCPError(
                code=types.MISSING_REQUIRED_CLIENT_CAPABILITY,
                message="This tool requires the client 'sampling' capability",
                data={"requiredCapabilities": {"sampling": {}}},
            )
        return "The client declared the sampling capability"


def _register_content_tools(server: MCPServer[Any]) -> None:
    @server.tool()
    def test_simple_text() -> str:
        """Returns one text content item."""
        return "This is a simple text response for testing."

    @server.tool()
    def test_image_content() -> list[types.ImageContent]:
        """Returns one image content item (a 1x1 red PNG)."""
        return [_image()]

    @server.tool()
    def test_audio_content() -> list[types.AudioContent]:
        """Returns one audio content item (a short silent WAV)."""
        return [types.AudioContent(type="audio", data=WAV_BASE64, mime_type="audio/wav")]

    @server.tool()
    def test_embedded_resource() -> list[types.EmbeddedResource]:
        """Returns one embedded text resource."""
        return [
            types.EmbeddedResource(
                type="resource",
                resource=types.TextResourceContents(
                    uri="test://embedded-resource",
                    mime_type="text/plain",
                    text="This is an embedded resource content.",
                ),
            )
        ]

    @server.tool()
    def test_multiple_content_types() -> list[
        types.TextContent | types.ImageContent | types.EmbeddedResource
    ]:
        """Returns text, image and embedded resource content together."""
        return [
            types.TextContent(type="text", text="Multiple content types test:"),
            _image(),
            types.EmbeddedResource(
                type="resource",
                resource=types.TextResourceContents(
                    uri="test://mixed-content-resource",
                    mime_type="application/json",
                    text='{"test":"data","value":123}',
                ),
            ),
        ]


def _register_interactive_tools(server: MCPServer[Any], state: ServerState) -> None:  # noqa: C901
    @server.tool()
    async def test_sampling(prompt: str, ctx: Context) -> str | types.InputRequiredResult:
        """Asks the client's LLM (``sampling/createMessage``) and returns its answer."""
        answers = await exchange(ctx, {"sampling": sampling_request(prompt, 100)})
        if isinstance(answers, types.InputRequiredResult):
            return answers
        return f"LLM response: {text_of(answers['sampling'])}"

    @server.tool()
    async def test_elicitation(message: str, ctx: Context) -> str | types.InputRequiredResult:
        """Asks the user (``elicitation/create``) for a username and email address."""
        answers = await exchange(ctx, {"user": elicit_request(message, USER_SCHEMA)})
        if isinstance(answers, types.InputRequiredResult):
            return answers
        return _elicitation_text("User response", answers["user"])

    @server.tool()
    async def test_elicitation_sep1034_defaults(ctx: Context) -> str | types.InputRequiredResult:
        """Elicitation whose schema has a default for every primitive type (SEP-1034)."""
        request = elicit_request("Please provide user information", DEFAULTS_SCHEMA)
        answers = await exchange(ctx, {"defaults": request})
        if isinstance(answers, types.InputRequiredResult):
            return answers
        return _elicitation_text("Elicitation completed", answers["defaults"])

    @server.tool()
    async def test_elicitation_sep1330_enums(ctx: Context) -> str | types.InputRequiredResult:
        """Elicitation with the five enum schema shapes of SEP-1330."""
        request = elicit_request("Please select values using each enum style", ENUMS_SCHEMA)
        answers = await exchange(ctx, {"enums": request})
        if isinstance(answers, types.InputRequiredResult):
            return answers
        return _elicitation_text("Elicitation completed", answers["enums"])

    @server.tool()
    async def test_streaming_elicitation(ctx: Context) -> str | types.InputRequiredResult:
        """Reports progress, then asks for the user's name.

        2026 era: the question travels in an ``InputRequiredResult`` (never as a request on the
        response stream); handshake era: as ``elicitation/create`` on the call's stream.
        """
        await ctx.report_progress(0, 1, "asking for a name")
        answers = await exchange(
            ctx, {"user_name": elicit_request("What is your name?", NAME_SCHEMA)}
        )
        if isinstance(answers, types.InputRequiredResult):
            return answers
        await ctx.report_progress(1, 1, "answer received")
        await send_log(ctx, state, "info", "elicitation answered")
        return f"Hello, {form_value(answers['user_name'], 'name') or 'stranger'}!"


def _register_input_required_tools(server: MCPServer[Any]) -> None:  # noqa: C901, PLR0915
    """SEP-2322 multi-round-trip tools (``input-required-result-*`` scenarios)."""

    @server.tool()
    async def test_input_required_result_elicitation(
        ctx: Context,
    ) -> str | types.InputRequiredResult:
        """Asks for the user's name (``user_name``), then greets them."""
        answers = await exchange(
            ctx, {"user_name": elicit_request("What is your name?", NAME_SCHEMA)}
        )
        if isinstance(answers, types.InputRequiredResult):
            return answers
        return f"Hello, {form_value(answers['user_name'], 'name') or 'stranger'}!"

    @server.tool()
    async def test_input_required_result_sampling(ctx: Context) -> str | types.InputRequiredResult:
        """Asks the client's LLM a question (``capital_question``), then returns the answer."""
        request = sampling_request("What is the capital of France?", 100)
        answers = await exchange(ctx, {"capital_question": request})
        if isinstance(answers, types.InputRequiredResult):
            return answers
        return f"Model said: {text_of(answers['capital_question'])}"

    @server.tool()
    async def test_input_required_result_list_roots(
        ctx: Context,
    ) -> str | types.InputRequiredResult:
        """Asks for the client's roots (``client_roots``), then counts them."""
        answers = await exchange(ctx, {"client_roots": types.ListRootsRequest()})
        if isinstance(answers, types.InputRequiredResult):
            return answers
        roots = answers["client_roots"]
        count = len(roots.roots) if isinstance(roots, types.ListRootsResult) else 0
        return f"Client exposed {count} root(s)."

    @server.tool()
    async def test_input_required_result_request_state(
        ctx: Context,
    ) -> str | types.InputRequiredResult:
        """Asks for a confirmation with a requestState, and checks it comes back unchanged."""
        confirm = elicit_request("Please confirm", _object_schema(ok="boolean"))
        answers = await exchange(ctx, {"confirm": confirm}, request_state="confirm-pending")
        if isinstance(answers, types.InputRequiredResult):
            return answers
        if is_modern(ctx) and ctx.request_state != "confirm-pending":
            return types.InputRequiredResult(
                input_requests={"confirm": confirm}, request_state="confirm-pending"
            )
        return "state-ok: confirmation received"

    @server.tool()
    async def test_input_required_result_multiple_inputs(
        ctx: Context,
    ) -> str | types.InputRequiredResult:
        """Asks for a name, an LLM greeting and the client's roots at once."""
        answers = await exchange(
            ctx,
            {
                "user_name": elicit_request("What is your name?", NAME_SCHEMA),
                "greeting": sampling_request("Generate a greeting", 50),
                "client_roots": types.ListRootsRequest(),
            },
            request_state="multiple-inputs",
        )
        if isinstance(answers, types.InputRequiredResult):
            return answers
        return "All inputs received."

    @server.tool()
    async def test_input_required_result_multi_round(
        ctx: Context,
    ) -> str | types.InputRequiredResult:
        """Three rounds: a name, then a favourite colour, then the answer (evolving state)."""
        step1 = elicit_request("Step 1: What is your name?", NAME_SCHEMA)
        step2 = elicit_request(
            "Step 2: What is your favorite color?", _object_schema(color="string")
        )
        if not is_modern(ctx):
            answers = await exchange(ctx, {"step1": step1, "step2": step2})
            assert not isinstance(answers, types.InputRequiredResult)
            name, color = (
                form_value(answers["step1"], "name"),
                form_value(answers["step2"], "color"),
            )
            return f"{name} likes {color}."
        state = json.loads(ctx.request_state) if ctx.request_state else {"round": 0}
        responses = ctx.input_responses or {}
        if state.get("round") == 1 and "step1" in responses:
            name = form_value(responses["step1"], "name")
            return types.InputRequiredResult(
                input_requests={"step2": step2},
                request_state=json.dumps({"round": 2, "name": name}),
            )
        if state.get("round") == 2 and "step2" in responses:  # noqa: PLR2004
            return f"{state.get('name')} likes {form_value(responses['step2'], 'color')}."
        return types.InputRequiredResult(
            input_requests={"step1": step1}, request_state=json.dumps({"round": 1})
        )

    @server.tool()
    async def test_input_required_result_tampered_state(
        ctx: Context,
    ) -> str | types.InputRequiredResult:
        """Round one hands out a requestState; the SDK seals it, so a tampered echo is refused."""
        if not is_modern(ctx) or ctx.request_state is not None:
            return f"state-ok: {ctx.request_state}"
        confirm = elicit_request("Please confirm", _object_schema(ok="boolean"))
        return types.InputRequiredResult(
            input_requests={"confirm": confirm}, request_state="round-1"
        )

    @server.tool()
    async def test_input_required_result_capabilities(ctx: Context) -> types.InputRequiredResult:
        """Asks only what the client can answer: sampling and/or elicitation, as declared."""
        caps = ctx.client_capabilities
        requests: dict[str, types.InputRequest] = {}
        if caps is None or caps.sampling is not None:
            requests["sample"] = sampling_request("Say hello", 50)
        if caps is None or caps.elicitation is not None:
            requests["ask"] = elicit_request("What is your name?", NAME_SCHEMA)
        return types.InputRequiredResult(input_requests=requests, request_state="capability-gated")


def _register_resources(server: MCPServer[Any], state: ServerState) -> None:
    @server.resource("test://static-text", mime_type="text/plain")
    def static_text() -> str:
        """A static text resource."""
        return STATIC_TEXT

    @server.resource("test://static-binary", mime_type="image/png")
    def static_binary() -> bytes:
        """A static binary resource (a 1x1 red PNG)."""
        return PNG_BYTES

    @server.resource("test://template/{id}/data", mime_type="application/json")
    def template_data(id: str) -> str:
        """A resource template: JSON naming the id taken from the URI."""
        return json.dumps(
            {"id": id, "templateTest": True, "data": f"Data for ID: {id}"}, separators=(",", ":")
        )

    @server.resource(WATCHED_URI, mime_type="text/plain")
    def watched_resource() -> str:
        """A resource clients can subscribe to; ``update_watched_resource`` changes it."""
        return state.watched_text


def _register_prompts(server: MCPServer[Any]) -> None:
    @server.prompt()
    def test_simple_prompt() -> list[UserMessage]:
        """A prompt without arguments."""
        return [
            UserMessage(
                content=types.TextContent(type="text", text="This is a simple prompt for testing.")
            )
        ]

    @server.prompt()
    def test_prompt_with_arguments(
        arg1: Annotated[str, Field(description="First test argument")],
        arg2: Annotated[str, Field(description="Second test argument")],
    ) -> list[UserMessage]:
        """A prompt with two required arguments."""
        text = f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"
        return [UserMessage(content=types.TextContent(type="text", text=text))]

    @server.prompt()
    def test_prompt_with_embedded_resource(
        resourceUri: Annotated[str, Field(description="URI of the resource to embed")],
    ) -> list[UserMessage]:
        """A prompt embedding a text resource at the given URI."""
        resource = types.TextResourceContents(
            uri=resourceUri, mime_type="text/plain", text="Embedded resource content for testing."
        )
        return [
            UserMessage(content=types.EmbeddedResource(type="resource", resource=resource)),
            UserMessage(
                content=types.TextContent(
                    type="text", text="Please process the embedded resource above."
                )
            ),
        ]

    @server.prompt()
    def test_prompt_with_image() -> list[UserMessage]:
        """A prompt with image content."""
        return [
            UserMessage(content=_image()),
            UserMessage(
                content=types.TextContent(type="text", text="Please analyze the image above.")
            ),
        ]

    @server.prompt()
    async def test_input_required_result_prompt(
        ctx: Context,
    ) -> list[UserMessage] | types.InputRequiredResult:
        """Asks the user for context first (SEP-2322 on ``prompts/get``)."""
        schema = _object_schema(context="string")
        request = elicit_request("What context should the prompt use?", schema)
        answers = await exchange(ctx, {"user_context": request})
        if isinstance(answers, types.InputRequiredResult):
            return answers
        context = form_value(answers["user_context"], "context") or "?"
        return [
            UserMessage(
                content=types.TextContent(type="text", text=f"Use the following context: {context}")
            )
        ]


def _register_protocol_handlers(server: MCPServer[Any], state: ServerState) -> None:
    """Completion, ``logging/setLevel`` and resource subscriptions (handshake era)."""

    async def complete(
        ref: types.PromptReference | types.ResourceTemplateReference,
        argument: types.CompletionArgument,
        context: types.CompletionContext | None,
    ) -> types.Completion:
        del ref, context  # candidates depend on the argument's name only
        candidates = COMPLETIONS.get(argument.name, [])
        values = [value for value in candidates if value.startswith(argument.value)]
        return types.Completion(values=values, total=len(values), has_more=False)

    # Applied by hand rather than as a decorator: MCPServer.completion() is unannotated, and
    # decorating with it would erase the handler's signature.
    server.completion()(complete)  # type: ignore[no-untyped-call]  # unannotated in the SDK

    def request_session_id(ctx: ServerRequestContext[Any, Any]) -> str | None:
        headers = getattr(ctx.request, "headers", None)
        return headers.get("mcp-session-id") if headers is not None else None

    async def set_level(
        ctx: ServerRequestContext[Any, Any], params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        sid = request_session_id(ctx)
        if sid is not None:
            state.log_levels[sid] = params.level
        return types.EmptyResult()

    async def subscribe(
        ctx: ServerRequestContext[Any, Any], params: types.SubscribeRequestParams
    ) -> types.EmptyResult:
        sid = request_session_id(ctx)
        if sid is not None:
            state.subscriptions.setdefault(str(params.uri), {})[sid] = ctx.session
        return types.EmptyResult()

    async def unsubscribe(
        ctx: ServerRequestContext[Any, Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        sid = request_session_id(ctx)
        if sid is not None:
            state.subscriptions.get(str(params.uri), {}).pop(sid, None)
        return types.EmptyResult()

    # MCPServer has no public registration for these three handshake-era methods; the
    # low-level server's is the documented way (the SDK's own example server does the same).
    lowlevel = server._lowlevel_server  # noqa: SLF001
    lowlevel.add_request_handler("logging/setLevel", types.SetLevelRequestParams, set_level)
    lowlevel.add_request_handler("resources/subscribe", types.SubscribeRequestParams, subscribe)
    lowlevel.add_request_handler(
        "resources/unsubscribe", types.UnsubscribeRequestParams, unsubscribe
    )


async def notify_subscribers(ctx: Context, state: ServerState, uri: str) -> int:
    """Send ``notifications/resources/updated`` for *uri* to every subscribed session.

    Handshake-era sessions get it on their standalone GET stream (sessions that are gone are
    forgotten); 2026-era ``subscriptions/listen`` streams get it through the SDK's bus.
    Returns the number of handshake-era sessions notified.
    """
    sent = 0
    subscribers = state.subscriptions.get(uri, {})
    for sid, session in list(subscribers.items()):
        try:
            await session.send_resource_updated(uri)
        except Exception:  # noqa: BLE001 - a session that ended cannot be notified; forget it
            subscribers.pop(sid, None)
        else:
            sent += 1
    await ctx.notify_resource_updated(uri)
    return sent
