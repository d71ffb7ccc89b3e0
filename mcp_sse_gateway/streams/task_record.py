"""A task's record and its wire shapes (the Tasks extension, SEP-2663; DESIGN D11). Sans-IO.

A task is one upstream ``tools/call`` the gateway runs on behalf of a client of the 2026-07-28
era. Its record (JSON in the store, under the task id) holds what ``tasks/get`` answers on any
replica, and what the gateway needs to go on: the original request (to re-issue it with the
client's input, SEP-2322 MRTR), the upstream's ``requestState``, the owner replica (whose death
fails the task, D7) and the creator's credential binding (D8: only the creator reads it).

Statuses: ``working`` → ``input_required`` ⇄ ``working`` → one of ``completed``, ``failed``,
``cancelled`` (terminal: never left).
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

from mcp_sse_gateway import jsonrpc

#: The extension's identifier: in ``capabilities.extensions`` and the client's declarations.
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
#: Request ``_meta`` keys of the 2026-07-28 era (SEP-2575).
META_PROTOCOL_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
#: The first protocol version without sessions, where the gateway may serve tasks.
MODERN_ERA = "2026-07-28"
#: JSON-RPC error codes of the era: an ``Mcp-*`` header that disagrees with the body (SEP-2243),
#: a capability the client did not declare (SEP-2575).
HEADER_MISMATCH = -32020
MISSING_CLIENT_CAPABILITY = -32021

_VERSION = re.compile(r"\d{4}-\d{2}-\d{2}")

Status = Literal["working", "input_required", "completed", "failed", "cancelled"]
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled"})


def now_iso() -> str:
    """The current UTC time as ISO 8601 with milliseconds and ``Z``."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def new_task_id() -> str:
    """A new task id: 128 random bits, URL-safe (it is also the ``Mcp-Name`` header's value)."""
    return secrets.token_urlsafe(16)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one upstream round of a task ended with.

    Attributes:
        kind: ``result`` (a tool result, ``isError`` or not), ``input`` (an
            ``InputRequiredResult``) or ``error`` (a JSON-RPC error: the upstream's, or the
            gateway's when the upstream failed or answered no JSON-RPC response).
        body: the result object, or the error object (``code``, ``message``, ``data``).
    """

    kind: Literal["result", "input", "error"]
    body: dict[str, Any]

    @classmethod
    def of_response(cls, message: dict[str, Any]) -> Outcome:
        """The outcome a JSON-RPC response carries (the gateway's error when malformed)."""
        error = message.get("error")
        if isinstance(error, dict):
            return cls("error", error)
        result = message.get("result")
        if not isinstance(result, dict):
            return gateway_error("the upstream answered a response without a result")
        if result.get("resultType") == "input_required":
            return cls("input", result)
        return cls("result", result)


def gateway_error(message: str, *, code: int = jsonrpc.UPSTREAM_STREAM_BROKEN) -> Outcome:
    """An error outcome of the gateway's own (the upstream failed, a replica died …)."""
    return Outcome("error", {"code": code, "message": message})


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """One task, as stored (see the module docstring).

    Attributes:
        task_id: the task id (128 random bits).
        status: see :data:`Status`.
        created_at: ISO 8601.
        updated_at: ISO 8601, of the last status change.
        ttl_ms: how long the record is kept after creation.
        poll_ms: the polling interval suggested to the client.
        owner: the replica running the upstream round now ("" while none runs).
        auth: the creator's credential binding (keyed digest; "" anonymous).
        request: the client's ``tools/call`` request (re-issued with the client's input).
        result: the tool result, once ``completed``.
        error: the JSON-RPC error, once ``failed``.
        input_requests: the upstream's ``inputRequests`` while ``input_required``.
        responses: the client's answers to them so far, by key.
        request_state: the upstream's ``requestState`` of the input round, if any.
    """

    task_id: str
    status: Status
    created_at: str
    updated_at: str
    ttl_ms: int
    poll_ms: int
    owner: str
    auth: str
    request: dict[str, Any]
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] = field(default_factory=dict)
    responses: dict[str, Any] = field(default_factory=dict)
    request_state: Any = None

    @property
    def terminal(self) -> bool:
        """Whether the task has ended (``completed``, ``failed`` or ``cancelled``)."""
        return self.status in TERMINAL

    @property
    def pending(self) -> dict[str, Any]:
        """The input requests the client has not answered yet."""
        return {k: v for k, v in self.input_requests.items() if k not in self.responses}

    def to_json(self) -> str:
        """The record as stored."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> TaskRecord:
        """A stored record.

        Raises:
            ValueError: not a record (corrupt, or of another version of the gateway).
        """
        try:
            data = json.loads(text)
            return cls(**data)
        except (TypeError, json.JSONDecodeError) as exc:
            raise ValueError("not a task record") from exc

    def settled(self, outcome: Outcome) -> TaskRecord:
        """The record after an upstream round ended with *outcome*."""
        stamp = now_iso()
        if outcome.kind == "input":
            requests = outcome.body.get("inputRequests")
            return replace(
                self,
                status="input_required",
                updated_at=stamp,
                owner="",
                input_requests=requests if isinstance(requests, dict) else {},
                responses={},
                request_state=outcome.body.get("requestState"),
            )
        if outcome.kind == "result":
            result = {k: v for k, v in outcome.body.items() if k != "resultType"}
            return replace(self, status="completed", updated_at=stamp, owner="", result=result)
        return replace(self, status="failed", updated_at=stamp, owner="", error=outcome.body)

    def cancelled(self) -> TaskRecord:
        """The record once cancelled."""
        return replace(self, status="cancelled", updated_at=now_iso(), owner="")

    def answered(self, responses: dict[str, Any], owner: str) -> TaskRecord:
        """The record with the client's *responses* to pending input requests (others ignored).

        Once every input request is answered the task is ``working`` again, owned by *owner*
        (which re-issues the call upstream).
        """
        merged = {**self.responses, **{k: v for k, v in responses.items() if k in self.pending}}
        record = replace(self, responses=merged)
        if record.pending:
            return record
        return replace(record, status="working", updated_at=now_iso(), owner=owner)

    def reissued(self) -> dict[str, Any]:
        """The ``tools/call`` request of the next round: the client's answers and the state."""
        params = dict(self.request.get("params") or {})
        params["inputResponses"] = self.responses
        params.pop("requestState", None)
        if self.request_state is not None:
            params["requestState"] = self.request_state
        return {**self.request, "params": params}

    # Wire shapes ------------------------------------------------------------------------------

    def _task(self) -> dict[str, Any]:
        return {
            "taskId": self.task_id,
            "status": self.status,
            "createdAt": self.created_at,
            "lastUpdatedAt": self.updated_at,
            "ttlMs": self.ttl_ms,
            "pollIntervalMs": self.poll_ms,
        }

    def create_result(self) -> dict[str, Any]:
        """The ``CreateTaskResult`` answering the ``tools/call``: flat, ``resultType: task``."""
        return {"resultType": "task", **self._task()}

    def detailed(self) -> dict[str, Any]:
        """The ``DetailedTask`` answering ``tasks/get``: the result, error or pending input."""
        out: dict[str, Any] = {"resultType": "complete", **self._task()}
        if self.status == "completed" and self.result is not None:
            out["result"] = self.result
        elif self.status == "failed" and self.error is not None:
            out["error"] = self.error
        elif self.status == "input_required":
            out["inputRequests"] = self.pending
        return out


def new_record(
    request: dict[str, Any], *, owner: str, auth: str, ttl_ms: int, poll_ms: int
) -> TaskRecord:
    """A new ``working`` task for the ``tools/call`` *request*."""
    stamp = now_iso()
    return TaskRecord(
        task_id=new_task_id(),
        status="working",
        created_at=stamp,
        updated_at=stamp,
        ttl_ms=ttl_ms,
        poll_ms=poll_ms,
        owner=owner,
        auth=auth,
        request=request,
    )


def declares_tasks(params: Any) -> bool:
    """Whether a request's ``_meta`` client capabilities declare the Tasks extension."""
    meta = params.get("_meta") if isinstance(params, dict) else None
    capabilities = meta.get(META_CLIENT_CAPABILITIES) if isinstance(meta, dict) else None
    extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
    return isinstance(extensions, dict) and TASKS_EXTENSION in extensions


def is_modern(params: Any, header_version: str | None) -> bool:
    """Whether a request speaks the 2026-07-28 era or later (``_meta`` version, else header)."""
    meta = params.get("_meta") if isinstance(params, dict) else None
    version = meta.get(META_PROTOCOL_VERSION) if isinstance(meta, dict) else None
    if not isinstance(version, str):
        version = header_version
    # Versions are dates (YYYY-MM-DD): compared as such, anything else is not modern.
    return (
        isinstance(version, str)
        and _VERSION.fullmatch(version) is not None
        and (version >= MODERN_ERA)
    )


def missing_capability(request_id: jsonrpc.JSONRPCId | None) -> dict[str, Any]:
    """The ``-32021`` error: the request needs the Tasks extension the client did not declare."""
    error = jsonrpc.error_response(
        request_id, MISSING_CLIENT_CAPABILITY, "Missing required client capability"
    )
    error["error"]["data"] = {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}}
    return error
