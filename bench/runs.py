"""Building blocks of the scenarios: open client sessions, run calls, replay, wait for the store.

Every wait has a deadline; every loop is bounded by a count of clients or events.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.client import ClientError, Connection, Endpoint, McpClient, StreamSink, percentile
from bench.procs import cpu_seconds, http_get, self_cpu_seconds, wait_until
from bench.targets.base import Running

#: Sessions initialised at once while setting up a run (setup is outside the timed window).
SETUP_CONCURRENCY = 64
SETUP_TIMEOUT_S = 120.0
_STORED = re.compile(rb"^mcp_sse_gateway_events_stored_total (\S+)$", re.MULTILINE)


@dataclass
class Upstream:
    """The upstream the targets are in front of."""

    url: str
    pids: list[int]
    counters: bool = True  # serves /bench/finished

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint.parse(self.url)

    async def finished(self) -> dict[str, int]:
        """The synthetic upstream's call counters (``/bench/finished``)."""
        endpoint = self.endpoint
        status, body = await http_get(endpoint.host, endpoint.port, "/bench/finished")
        if status != 200:
            raise ClientError(f"/bench/finished answered {status}")
        return json.loads(body)


@dataclass
class RunStats:
    """One timed run of concurrent tool calls."""

    target: str
    streams: int
    events_per_stream: int
    events: int = 0
    notifications: int = 0
    elapsed_s: float = 0.0
    target_cpu_s: float = 0.0
    upstream_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    completed: int = 0
    errors: list[str] = field(default_factory=list)
    latencies_ns: list[int] = field(default_factory=list)
    late: int = 0
    max_lag_ns: int = 0

    @property
    def ok(self) -> bool:
        return not self.errors and self.completed == self.streams

    @property
    def events_per_s(self) -> float:
        return self.events / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def cpu_us_per_event(self, seconds: float) -> float:
        return seconds / self.events * 1e6 if self.events else float("nan")

    def summary(self) -> dict[str, Any]:
        data = {
            "target": self.target,
            "streams": self.streams,
            "events_per_stream": self.events_per_stream,
            "events": self.events,
            "elapsed_s": round(self.elapsed_s, 4),
            "events_per_s": round(self.events_per_s, 1),
            "target_cpu_us_per_event": _round(self.cpu_us_per_event(self.target_cpu_s)),
            "upstream_cpu_us_per_event": _round(self.cpu_us_per_event(self.upstream_cpu_s)),
            "client_cpu_us_per_event": _round(self.cpu_us_per_event(self.client_cpu_s)),
            "completed": self.completed,
            "errors": self.errors[:5],
            "late": self.late,
            "max_lag_ms": round(self.max_lag_ns / 1e6, 3),
        }
        if self.latencies_ns:
            data["p50_ms"] = round(percentile(self.latencies_ns, 50) / 1e6, 4)
            data["p99_ms"] = round(percentile(self.latencies_ns, 99) / 1e6, 4)
        return data


def _round(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 2)  # NaN → None (JSON)


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


async def open_clients(
    url: str,
    count: int,
    *,
    concurrency: int = SETUP_CONCURRENCY,
    timeout_s: float = SETUP_TIMEOUT_S,
) -> list[McpClient]:
    """*count* initialised sessions, each with its own idle keep-alive connection."""
    endpoint = Endpoint.parse(url)
    clients = [McpClient(endpoint) for _ in range(count)]
    semaphore = asyncio.Semaphore(concurrency)

    async def one(client: McpClient) -> None:
        async with semaphore:
            await client.initialize()

    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(*(one(client) for client in clients))
    except BaseException:
        close_clients(clients)
        raise
    return clients


def close_clients(clients: Iterable[McpClient]) -> None:
    for client in clients:
        client.close()


async def run_calls(
    target: Running,
    clients: Sequence[McpClient],
    arguments: dict[str, Any],
    *,
    upstream: Upstream,
    timeout_s: float,
    record_latency: bool = False,
    tool: str = "stream_notifications",
) -> RunStats:
    """One ``tools/call`` per client, all at once; timed from the first request to the last
    response, with the CPU time the target's, the upstream's and this process used meanwhile."""
    stats = RunStats(target.name, len(clients), int(arguments.get("count", 0)) + 1)
    sinks = [StreamSink(record_latency=record_latency) for _ in clients]
    cpu_target, cpu_upstream, cpu_self = (
        cpu_seconds(target.pids),
        cpu_seconds(upstream.pids),
        self_cpu_seconds(),
    )
    started_ns = time.time_ns()

    async def one(client: McpClient, sink: StreamSink) -> None:
        await client.call(sink, arguments, tool)

    results: list[Any] = []
    try:
        async with asyncio.timeout(timeout_s):
            results = await asyncio.gather(
                *(one(client, sink) for client, sink in zip(clients, sinks, strict=True)),
                return_exceptions=True,
            )
    except TimeoutError:
        stats.errors.append(f"timed out after {timeout_s:.0f} s")
    ended_ns = max((sink.response_ns for sink in sinks), default=0) or time.time_ns()
    stats.elapsed_s = (ended_ns - started_ns) / 1e9
    stats.target_cpu_s = cpu_seconds(target.pids) - cpu_target
    stats.upstream_cpu_s = cpu_seconds(upstream.pids) - cpu_upstream
    stats.client_cpu_s = self_cpu_seconds() - cpu_self
    stats.errors.extend(describe(r) for r in results if isinstance(r, BaseException))
    for sink in sinks:
        stats.events += sink.events
        stats.notifications += sink.notifications
        stats.completed += sink.response is not None
        stats.late += sink.late
        stats.max_lag_ns = max(stats.max_lag_ns, sink.max_lag_ns)
        if record_latency:
            stats.latencies_ns.extend(sink.latencies_ns)
    return stats


async def stored_events(target: Running) -> float | None:
    """Events the target has stored so far: its probe (mcp-persist: a Redis counter), else
    ``mcp_sse_gateway_events_stored_total`` from its metrics; None when it tells neither."""
    if target.stored_probe is not None:
        return float(await target.stored_probe())
    if target.metrics_url is None:
        return None
    endpoint = Endpoint.parse(target.metrics_url)
    status, body = await http_get(endpoint.host, endpoint.port, endpoint.path)
    if status != 200:
        return None
    match = _STORED.search(body)
    return float(match.group(1)) if match else None


@dataclass
class StoreMark:
    """Upstream and store counters before some calls, to wait until they are all stored."""

    finished: int
    stored: float | None


async def store_mark(target: Running, upstream: Upstream) -> StoreMark:
    counters = await upstream.finished() if upstream.counters else {"finished": 0}
    return StoreMark(counters["finished"], await stored_events(target))


async def wait_stored(
    target: Running,
    upstream: Upstream,
    mark: StoreMark,
    *,
    calls: int,
    events: int,
    timeout_s: float,
) -> None:
    """Wait until *calls* more calls finished upstream and (when the target tells) *events*
    more events are in its store: then a resume replays from the store alone."""

    async def complete() -> bool:
        if upstream.counters and (await upstream.finished())["finished"] < mark.finished + calls:
            return False
        if mark.stored is not None:
            stored = await stored_events(target)
            return stored is not None and stored >= mark.stored + events
        return True

    await wait_until(
        complete, timeout_s=timeout_s, what="the streams to be complete in the store", poll_s=0.005
    )


@dataclass
class ReplayResult:
    target: str
    missed: int
    replay_ms: float = float("nan")
    events: int = 0
    error: str | None = None


async def replay_once(
    target: Running, upstream: Upstream, *, missed: int, payload_bytes: int, timeout_s: float
) -> ReplayResult:
    """Start a call of *missed* events (notifications + the response), keep only its priming
    event, wait until it is complete in the store, then time GET + ``Last-Event-ID`` (on an
    open connection) until the JSON-RPC response arrives."""
    result = ReplayResult(target.name, missed)
    client = McpClient(Endpoint.parse(target.url), timeout_s=timeout_s)
    connection: Connection | None = None
    try:
        await client.initialize()
        mark = await store_mark(target, upstream)
        primed = StreamSink(stop_after_priming=True)
        arguments = {"count": missed - 1, "interval_ms": 0, "payload_bytes": payload_bytes}
        with contextlib.suppress(ClientError):
            await client.call(primed, arguments)
        if primed.first_id is None:
            result.error = "no event id on the stream (not resumable)"
            return result
        await wait_stored(target, upstream, mark, calls=1, events=missed, timeout_s=timeout_s)
        endpoint = client.endpoint
        connection = await Connection.open(endpoint.host, endpoint.port)
        sink = StreamSink(track_lag=False, parse_after_end=True)
        sent_ns = time.time_ns()
        response = await client.resume(sink, primed.first_id, connection=connection)
        if response.status != 200:
            result.error = f"resume answered {response.status}"
            return result
        assert sink.done is not None
        async with asyncio.timeout(timeout_s):
            await sink.done
        result.replay_ms = (sink.response_ns - sent_ns) / 1e6
        result.events = sink.events
        expected = missed - primed.events  # no priming event: the first event was received
        if sink.events != expected:
            result.error = f"replayed {sink.events} events, expected {expected}"
    except Exception as exc:
        result.error = describe(exc)
    finally:
        if connection is not None:
            connection.close()
        client.close()
    return result


def median(values: Iterable[float]) -> float:
    clean = [v for v in values if not math.isnan(v)]
    return statistics.median(clean) if clean else float("nan")


def rotate(items: Sequence[str], by: int) -> list[str]:
    """*items* rotated by *by*: alternate which target runs first in each repetition."""
    if not items:
        return []
    by %= len(items)
    return [*items[by:], *items[:by]]
