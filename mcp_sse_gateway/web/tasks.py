"""The Tasks extension on the MCP endpoint, for requests of the 2026-07-28 era (DESIGN D11).

With ``[tasks] enabled``, a POST of one JSON-RPC request without ``Mcp-Session-Id`` whose
``_meta`` protocol version (else ``MCP-Protocol-Version``) is 2026-07-28 or later is looked at
here first (:func:`serve`); anything this module does not answer goes on as before (relayed).

* ``server/discover``: relayed, and ``io.modelcontextprotocol/tasks`` added under
  ``capabilities.extensions`` of the upstream's answer.
* ``tools/call`` of a tool in ``[tasks.tools]`` from a client that declares the extension (in the
  request's ``_meta`` client capabilities): a task (:mod:`mcp_sse_gateway.streams.tasks`),
  answered with a ``CreateTaskResult``. Without the declaration, a ``required`` tool gets
  ``-32021`` and the others run synchronously upstream.
* ``tasks/get``, ``tasks/update``, ``tasks/cancel``: answered from the store (``-32021`` without
  the declaration; ``-32602`` for an unknown task, or another client's). ``tasks/result`` and
  ``tasks/list`` (removed from the extension) get ``-32601``.
* ``Mcp-Method`` and ``Mcp-Name`` headers (SEP-2243) that disagree with the body of a request
  answered here get HTTP 400 with ``-32020``.

Sources: SEP-2663 (Tasks extension), SEP-2322 (multi round-trip requests), SEP-2575 (stateless
requests, ``_meta``, ``-32021``), SEP-2243 (``Mcp-Method``, ``Mcp-Name``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from http import HTTPStatus
from typing import Any

import structlog
from aiohttp import web

from mcp_sse_gateway import jsonrpc
from mcp_sse_gateway.errors import SSEError, UpstreamError
from mcp_sse_gateway.headers import client_response_headers
from mcp_sse_gateway.store.base import TASK_SCOPE
from mcp_sse_gateway.streams.answers import jsonrpc_response
from mcp_sse_gateway.streams.task_record import (
    HEADER_MISMATCH,
    MODERN_ERA,
    TASKS_EXTENSION,
    declares_tasks,
    is_modern,
    missing_capability,
)
from mcp_sse_gateway.streams.tasks import UnknownTask
from mcp_sse_gateway.streams.upstream import BODY_HEADERS, UpstreamCall, is_event_stream
from mcp_sse_gateway.web.keys import AUTHORIZER, SETTINGS, STREAMS, UPSTREAM
from mcp_sse_gateway.web.passthrough import relay_response

log = structlog.get_logger("mcp_sse_gateway.tasks")

#: Methods of the extension answered by the gateway.
TASK_METHODS = frozenset({"tasks/get", "tasks/update", "tasks/cancel"})
#: Methods of the first version of tasks, removed from the extension.
REMOVED_METHODS = frozenset({"tasks/result", "tasks/list"})
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602


async def serve(
    request: web.Request,
    session_id: str | None,
    body: bytes | None,
    messages: list[dict[str, Any]] | None,
    call: UpstreamCall,
) -> web.StreamResponse | None:
    """Answer *request* when it is the task surface's (see the module docstring), else None.

    *call* is how the request would be forwarded upstream; a request of a session (legacy
    era) is never the task surface's.

    Raises:
        StoreError: the store is down or full (503, as the middleware maps it).
        UpstreamError: ``server/discover`` could not be forwarded (502).
    """
    message = _task_surface(request, session_id, body, messages)
    if message is None or body is None:
        return None
    method, rid = message.get("method"), message.get("id")
    params = message.get("params")
    params = params if isinstance(params, dict) else {}
    if _headers_disagree(request, str(method), params):
        log.info("tasks.header_mismatch", method=method)
        return _error(rid, HEADER_MISMATCH, "Mcp-Method or Mcp-Name disagrees with the body", 400)
    if method in REMOVED_METHODS:
        return _error(rid, METHOD_NOT_FOUND, "Method not found")
    if method == "server/discover":
        return await _discover(request, call, body, rid)
    binding, creator = request.app[AUTHORIZER].binding(request)
    call = dataclasses.replace(call, auth=binding, creator=creator)
    if method == "tools/call":
        return await _tools_call(request, message, call, str(params.get("name")))
    return await _task_method(request, message, params, call)


def _task_surface(
    request: web.Request,
    session_id: str | None,
    body: bytes | None,
    messages: list[dict[str, Any]] | None,
) -> dict[str, Any] | None:
    """The request's one JSON-RPC request when the task surface serves it, else None."""
    settings = request.app[SETTINGS].tasks
    if not settings.enabled or session_id is not None or request.method != "POST":
        return None
    message = jsonrpc.lone_message(body, messages)
    if message is None:
        return None
    params = message.get("params")
    if not jsonrpc.is_request(message) or not is_modern(
        params, request.headers.get("MCP-Protocol-Version")
    ):
        return None
    method = message.get("method")
    if not isinstance(method, str):
        return None  # not a request the surface knows: the upstream answers it
    if method in TASK_METHODS or method in REMOVED_METHODS or method == "server/discover":
        return message
    tool = params.get("name") if method == "tools/call" and isinstance(params, dict) else None
    return message if isinstance(tool, str) and tool in settings.tools else None


def _headers_disagree(request: web.Request, method: str, params: dict[str, Any]) -> bool:
    """Whether ``Mcp-Method`` or ``Mcp-Name``, when sent, name something else than the body."""
    sent_method = request.headers.get("Mcp-Method")
    if sent_method is not None and sent_method != method:
        return True
    sent_name = request.headers.get("Mcp-Name")
    if sent_name is None:
        return False
    key = "name" if method == "tools/call" else "taskId" if method in TASK_METHODS else None
    return key is not None and sent_name != params.get(key)


async def _tools_call(
    request: web.Request, message: dict[str, Any], call: UpstreamCall, tool: str
) -> web.StreamResponse | None:
    settings = request.app[SETTINGS].tasks
    support = settings.tools[tool]
    params = message.get("params") or {}
    rid = message.get("id")
    if not declares_tasks(params):
        if support == "required":
            return web.json_response(missing_capability(rid))
        return None  # runs synchronously upstream, relayed as today
    tasks = request.app[STREAMS].tasks
    first = None
    if support == "after_input" and not params.get("inputResponses"):
        # An MRTR round the upstream answers at once is relayed as it is, before any task.
        first = tasks.first_round(message, call)
        try:
            await asyncio.wait({first}, timeout=settings.input_wait_ms / 1000)
        except asyncio.CancelledError:
            first.cancel()  # the client left: in this era that cancels the call
            raise
        if first.done() and (outcome := first.result()).kind == "input":
            return web.json_response({"jsonrpc": "2.0", "id": rid, "result": outcome.body})
    record = await tasks.create(message, call, first=first)
    return web.json_response({"jsonrpc": "2.0", "id": rid, "result": record.create_result()})


async def _task_method(
    request: web.Request, message: dict[str, Any], params: dict[str, Any], call: UpstreamCall
) -> web.StreamResponse:
    method, rid = message.get("method"), message.get("id")
    if not declares_tasks(params):
        return web.json_response(missing_capability(rid))
    task_id, responses = params.get("taskId"), params.get("inputResponses")
    if not isinstance(task_id, str) or not task_id:
        return _error(rid, INVALID_PARAMS, "taskId must be a non-empty string")
    if method == "tasks/update" and not isinstance(responses, dict):
        return _error(rid, INVALID_PARAMS, "inputResponses must be an object")
    authorizer = request.app[AUTHORIZER]

    def owns(binding: str) -> bool:
        return authorizer.owns_task(binding, request)

    tasks = request.app[STREAMS].tasks
    try:
        # Served from the store only to what the upstream accepts now (D8): the creator's
        # credentials, checked with the upstream like a resume (an expired JWT is asked about).
        refused = await authorizer.authorize(
            request,
            session_id=None,
            binding=await tasks.binding(task_id, owns),
            url=call.url,
            headers=call.headers,
            protocol_version=request.headers.get("MCP-Protocol-Version") or MODERN_ERA,
            scope=TASK_SCOPE + task_id,
        )
        if refused is not None:
            return refused
        if method == "tasks/get":
            result = (await tasks.get(task_id, owns)).detailed()
        elif method == "tasks/cancel":
            await tasks.cancel(task_id, owns)
            result = {"resultType": "complete"}
        else:
            await tasks.update(task_id, owns, responses or {}, call)
            result = {"resultType": "complete"}
    except UnknownTask:
        return _error(rid, INVALID_PARAMS, "Unknown task")
    return _result(rid, result)


async def _discover(
    request: web.Request, call: UpstreamCall, body: bytes, rid: Any
) -> web.StreamResponse:
    """Relay ``server/discover``, adding the extension to the upstream's capabilities.

    A 2xx answer (JSON, or an SSE stream read until its response) is answered as JSON with
    the extension added; anything else is relayed as it is (a 401 with its challenge, say).
    """
    limit = request.app[SETTINGS].store.max_event_bytes
    response = await request.app[UPSTREAM].open("POST", call.url, call.headers, body)
    async with response:
        if not HTTPStatus.OK <= response.status < HTTPStatus.MULTIPLE_CHOICES or (
            response.content_type != "application/json" and not is_event_stream(response)
        ):
            return await relay_response(request, response)
        try:
            message = await jsonrpc_response(response, max_bytes=limit)
        except (UpstreamError, SSEError):
            message = None
        if message is None:
            text = "The upstream's discover answer is not a JSON-RPC response"
            return _error(rid, jsonrpc.UPSTREAM_HTTP_ERROR, text, HTTPStatus.BAD_GATEWAY)
        result = message.get("result")
        capabilities = result.setdefault("capabilities", {}) if isinstance(result, dict) else None
        if isinstance(capabilities, dict):
            extensions = capabilities.setdefault("extensions", {})
            if isinstance(extensions, dict):
                extensions.setdefault(TASKS_EXTENSION, {})
        headers = {
            n: v
            for n, v in client_response_headers(list(response.headers), keep_length=False)
            if n.lower() not in BODY_HEADERS
        }
        return web.json_response(message, status=response.status, headers=headers)


def _result(rid: Any, result: dict[str, Any]) -> web.Response:
    return web.json_response({"jsonrpc": "2.0", "id": rid, "result": result})


def _error(rid: Any, code: int, message: str, status: int = HTTPStatus.OK) -> web.Response:
    return web.json_response(jsonrpc.error_response(rid, code, message), status=status)
