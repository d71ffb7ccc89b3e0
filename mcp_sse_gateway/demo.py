"""``mcp-sse-gateway demo``: the bundled example MCP server behind the gateway, and a resume.

Starts the example server (the official ``mcp`` SDK, no event store) on a free loopback port,
starts the gateway in front of it, then plays a client whose connection drops in the middle of a
long tool call: it reconnects with ``Last-Event-ID`` and checks that every notification and the
result arrived exactly once. Then it keeps both running until Ctrl-C (unless ``--once``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import signal
from typing import Any

import aiohttp

from mcp_sse_gateway.config import Settings
from mcp_sse_gateway.example.process import example_upstream
from mcp_sse_gateway.server import run_gateway

NOTIFICATIONS = 20
DROP_AFTER = 6
INTERVAL_MS = 50
#: Bounds every step of the demo client, seconds.
STEP_TIMEOUT_S = 30.0
PROTOCOL_VERSION = "2025-11-25"


def say(line: str) -> None:
    """Print one line of the demo's narration."""
    print(line, flush=True)  # noqa: T201


def _events(buffer: bytes) -> tuple[list[dict[str, str]], bytes]:
    """Complete SSE blocks of *buffer* (the gateway writes LF line ends), and the rest."""
    blocks = buffer.split(b"\n\n")
    events = []
    for block in blocks[:-1]:
        fields: dict[str, str] = {}
        for line in block.decode().split("\n"):
            name, _, value = line.partition(":")
            if name:
                fields[name] = fields.get(name, "") + value.removeprefix(" ")
        events.append(fields)
    return events, blocks[-1]


async def _read(response: aiohttp.ClientResponse, stop_after: int | None) -> list[dict[str, str]]:
    events: list[dict[str, str]] = []
    buffer = b""
    async with asyncio.timeout(STEP_TIMEOUT_S):
        while stop_after is None or len([e for e in events if e.get("data")]) < stop_after:
            chunk = await response.content.readany()
            if not chunk:
                break
            complete, buffer = _events(buffer + chunk)
            events += complete
    return events


def _messages_in(events: list[dict[str, str]]) -> int:
    """JSON-RPC messages among *events* (priming events and ``retry`` fields carry none)."""
    return len([e for e in events if e.get("data")])


def _index(message: dict[str, Any]) -> int | None:
    """The index a ``stream_notifications`` notification carries, or None for other messages."""
    params = message.get("params")
    if message.get("method", "").startswith("notifications/") and isinstance(params, dict):
        data = params.get("data")
        if isinstance(data, dict) and isinstance(data.get("index"), int):
            return int(data["index"])
        if isinstance(data, int):
            return data
    return None


async def play_client(mcp_url: str) -> bool:
    """Run a tool call, drop it mid-way, resume it; True when nothing was lost or repeated."""
    # Credentials as a real client sends them (the example server accepts any): the resume is
    # then the creator's own, served without asking the upstream (DESIGN D8).
    accept = {
        "Accept": "application/json, text/event-stream",
        "Authorization": f"Bearer demo-{secrets.token_hex(8)}",
    }
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=STEP_TIMEOUT_S)) as http:
        init = await http.post(
            mcp_url,
            headers=accept,
            json={
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": PROTOCOL_VERSION,
                    "capabilities": {},
                    "clientInfo": {"name": "mcp-sse-gateway-demo", "version": "1"},
                },
            },
        )
        session = {**accept, "Mcp-Session-Id": init.headers["Mcp-Session-Id"]}
        await init.read()
        await (
            await http.post(
                mcp_url,
                headers=session,
                json={"jsonrpc": "2.0", "method": "notifications/initialized"},
            )
        ).read()
        call = await http.post(
            mcp_url,
            headers=session,
            json={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {
                    "name": "stream_notifications",
                    "arguments": {"count": NOTIFICATIONS, "interval_ms": INTERVAL_MS},
                },
            },
        )
        first = await _read(call, stop_after=DROP_AFTER)
        call.close()
        say(
            f"tools/call stream_notifications(count={NOTIFICATIONS}): "
            f"{_messages_in(first)} notifications received, then the connection dropped"
        )
        cursor = next(e["id"] for e in reversed(first) if "id" in e)
        resumed = await http.get(mcp_url, headers={**session, "Last-Event-ID": cursor})
        second = await _read(resumed, stop_after=None)
        messages = [json.loads(e["data"]) for e in first + second if e.get("data")]
        indexes = [i for m in messages if (i := _index(m)) is not None]
        results = [m for m in messages if m.get("id") == 1 and "result" in m]
        rest = [json.loads(e["data"]) for e in second if e.get("data")]
        answered = any(m.get("id") == 1 for m in rest)
        say(
            f"reconnected with Last-Event-ID: the gateway replayed and streamed the other "
            f"{len(rest)} messages ({len(rest) - answered} notifications"
            f"{' and the result' if answered else ''})"
        )
        await http.delete(mcp_url, headers=session)
    if indexes == list(range(NOTIFICATIONS)) and len(results) == 1:
        say(
            f"nothing lost: {NOTIFICATIONS}/{NOTIFICATIONS} notifications and the result, "
            "each exactly once"
        )
        return True
    say(f"LOST OR REPEATED: notifications {indexes}, {len(results)} result(s)")
    return False


async def run_demo(settings: Settings, *, once: bool = False) -> int:
    """Run the demo; returns the exit code (0 when the resume lost nothing)."""
    async with contextlib.AsyncExitStack() as stack:
        upstream_url = await stack.enter_async_context(example_upstream())
        say(f"example MCP server (official mcp SDK, no event store): {upstream_url}")
        data = settings.model_dump()
        data["upstream"]["url"] = upstream_url
        try:
            gateway = await stack.enter_async_context(run_gateway(Settings.model_validate(data)))
        except OSError as exc:
            say(
                f"cannot listen on {settings.server.host}:{settings.server.port} "
                f"({exc.strerror}); choose another port with --port"
            )
            return 1
        say(f"gateway ({settings.store.backend} store) in front of it: {gateway.mcp_url}")
        ok = await play_client(gateway.mcp_url)
        if once or not ok:
            return 0 if ok else 1
        say(f"serving {gateway.mcp_url}; press Ctrl-C to stop")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
    return 0
