"""The JSON upgrade scenario: what ``sse.upgrade_json`` adds to a short tool call.

A JSON-only upstream (the synthetic one, ``"json": true``) answers each ``tools/call`` at once.
One client session per target makes short calls one after another; each call is timed from the
request to its JSON-RPC response, whether it came as JSON or as an SSE event. Targets: direct,
the gateway with the upgrade off (JSON relayed as it is), and with it on (memory and Redis):
the answer then is stored first and sent as one event of a primed stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.client import McpClient, StreamSink, percentile
from bench.report import Table, fmt
from bench.runs import close_clients, describe, median, open_clients, rotate
from bench.targets.gateway import available_redis, gateway_process, redis_server

if TYPE_CHECKING:
    from bench.scenarios import Context, Outcome

UPGRADE_ENV = {"MCP_SSE_GATEWAY_SSE__UPGRADE_JSON": "true"}
WARMUP_CALLS = 20
CALL_TIMEOUT_S = 10.0
COLUMNS = [
    "target",
    "answer",
    "calls",
    "p50 ms",
    "p99 ms",
    "added p50 ms",
    "added p99 ms",
    "runs",
]


@contextlib.asynccontextmanager
async def _target(name: str, upstream_url: str, workdir: Path) -> AsyncIterator[str]:
    """The MCP URL of target *name* in front of *upstream_url* (*workdir* exists)."""
    if name == "direct":
        yield upstream_url
        return
    env = {"MCP_SSE_GATEWAY_STORE__BACKEND": "memory"}
    if name.endswith("+upgrade"):
        env |= UPGRADE_ENV
    if name.startswith("gateway-redis"):
        async with redis_server(workdir) as (_, redis_url):
            env |= {
                "MCP_SSE_GATEWAY_STORE__BACKEND": "redis",
                "MCP_SSE_GATEWAY_STORE__REDIS_URL": redis_url,
                "MCP_SSE_GATEWAY_AUTH__DIGEST_KEY": "bench-upgrade-digest-key-0123456789",
            }
            async with gateway_process(name, upstream_url, workdir=workdir, env=env) as (_, base):
                yield f"{base}/mcp"
        return
    async with gateway_process(name, upstream_url, workdir=workdir, env=env) as (_, base):
        yield f"{base}/mcp"


async def _calls(client: McpClient, count: int) -> tuple[list[float], bool]:
    """*count* short calls; their latencies (ms) and whether the answers were SSE."""
    latencies: list[float] = []
    sse = False
    for _ in range(count):
        await client.ensure_connection()
        sink = StreamSink()
        started = time.perf_counter_ns()
        headers = await _start(client, sink)
        sse = headers.is_sse
        assert sink.done is not None
        await sink.done
        latencies.append((time.perf_counter_ns() - started) / 1e6)
    return latencies, sse


async def _start(client: McpClient, sink: StreamSink) -> Any:
    headers = await asyncio.wait_for(client.start_call(sink, {"json": True}), CALL_TIMEOUT_S)
    if headers.status != 200:
        raise RuntimeError(f"tools/call answered {headers.status}")
    return headers


async def _measure(
    ctx: Context, names: list[str]
) -> tuple[dict[str, list[tuple[float, float]]], dict[str, str], dict[str, str]]:
    """Per target: (p50, p99) of each run; the answer type; why a target failed."""
    calls = ctx.sizes.upgrade_calls
    results: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    answers: dict[str, str] = {}
    failures: dict[str, str] = {}
    async with contextlib.AsyncExitStack() as stack:
        clients: dict[str, McpClient] = {}
        for name in names:
            workdir = ctx.workdir / f"upgrade-{name}"
            workdir.mkdir(parents=True, exist_ok=True)
            try:
                url = await stack.enter_async_context(_target(name, ctx.upstream.url, workdir))
                (clients[name],) = await open_clients(url, 1)
            except Exception as exc:
                failures[name] = f"failed to start: {describe(exc)}"
                ctx.log(f"  upgrade {name}: {failures[name]}")
        try:
            for client in clients.values():
                await _calls(client, WARMUP_CALLS)
            for rep in range(ctx.sizes.repeat):
                for name in rotate(list(clients), rep):
                    try:
                        latencies, sse = await _calls(clients[name], calls)
                    except Exception as exc:
                        failures[name] = describe(exc)
                        continue
                    answers[name] = "SSE" if sse else "JSON"
                    results[name].append((percentile(latencies, 50), percentile(latencies, 99)))
        finally:
            close_clients(clients.values())
    return results, answers, failures


async def upgrade(ctx: Context) -> Outcome:
    """Short calls on a JSON-only upstream: direct, upgrade off, upgrade on (memory, Redis)."""
    from bench.scenarios import Outcome

    outcome = Outcome("upgrade")
    calls = ctx.sizes.upgrade_calls
    names = ["direct", "gateway-memory", "gateway-memory+upgrade"]
    if available_redis() is None:
        names.append("gateway-redis+upgrade")
    results, answers, failures = await _measure(ctx, names)
    direct = results.get("direct") or []
    base50 = median([r[0] for r in direct]) if direct else 0.0
    base99 = median([r[1] for r in direct]) if direct else 0.0
    rows = []
    for name in names:
        runs = results[name]
        if not runs:
            rows.append([name, "", "", f"failed: {failures.get(name, '?')}", "", "", "", ""])
            continue
        p50, p99 = median([r[0] for r in runs]), median([r[1] for r in runs])
        rows.append(
            [
                name,
                answers.get(name, ""),
                f"{calls:,}",
                fmt(p50, 3),
                fmt(p99, 3),
                "0" if name == "direct" else fmt(p50 - base50, 3),
                "0" if name == "direct" else fmt(p99 - base99, 3),
                f"{len(runs)}/{ctx.sizes.repeat} ok",
            ]
        )
    outcome.tables.append(
        Table(
            title=f"JSON upgrade: short tool calls on a JSON-only upstream, {calls:,} in a row "
            f"per run, {ctx.sizes.repeat} runs each",
            columns=COLUMNS,
            rows=rows,
            notes=[
                "each call is timed from its request to its JSON-RPC response (a JSON body, or "
                "an SSE event after the priming event); p50/p99 per run, medians of the runs.",
                "added: minus direct's median in the same run. gateway-memory relays the JSON "
                "as it is (sse.upgrade_json off); +upgrade answers with a resumable stream, the "
                "result stored first.",
            ],
        )
    )
    outcome.data = {"runs": results, "answers": answers, "failures": failures}
    return outcome
