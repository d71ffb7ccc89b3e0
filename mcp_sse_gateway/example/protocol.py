"""Helpers shared by the example server's tools: protocol eras, logging, client requests.

The example server speaks both protocol eras the SDK serves on one endpoint:

- the handshake era (2025-03-26 … 2025-11-25): a session (``Mcp-Session-Id``), logging
  controlled by ``logging/setLevel``, server-to-client requests (sampling, elicitation,
  roots) sent on the request's own SSE stream while the tool runs;
- the 2026-07-28 era: self-contained requests, logging opted into per request through
  ``_meta``, and client input gathered with ``InputRequiredResult`` round trips.

Tools use :func:`exchange` to ask the client something in either era, and :func:`send_log`
to log, instead of the SDK's deprecated convenience methods (deprecated because the 2026
revision removes those capabilities, while this server exercises them on purpose).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

from mcp import types
from mcp.server.connection import allowed_log_levels
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import LATEST_HANDSHAKE_VERSION, MODERN_PROTOCOL_VERSIONS

#: Every ``LoggingLevel``, least severe first (RFC 5424 order, as the spec lists them).
LOG_LEVELS: tuple[types.LoggingLevel, ...] = get_args(types.LoggingLevel)

SESSION_HEADER = "mcp-session-id"


@dataclass
class ServerState:
    """What the server remembers between requests, per process.

    Attributes:
        log_levels: minimum log level set with ``logging/setLevel``, by session id.
        subscriptions: resource URI -> subscribed sessions (session id -> the session object of
            the ``resources/subscribe`` request, whose connection carries the standalone stream).
        watched_text: the current content of ``test://watched-resource``.
    """

    log_levels: dict[str, types.LoggingLevel] = field(default_factory=dict)
    subscriptions: dict[str, dict[str, Any]] = field(default_factory=dict)
    watched_text: str = "Watched resource content"


def protocol_version(ctx: Context) -> str:
    """The protocol version of the request being served (handshake era when unknown)."""
    return ctx.protocol_version or LATEST_HANDSHAKE_VERSION


def is_modern(ctx: Context) -> bool:
    """True when the request speaks the 2026-07-28 (sessionless, per-request) protocol."""
    return protocol_version(ctx) in MODERN_PROTOCOL_VERSIONS


def session_id(ctx: Context) -> str | None:
    """The ``Mcp-Session-Id`` of the request, or None (2026 era, stateless mode, no HTTP)."""
    headers = ctx.headers
    return headers.get(SESSION_HEADER) if headers is not None else None


def _request_meta(ctx: Context) -> Mapping[str, Any] | None:
    meta = ctx.request_context.meta
    return meta if isinstance(meta, Mapping) else None


def log_allowed(ctx: Context, state: ServerState, level: types.LoggingLevel) -> bool:
    """Whether a ``notifications/message`` at *level* may be sent for this request.

    2026 era: only if the request opted in through ``_meta`` at that level or below.
    Handshake era: unless ``logging/setLevel`` set a higher minimum for the session.
    """
    if level not in allowed_log_levels(protocol_version(ctx), _request_meta(ctx)):
        return False
    sid = session_id(ctx)
    minimum = state.log_levels.get(sid) if sid is not None else None
    return minimum is None or LOG_LEVELS.index(level) >= LOG_LEVELS.index(minimum)


async def send_log(
    ctx: Context,
    state: ServerState,
    level: types.LoggingLevel,
    data: Any,
    *,
    logger: str | None = None,
) -> bool:
    """Send a log notification on the request's own stream, if allowed; True when sent."""
    if not log_allowed(ctx, state, level):
        return False
    await ctx.session.send_notification(
        types.LoggingMessageNotification(
            params=types.LoggingMessageNotificationParams(level=level, data=data, logger=logger)
        ),
        related_request_id=ctx.request_id,
    )
    return True


def _capability_missing(ctx: Context, request: types.InputRequest) -> str | None:
    caps = ctx.client_capabilities
    if isinstance(request, types.ElicitRequest):
        return None if caps is not None and caps.elicitation is not None else "elicitation"
    if isinstance(request, types.CreateMessageRequest):
        return None if caps is not None and caps.sampling is not None else "sampling"
    return None if caps is not None and caps.roots is not None else "roots"


async def _ask_now(ctx: Context, request: types.InputRequest) -> types.InputResponse:
    """Handshake era: send *request* to the client on this request's stream and wait."""
    metadata = ServerMessageMetadata(related_request_id=ctx.request_id)
    session = ctx.request_context.session
    if isinstance(request, types.ElicitRequest):
        return await session.send_request(request, types.ElicitResult, metadata=metadata)
    if isinstance(request, types.CreateMessageRequest):
        return await session.send_request(request, types.CreateMessageResult, metadata=metadata)
    return await session.send_request(request, types.ListRootsResult, metadata=metadata)


async def exchange(
    ctx: Context,
    requests: Mapping[str, types.InputRequest],
    *,
    request_state: str | None = None,
) -> dict[str, types.InputResponse] | types.InputRequiredResult:
    """Ask the client the questions in *requests* (key -> sampling/elicitation/roots request).

    Handshake era: each request is sent to the client now, in order, on the tool call's own
    stream; the answers come back keyed like *requests*. 2026 era: answers the client already
    sent with this retry (``inputResponses``) are returned when every key is answered;
    otherwise an ``InputRequiredResult`` asking for the missing ones (carrying
    *request_state*), which the tool returns as is.

    Raises:
        ToolError: handshake era, the client did not declare the capability a request needs.
    """
    if is_modern(ctx):
        answers = dict(ctx.input_responses or {})
        missing = {key: request for key, request in requests.items() if key not in answers}
        if not missing:
            return {key: answers[key] for key in requests}
        return types.InputRequiredResult(input_requests=missing, request_state=request_state)
    results: dict[str, types.InputResponse] = {}
    for key, request in requests.items():
        capability = _capability_missing(ctx, request)
        if capability is not None:
            raise ToolError(f"the client did not declare the {capability!r} capability")
        results[key] = await _ask_now(ctx, request)
    return results


def elicit_request(message: str, schema: dict[str, Any]) -> types.ElicitRequest:
    """A form-mode ``elicitation/create`` request."""
    return types.ElicitRequest(
        params=types.ElicitRequestFormParams(message=message, requested_schema=schema)
    )


def sampling_request(prompt: str, max_tokens: int) -> types.CreateMessageRequest:
    """A ``sampling/createMessage`` request with one user text message."""
    return types.CreateMessageRequest(
        params=types.CreateMessageRequestParams(
            messages=[
                types.SamplingMessage(
                    role="user", content=types.TextContent(type="text", text=prompt)
                )
            ],
            max_tokens=max_tokens,
        )
    )


def text_of(answer: types.InputResponse | None) -> str:
    """The text a sampling answer carries, or ``?``."""
    if isinstance(answer, types.CreateMessageResult) and isinstance(
        answer.content, types.TextContent
    ):
        return answer.content.text
    return "?"


def form_value(answer: types.InputResponse | None, name: str) -> Any:
    """Field *name* of an accepted elicitation answer, or None."""
    if isinstance(answer, types.ElicitResult) and answer.content:
        return answer.content.get(name)
    return None
