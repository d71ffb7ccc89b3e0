"""JSON-RPC 2.0 helpers for MCP messages: classify, find ids, read an InitializeResult.

Sans-IO. Messages are parsed only where the gateway needs to know something (request ids of a
POST, the ``protocolVersion`` of an initialize answer); bodies are always relayed as received.
Sources: JSON-RPC 2.0 specification; MCP 2025-11-25 "Base Protocol" and "Lifecycle".
"""

from __future__ import annotations

import json
import re
from typing import Any

JSONRPCId = str | int

#: Error code of the gateway's own JSON-RPC errors (implementation-defined server error range
#: -32000..-32099 of JSON-RPC 2.0). -32000 is used by the SDKs for "connection closed".
UPSTREAM_UNAVAILABLE = -32002
#: The upstream request ended before its JSON-RPC response arrived (stream broken, replica died).
UPSTREAM_STREAM_BROKEN = -32003
#: An upgraded JSON answer (``sse.upgrade_json``) was not a 2xx JSON-RPC response, and the
#: client already had its 200 stream: the error's ``data`` carries the upstream's HTTP status.
UPSTREAM_HTTP_ERROR = -32004


def parse_messages(body: bytes | str) -> list[dict[str, Any]] | None:
    """Parse a JSON-RPC message or batch.

    Returns:
        The messages (a batch flattened, order kept), or None when the body is not JSON or not
        JSON-RPC shaped (the caller relays it anyway and lets the upstream answer).
    """
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        # RecursionError: absurdly deep nesting; relayed as is, never parsed.
        return None
    items = parsed if isinstance(parsed, list) else [parsed]
    if not items or not all(isinstance(item, dict) for item in items):
        return None
    return items


#: Bytes of a body looked at to tell its encoding (a BOM, or the NUL pattern of UTF-16/32).
_BATCH_PREFIX_BYTES = 256
#: UTF-8's optional BOM, then JSON's whitespace (RFC 8259 §2), however long.
_UTF8_LEADING = re.compile(rb"(?:\xef\xbb\xbf)?[ \t\r\n]*")


def is_batch(body: bytes | str) -> bool:
    """Whether *body* is a JSON array (a batch) in any encoding ``json.loads`` reads.

    UTF-8, 16 or 32, with or without a byte order mark, leading whitespace skipped (all of it:
    a padded batch of one is still a batch).
    """
    if isinstance(body, bytes):
        try:
            encoding = json.detect_encoding(body[:_BATCH_PREFIX_BYTES])
        except LookupError:
            return False
        if encoding in {"utf-8", "utf-8-sig"}:
            leading = _UTF8_LEADING.match(body)
            index = leading.end() if leading is not None else 0
            return body[index : index + 1] == b"["
        text = body.decode(encoding, errors="ignore")
    else:
        text = body
    return text.lstrip("\ufeff \t\r\n")[:1] == "["


def lone_message(
    body: bytes | None, messages: list[dict[str, Any]] | None
) -> dict[str, Any] | None:
    """The one message of *body* when it is a lone JSON-RPC message, not a batch (even of one).

    Args:
        body: the request body as received.
        messages: :func:`parse_messages` of it (None: not JSON-RPC).
    """
    if not body or not messages or len(messages) != 1 or is_batch(body):
        return None
    return messages[0]


def is_request(message: dict[str, Any]) -> bool:
    """True for a JSON-RPC request (has ``method`` and an ``id``), false for notifications."""
    return "method" in message and message.get("id") is not None


def request_ids(messages: list[dict[str, Any]]) -> list[JSONRPCId]:
    """The ids of the requests among *messages*, in order (notifications and responses skipped)."""
    return [
        m["id"]
        for m in messages
        if is_request(m) and isinstance(m["id"], (str, int)) and not isinstance(m["id"], bool)
    ]


#: Longer method names are not reported (they are client-controlled).
MAX_METHOD_CHARS = 64


def method_name(messages: list[dict[str, Any]] | None) -> str | None:
    """The method of a lone request or notification (for a span), or None.

    A batch is ``"batch"``; a response, a non-string method or one over
    :data:`MAX_METHOD_CHARS` characters is None.
    """
    if not messages:
        return None
    if len(messages) > 1:
        return "batch"
    method = messages[0].get("method")
    if isinstance(method, str) and len(method) <= MAX_METHOD_CHARS:
        return method
    return None


def is_initialize(messages: list[dict[str, Any]] | None) -> bool:
    """True when the messages hold an ``initialize`` request."""
    return bool(messages) and any(m.get("method") == "initialize" for m in messages or ())


def initialize_version(messages: list[dict[str, Any]] | None) -> str | None:
    """The ``protocolVersion`` of an InitializeResult among *messages*, if any.

    Returns:
        The version string (e.g. ``"2025-11-25"``) or None when no message is a successful
        initialize response with a string ``result.protocolVersion``.
    """
    for message in messages or ():
        result = message.get("result")
        if "id" in message and isinstance(result, dict):
            version = result.get("protocolVersion")
            if isinstance(version, str) and "serverInfo" in result:
                return version
    return None


def error_response(request_id: JSONRPCId | None, code: int, message: str) -> dict[str, Any]:
    """A JSON-RPC error response object (``{"jsonrpc": "2.0", "id": …, "error": {…}}``)."""
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
