"""Bearer-token authorization for the example server (``--auth FILE``).

An OAuth-protected MCP server in miniature, to try and test the gateway's resume authorization
against.

The file is JSON, read again whenever it changes (so a token can be revoked while running)::

    {
      "tokens": {"<opaque token>": "<user>", ...},
      "jwt_secret": "<HS256 key>",            # optional: JWTs signed with it, sub = user
      "delay_ms": {"<token>": 3000}           # optional: answer this token's requests late
    }

Every request to the MCP endpoint must carry ``Authorization: Bearer <token>``: a known opaque
token, or a JWT signed with ``jwt_secret`` that has not expired. Otherwise: 401 with
``WWW-Authenticate: Bearer`` (MCP 2025-11-25, Authorization). With ``bind_sessions`` a session
belongs to the user who initialized it: another user's requests in it get 404, as if the
session did not exist (Security Best Practices, session hijacking).

``GET /_example/auth-stats`` (no token needed; a test aid) counts the JSON-RPC methods of every
POST received (authorized or not) and the refusals by status.
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import jwt

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

STATS_PATH = "/_example/auth-stats"
REALM = "mcp-sse-gateway-example"
#: Bodies read to count their JSON-RPC method, bytes (larger ones are passed on uncounted).
MAX_COUNTED_BODY_BYTES = 1024 * 1024


class TokenFile:
    """The token table of ``--auth FILE``, re-read when the file changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._data: dict[str, Any] = {}

    def _load(self) -> dict[str, Any]:
        stat = self.path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._stamp:
            self._data = json.loads(self.path.read_text(encoding="utf-8"))
            self._stamp = stamp
        return self._data

    def user(self, token: str) -> str | None:
        """The user *token* authenticates, or None (unknown, revoked, expired, bad signature)."""
        data = self._load()
        user = data.get("tokens", {}).get(token)
        if isinstance(user, str):
            return user
        secret = data.get("jwt_secret")
        if not secret or token.count(".") != 2:  # noqa: PLR2004 - JWS compact form
            return None
        try:
            claims = jwt.decode(
                token, secret, algorithms=["HS256"], options={"require": ["exp", "sub"]}
            )
        except jwt.InvalidTokenError:
            return None
        return str(claims["sub"])

    def delay_s(self, token: str) -> float:
        """How long to hold this token's requests before answering, seconds."""
        return float(self._load().get("delay_ms", {}).get(token, 0)) / 1000


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


async def _json_answer(
    send: Send, status: int, body: dict[str, Any], headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


class BearerAuth:
    """ASGI middleware: bearer tokens on the MCP endpoint, optional session binding, stats.

    Args:
        app: the MCP server's ASGI app.
        tokens: the token table.
        path: the MCP endpoint (other paths pass untouched).
        bind_sessions: a session belongs to the user who initialized it.
    """

    def __init__(self, app: ASGIApp, tokens: TokenFile, *, path: str, bind_sessions: bool) -> None:
        self.app = app
        self.tokens = tokens
        self.path = path.rstrip("/") or "/"
        self.bind_sessions = bind_sessions
        self.owners: dict[str, str] = {}
        self.methods: collections.Counter[str] = collections.Counter()
        self.refused: collections.Counter[str] = collections.Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection (HTTP on the MCP endpoint is checked, the rest passes)."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] == STATS_PATH:
            await _json_answer(
                send, 200, {"methods": dict(self.methods), "refused": dict(self.refused)}
            )
            return
        if (scope["path"].rstrip("/") or "/") != self.path:
            await self.app(scope, receive, send)
            return
        await self._mcp(scope, receive, send)

    async def _mcp(self, scope: Scope, receive: Receive, send: Send) -> None:
        receive = await self._counted(scope, receive)
        authorization = _header(scope, b"authorization") or ""
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        user = self.tokens.user(token) if scheme.lower() == "bearer" and token else None
        if user is None:
            self.refused["401"] += 1
            challenge = f'Bearer realm="{REALM}"'
            if token:
                challenge += ', error="invalid_token"'
            await _json_answer(
                send,
                401,
                {"error": "invalid_token" if token else "unauthorized"},
                [(b"www-authenticate", challenge.encode())],
            )
            return
        if delay_s := self.tokens.delay_s(token):
            await asyncio.sleep(delay_s)
        session_id = _header(scope, b"mcp-session-id")
        if self.bind_sessions and session_id and self.owners.get(session_id, user) != user:
            self.refused["404"] += 1
            await _json_answer(
                send,
                404,
                {
                    "jsonrpc": "2.0",
                    "id": None,
                    "error": {"code": -32001, "message": "Session not found"},
                },
            )
            return

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.start" and not session_id:
                for key, value in message.get("headers", []):
                    if bytes(key).lower() == b"mcp-session-id":
                        self.owners.setdefault(bytes(value).decode("latin-1"), user)
            await send(message)

        await self.app(scope, receive, recording_send)

    async def _counted(self, scope: Scope, receive: Receive) -> Receive:
        """Count a POST's JSON-RPC method(s); return a receive that replays the body."""
        if scope["method"] != "POST":
            return receive
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if not message.get("more_body") or size > MAX_COUNTED_BODY_BYTES:
                break
        if size <= MAX_COUNTED_BODY_BYTES:
            self._count(
                b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")
            )
        pending = collections.deque(messages)

        async def replay() -> Message:
            if pending:
                return pending.popleft()
            return await receive()

        return replay

    def _count(self, body: bytes) -> None:
        try:
            parsed = json.loads(body)
        except ValueError:
            return
        for item in parsed if isinstance(parsed, list) else [parsed]:
            if isinstance(item, dict) and isinstance(item.get("method"), str):
                self.methods[item["method"]] += 1
