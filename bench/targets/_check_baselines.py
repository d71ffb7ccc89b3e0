"""End-to-end check of the baseline targets (nginx, mcp-persist) against the example server.

Run: ``python -m bench.targets._check_baselines`` (the project's venv; after
``bench/setup_baselines.sh``). Loopback only, bounded: under a minute.

It starts the bundled example MCP server (official SDK, no event store), then through each
baseline: ``initialize`` (protocol 2025-11-25), ``notifications/initialized``, a ``tools/call``
of ``stream_notifications`` (100 notifications, no pause) counting the SSE events (100 + the
result). Through a resumable target (mcp-persist) it also resumes: reads 5 events of a second
call, disconnects, ``GET`` with ``Mcp-Session-Id`` and ``Last-Event-ID``, and expects the other
95 notifications and the result, each exactly once; then the same with a paced call (40
notifications 25 ms apart) disconnected mid-stream, to show what a resume of a stream still
running upstream gives. Exits 1 when a required check fails (the paced probe only reports).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.procs import child_process, python, read_announcement
from mcp_sse_gateway.sse import SSEDecoder

PROTOCOL_VERSION = "2025-11-25"
TARGETS = ("nginx", "mcp_persist")
TARGET_TIMEOUT_S = 60.0
READ_TIMEOUT_S = 10.0
COUNT = 100
HEAD = 5


@dataclass
class Stream:
    """What one SSE response carried."""

    status: int
    headers: dict[str, str]
    ids: list[str | None] = field(default_factory=list)
    indices: list[int] = field(default_factory=list)
    notifications: int = 0
    result: dict[str, Any] | None = None
    events: int = 0
    json_body: Any = None
    ended: str = ""

    def summary(self) -> str:
        ids = [i for i in self.ids if i is not None]
        shown = f"{ids[:3]}..{ids[-1:]}" if len(ids) > 4 else str(ids)
        return (
            f"HTTP {self.status}, {self.events} events ({self.notifications} notifications"
            f"{', result' if self.result is not None else ', NO result'}), ids {shown}, "
            f"{self.ended}"
        )


def _headers(session_id: str | None = None, last_event_id: str | None = None) -> dict[str, str]:
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": PROTOCOL_VERSION,
    }
    if session_id:
        headers["Mcp-Session-Id"] = session_id
    if last_event_id:
        headers["Last-Event-ID"] = last_event_id
    return headers


async def _read(
    response: aiohttp.ClientResponse,
    *,
    stop_after: int | None = None,
    wait_s: float = READ_TIMEOUT_S,
) -> Stream:
    """Read SSE events until the JSON-RPC result, *stop_after* events, the end, or *wait_s*."""
    stream = Stream(response.status, {k.lower(): v for k, v in response.headers.items()})
    if "text/event-stream" not in response.headers.get("Content-Type", ""):
        body = await response.read()
        stream.json_body = json.loads(body) if body.strip() else None
        stream.ended = "not SSE"
        return stream
    decoder = SSEDecoder(max_event_bytes=1 << 24)
    try:
        async with asyncio.timeout(wait_s):
            async for chunk in response.content.iter_any():
                for event in decoder.feed(chunk):
                    if not event.data:
                        stream.ids.append(event.id)  # a priming event: an id, no data
                        continue
                    stream.events += 1
                    stream.ids.append(event.id)
                    message = json.loads(event.data)
                    if "method" in message:
                        stream.notifications += 1
                        data = message.get("params", {}).get("data")
                        if isinstance(data, dict) and "index" in data:
                            stream.indices.append(int(data["index"]))
                    else:
                        stream.result = message
                    if stream.result is not None:
                        stream.ended = "stopped at the result"
                        return stream
                    if stop_after is not None and stream.events >= stop_after:
                        stream.ended = f"disconnected after {stop_after} events"
                        return stream
            stream.ended = "server ended the body"
    except TimeoutError:
        stream.ended = f"still open after {wait_s:g} s"
    return stream


class Session:
    """One MCP session through a target, with a raw view of each SSE response."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http = http
        self.url = url
        self.session_id: str | None = None
        self.next_id = 0

    async def post(self, message: dict[str, Any], *, stop_after: int | None = None) -> Stream:
        async with self.http.post(
            self.url, data=json.dumps(message), headers=_headers(self.session_id)
        ) as response:
            return await _read(response, stop_after=stop_after)

    async def request(self, method: str, params: dict[str, Any], **kw: Any) -> Stream:
        self.next_id += 1
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        return await self.post(message, **kw)

    async def initialize(self) -> Stream:
        stream = await self.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "bench-check-baselines", "version": "0"},
            },
        )
        self.session_id = stream.headers.get("mcp-session-id")
        notified = await self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        stream.ended += f"; notifications/initialized -> HTTP {notified.status}"
        return stream

    async def call_stream(self, count: int, interval_ms: float, **kw: Any) -> Stream:
        args = {"count": count, "interval_ms": interval_ms}
        return await self.request(
            "tools/call", {"name": "stream_notifications", "arguments": args}, **kw
        )

    async def resume(self, last_event_id: str, wait_s: float = READ_TIMEOUT_S) -> Stream:
        headers = _headers(self.session_id, last_event_id)
        del headers["Content-Type"]
        async with self.http.get(self.url, headers=headers) as response:
            return await _read(response, wait_s=wait_s)

    async def delete(self) -> int:
        async with self.http.delete(self.url, headers=_headers(self.session_id)) as response:
            return response.status


def _exactly_once(head: Stream, tail: Stream, count: int) -> tuple[bool, str]:
    indices = head.indices + tail.indices
    ok = indices == list(range(count)) and tail.result is not None
    missing = sorted(set(range(count)) - set(indices))
    dups = len(indices) - len(set(indices))
    return ok, (
        f"{len(head.indices)} + {len(tail.indices)} notifications, result "
        f"{'yes' if tail.result is not None else 'no'}, missing {len(missing)}"
        f"{' ' + str(missing[:5]) if missing else ''}, duplicates {dups}"
    )


async def _wait_stored(module: Any, running: Any, session: Session, request_id: int, n: int) -> int:
    """Poll the peer's Redis until *n* events of the call are stored; the count reached."""
    stored = 0
    deadline = time.monotonic() + READ_TIMEOUT_S
    while time.monotonic() < deadline:
        stored = await module.stream_length(running.redis_url, session.session_id, request_id)
        if stored >= n:
            break
        await asyncio.sleep(0.02)
    return stored


async def _disconnect_and_resume(
    module: Any,
    running: Any,
    session: Session,
    count: int,
    interval_ms: float,
    *,
    wait_stored: bool,
) -> tuple[bool, str]:
    """A call read for HEAD events, a disconnect, then GET + Last-Event-ID; (complete, detail)."""
    head = await session.call_stream(count, interval_ms, stop_after=HEAD)
    request_id = session.next_id
    last = next((i for i in reversed(head.ids) if i is not None), None)
    if last is None:
        return False, f"no event id in the first {HEAD} events"
    stored = ""
    if wait_stored:
        stored = (
            f"{await _wait_stored(module, running, session, request_id, count + 1)} events stored, "
        )
    tail = await session.resume(last, wait_s=count * interval_ms / 1000 + 3)
    complete, detail = _exactly_once(head, tail, count)
    # Let the call end upstream before the next step, so steps do not overlap.
    await _wait_stored(module, running, session, request_id, count + 1)
    return complete, f"Last-Event-ID {last}, {stored}GET -> {tail.summary()}; {detail}"


async def _check_resume(
    module: Any, running: Any, http: aiohttp.ClientSession, report: Any, name: str
) -> None:
    """Resumes through the peer, each on a fresh session unless said otherwise."""

    async def fresh() -> Session:
        session = Session(http, running.url)
        await session.initialize()
        return session

    # Required: the stream has ended and is stored when the client comes back.
    session = await fresh()
    complete, detail = await _disconnect_and_resume(
        module, running, session, COUNT, 0, wait_stored=True
    )
    report(
        complete, f"resume of a stored stream ({COUNT} x 0 ms, disconnect after {HEAD}): {detail}"
    )

    def info(label: str, complete: bool, detail: str) -> None:
        print(f"[{name}] info {label}: {detail} -> {'complete' if complete else 'INCOMPLETE'}")

    # The same session again: its standalone GET stream (opened by the first resume) is live.
    complete, detail = await _disconnect_and_resume(
        module, running, session, COUNT, 0, wait_stored=True
    )
    info("second resume in the same session", complete, detail)

    # A standalone GET stream opened first (as SDK clients do after initialize), then a resume.
    session = await fresh()
    get_headers = _headers(session.session_id)
    del get_headers["Content-Type"]
    async with http.get(running.url, headers=get_headers) as response:
        opened = await _read(response, wait_s=0.3)
    complete, detail = await _disconnect_and_resume(
        module, running, session, COUNT, 0, wait_stored=True
    )
    info(f"resume after a standalone GET (HTTP {opened.status}, closed)", complete, detail)

    # Reconnecting at once, while the upstream is still sending.
    for count, interval_ms in ((COUNT, 0), (40, 25)):
        session = await fresh()
        complete, detail = await _disconnect_and_resume(
            module, running, session, count, interval_ms, wait_stored=False
        )
        info(f"immediate resume ({count} x {interval_ms} ms)", complete, detail)


def _alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if Path(f"/proc/{pid}").exists()]


async def check_target(module_name: str, upstream_url: str, workdir: Path) -> bool:
    module = importlib.import_module(f"bench.targets.{module_name}")
    name = getattr(module, "NAME", module_name)
    reason = module.available()
    if reason is not None:
        print(f"[{name}] SKIP: {reason}")
        return True
    ok = True

    def report(passed: bool, what: str) -> None:
        nonlocal ok
        ok = ok and passed
        print(f"[{name}] {'ok  ' if passed else 'FAIL'} {what}")

    started = time.monotonic()
    async with (
        asyncio.timeout(TARGET_TIMEOUT_S),
        module.start(upstream_url, workdir=workdir) as running,
    ):
        print(
            f"[{name}] started in {time.monotonic() - started:.2f} s: {running.url}, "
            f"pids {running.pids}"
        )
        for note in running.notes:
            print(f"[{name}] note: {note}")
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as http:
            session = Session(http, running.url)
            init = await session.initialize()
            result = init.result or init.json_body or {}
            version = result.get("result", {}).get("protocolVersion")
            report(
                init.status == 200
                and session.session_id is not None
                and version == PROTOCOL_VERSION,
                f"initialize: {init.summary()}; protocolVersion {version}, "
                f"Mcp-Session-Id {'present' if session.session_id else 'MISSING'}",
            )

            call = await session.call_stream(COUNT, 0)
            report(
                call.notifications == COUNT
                and call.result is not None
                and call.events == COUNT + 1,
                f"tools/call stream_notifications({COUNT}): {call.summary()}",
            )
            report(
                call.indices == list(range(COUNT)),
                f"notifications in order, exactly once ({len(call.indices)} indices)",
            )

            if getattr(module, "RESUMABLE", False):
                await _check_resume(module, running, http, report, name)
            else:
                ids = [i for i in call.ids if i is not None]
                print(
                    f"[{name}] info no resumability: {len(ids)} of {call.events} events carry an "
                    "id (the example server sends none), so a client has no Last-Event-ID"
                )
            print(f"[{name}] info DELETE session -> HTTP {await session.delete()}")
    left = _alive(running.pids)
    report(not left, f"stopped: {'all processes gone' if not left else f'still running: {left}'}")
    return ok


async def main(keep: bool) -> int:
    with contextlib.ExitStack() as stack:
        if keep:
            workdir = Path(tempfile.mkdtemp(prefix="bench-baselines-"))
            print(f"work directory (kept): {workdir}")
        else:
            workdir = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-baselines-"))
            )
        argv = [python(), "-m", "mcp_sse_gateway.example", "--host", "127.0.0.1", "--port", "0"]
        async with child_process("example-upstream", argv, workdir=workdir) as upstream:
            upstream_url = await read_announcement(upstream, "LISTENING ", 30.0)
            print(f"upstream: example server at {upstream_url}")
            results = []
            for module_name in TARGETS:
                try:
                    results.append(
                        await check_target(module_name, upstream_url, workdir / module_name)
                    )
                except Exception as exc:
                    print(f"[{module_name}] FAIL {type(exc).__name__}: {exc}")
                    results.append(False)
        with contextlib.suppress(OSError):
            for log in sorted(workdir.rglob("*.log")):
                text = log.read_text(errors="replace").strip()
                if text and any(
                    w in text.lower() for w in ("error", "traceback", "[emerg]", "[alert]")
                ):
                    print(f"--- {log.relative_to(workdir)} (tail) ---\n{text[-1500:]}")
    print("all checks passed" if all(results) else "SOME CHECKS FAILED")
    return 0 if all(results) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.targets._check_baselines")
    parser.add_argument(
        "--keep", action="store_true", help="keep the work directory (logs, configs)"
    )
    sys.exit(asyncio.run(main(parser.parse_args().keep)))
