"""The scenarios: throughput, growth, latency, replay, real upstream, scale, upgrade.

Each scenario starts the targets it compares (all at once, each idle while another runs),
alternates runs between them (the first target of a repetition rotates), repeats, and reports
medians. Every run is bounded in count and wall time; a run that times out is reported as such.

Saturated runs are sized per target: a pilot run (a tenth of the nominal events, at least
:attr:`Sizes.floor` per stream) measures the target's rate, then each measured run gets
``min(nominal, rate * budget)`` events, so a slow target's runs take about ``budget`` seconds
instead of minutes, and a fast one gets the full nominal size. Rates (events/s) and CPU per
event stay comparable; the tables show the size each target ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.client import Connection, Endpoint, McpClient, StreamSink, percentile
from bench.procs import raise_nofile_limit, rss_mib
from bench.report import Table, fmt, fmt_ratio
from bench.runs import (
    ReplayResult,
    RunStats,
    Upstream,
    close_clients,
    describe,
    median,
    open_clients,
    replay_once,
    rotate,
    run_calls,
    store_mark,
    wait_stored,
)
from bench.targets import Running, Target, sort_names
from bench.upgrade import upgrade

BASELINES = ("direct", "nginx", "mcp-persist")
TIMES = "\u00d7"
DASH = "\u2013"


@dataclass
class Sizes:
    """How big each scenario is. ``Sizes()`` for the real run, ``smoke()`` for a test."""

    repeat: int = 3
    payload_bytes: int = 100
    #: Fewest events per stream of a sized run.
    floor: int = 5
    throughput_streams: int = 10
    throughput_events: int = 5000
    throughput_budget_s: float = 5.0
    growth: tuple[tuple[int, int], ...] = ((1, 10_000), (10, 2000), (100, 200), (1000, 20))
    growth_budget_s: float = 3.0
    latency_events: int = 1000
    latency_interval_ms: float = 2.0
    replay_missed: tuple[int, ...] = (100, 1000, 10_000)
    replay_other_streams: int = 20
    replay_other_events: int = 5000
    replay_fill_budget_s: float = 15.0
    replay_with_others: int = 1000
    real_streams: int = 10
    real_events: int = 1000
    scale_streams: int = 5000
    scale_events: int = 20
    scale_interval_ms: float = 1000.0
    scale_resumers: int = 1000
    scale_behind: int = 100
    scale_storm_budget_s: float = 30.0
    scale_repeat: int = 1
    #: The sweep: the scale scenario's first phase at each of these concurrencies.
    sweep_streams: tuple[int, ...] = (1000, 2500, 5000, 10_000)
    upgrade_calls: int = 500

    @classmethod
    def smoke(cls) -> Sizes:
        return cls(
            repeat=1,
            throughput_streams=2,
            throughput_events=200,
            throughput_budget_s=1.0,
            growth=((1, 200), (10, 20)),
            growth_budget_s=1.0,
            latency_events=100,
            replay_missed=(100, 1000),
            replay_other_streams=2,
            replay_other_events=500,
            replay_fill_budget_s=2.0,
            replay_with_others=100,
            real_streams=2,
            real_events=20,
            scale_streams=20,
            scale_events=3,
            scale_interval_ms=500.0,
            scale_resumers=10,
            scale_behind=100,
            scale_storm_budget_s=5.0,
            sweep_streams=(10, 20),
            upgrade_calls=20,
        )


@dataclass
class Context:
    """What every scenario gets."""

    sizes: Sizes
    upstream: Upstream
    targets: dict[str, Target]
    skipped: dict[str, str]
    workdir: Path
    log: Callable[[str], None]
    #: Saturated events/s of each target (10 streams), from the throughput scenario.
    rates: dict[str, float] = field(default_factory=dict)


@dataclass
class Outcome:
    """What a scenario produced: tables for the report, raw data for the JSON file, plots."""

    name: str
    tables: list[Table] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    plots: dict[str, Any] = field(default_factory=dict)


def _deadline(events: int, *, floor_s: float = 30.0, rate: float = 200.0) -> float:
    """A run's bound: generous for a slow target (*rate* events/s), never unbounded."""
    return floor_s + events / rate


@contextlib.asynccontextmanager
async def started(
    ctx: Context, names: Sequence[str], upstream_url: str, failures: dict[str, str]
) -> AsyncIterator[dict[str, Running]]:
    """Start the *names* targets in front of *upstream_url*; failures are noted, not raised."""
    async with contextlib.AsyncExitStack() as stack:
        running: dict[str, Running] = {}
        for name in names:
            target = ctx.targets[name]
            try:
                run = await stack.enter_async_context(
                    target.start(upstream_url, workdir=ctx.workdir / name)
                )
            except Exception as exc:
                failures[name] = f"failed to start: {describe(exc)}"
                ctx.log(f"  {name}: {failures[name]}")
                continue
            if run.stored_probe is None and target.events_stored and run.redis_url:
                run.stored_probe = functools.partial(target.events_stored, run.redis_url)
            running[name] = run
        yield running


def _skip_rows(
    ctx: Context, names: Sequence[str], failures: dict[str, str], width: int
) -> list[list[str]]:
    reasons = {**ctx.skipped, **failures}
    return [
        [name, f"skipped: {reason}", *[""] * (width - 2)]
        for name, reason in sorted(reasons.items())
        if name in names or name in ctx.skipped
    ]


# sized, alternating runs ----------------------------------------------------------------------


@dataclass
class Shape:
    """Runs of one target at one shape (streams x events per stream)."""

    streams: int
    per_stream: int = 0
    pilot: RunStats | None = None
    runs: list[RunStats] = field(default_factory=list)
    error: str | None = None

    @property
    def good(self) -> list[RunStats]:
        return [run for run in self.runs if run.ok]

    @property
    def rate(self) -> float:
        return median(run.events_per_s for run in self.good)

    @property
    def failed_note(self) -> str:
        """``[n of m runs failed: first error; received x events/s]``, or empty."""
        failed = [run for run in self.runs if not run.ok]
        if not failed:
            return ""
        first = failed[0].errors[0] if failed[0].errors else "incomplete"
        rate = median(run.events_per_s for run in failed)
        return (
            f"[{len(failed)} of {len(self.runs)} runs failed: {first}; they received "
            f"{fmt(rate)} events/s]"
        )

    def cpu(self, attribute: str) -> float:
        return median(run.cpu_us_per_event(getattr(run, attribute)) for run in self.good)

    def summary(self) -> dict[str, Any]:
        return {
            "streams": self.streams,
            "events_per_stream": self.per_stream,
            "median_events_per_s": self.rate,
            "error": self.error,
            "pilot": self.pilot.summary() if self.pilot else None,
            "runs": [run.summary() for run in self.runs],
        }


async def measure_shape(
    ctx: Context,
    running: dict[str, Running],
    *,
    upstream: Upstream,
    streams: int,
    nominal: int,
    budget_s: float | None,
    label: str,
) -> dict[str, Shape]:
    """Sessions for every target (set up once, untimed), a pilot run each to size the runs,
    then ``repeat`` measured runs each, alternating between the targets.

    *nominal* counts the events of one stream, the response included. With *budget_s* None,
    every target runs the nominal size (the pilot is then only a warm-up).
    """
    sizes = ctx.sizes
    names = sort_names(list(running))
    shapes = {name: Shape(streams) for name in names}
    clients: dict[str, list[McpClient]] = {}
    try:
        for name in names:
            try:
                clients[name] = await open_clients(running[name].url, streams)
            except Exception as exc:
                shapes[name].error = f"setup: {describe(exc)}"
                ctx.log(f"  {label} {name}: {shapes[name].error}")

        def arguments(per_stream: int) -> dict[str, Any]:
            return {
                "count": per_stream - 1,
                "interval_ms": 0,
                "payload_bytes": sizes.payload_bytes,
            }

        async def run(name: str, per_stream: int) -> RunStats:
            return await run_calls(
                running[name],
                clients[name],
                arguments(per_stream),
                upstream=upstream,
                timeout_s=_deadline(streams * per_stream, floor_s=30.0 + (budget_s or 0)),
            )

        for name in names:
            if name not in clients:
                continue
            pilot_size = min(nominal, max(sizes.floor, nominal // 10))
            pilot = await run(name, pilot_size)
            shape = shapes[name]
            shape.pilot = pilot
            rate = pilot.events_per_s if pilot.completed else 0.0
            fitted = nominal if budget_s is None else int(rate * budget_s / streams)
            shape.per_stream = max(sizes.floor, min(nominal, fitted))
            ctx.log(
                f"  {label} pilot {name}: {_short(pilot)}; runs of {streams:,} {TIMES} "
                f"{shape.per_stream:,}"
            )
        for rep in range(sizes.repeat):
            for name in rotate([n for n in names if n in clients], rep):
                began = time.monotonic()
                stats = await run(name, shapes[name].per_stream)
                shapes[name].runs.append(stats)
                ctx.log(
                    f"  {label} rep {rep + 1}/{sizes.repeat} {name}: {_short(stats)} "
                    f"({time.monotonic() - began:.1f} s)"
                )
    finally:
        for group in clients.values():
            close_clients(group)
    return shapes


def _short(stats: RunStats) -> str:
    text = f"{stats.events:,} events, {stats.events_per_s:,.0f}/s"
    if stats.ok:
        return text
    return f"{text}, FAILED: {'; '.join(stats.errors[:2]) or 'incomplete'}"


STATS_COLUMNS = [
    "target",
    f"size (streams {TIMES} events)",
    "events/s (median)",
    f"min{DASH}max",
    "vs direct",
    "vs nginx",
    "vs mcp-persist",
    "target CPU µs/event",
    "upstream CPU µs/event",
    "client CPU µs/event",
    "runs",
]


def _stats_rows(shapes: dict[str, Shape]) -> list[list[str]]:
    medians = {name: shape.rate for name, shape in shapes.items()}
    rows = []
    for name in sort_names(list(shapes)):
        shape = shapes[name]
        if shape.error:
            rows.append([name, shape.error, *[""] * (len(STATS_COLUMNS) - 2)])
            continue
        rates = [run.events_per_s for run in shape.good]
        spread = (
            f"{fmt(min(rates, default=float('nan')))}{DASH}{fmt(max(rates, default=float('nan')))}"
        )
        note = f"{len(shape.good)}/{len(shape.runs)} ok {shape.failed_note}".strip()
        rows.append(
            [
                name,
                f"{shape.streams:,} {TIMES} {shape.per_stream:,}",
                fmt(shape.rate),
                spread,
                *[fmt_ratio(shape.rate, medians.get(base)) for base in BASELINES],
                "0" if name == "direct" else fmt(shape.cpu("target_cpu_s"), 1),
                fmt(shape.cpu("upstream_cpu_s"), 1),
                fmt(shape.cpu("client_cpu_s"), 1),
                note,
            ]
        )
    return rows


STATS_NOTES = [
    "events/s: notifications + responses received by the clients ÷ time from the first "
    "tools/call sent to the last response received (sessions set up before, not timed).",
    "size: a pilot run measured each target's rate; its runs got min(nominal, rate x budget) "
    "events per stream, so a slow target's runs stay within the budget.",
    "ratios: median events/s of the target ÷ median of the baseline, same run.",
    "target CPU: utime+stime of the proxy's processes (and its redis-server) over the run ÷ "
    "events; upstream CPU: the upstream's; client: this harness (the load generator).",
]


# throughput -----------------------------------------------------------------------------------


async def throughput(ctx: Context) -> Outcome:
    sizes = ctx.sizes
    outcome = Outcome("throughput")
    failures: dict[str, str] = {}
    names = sort_names(list(ctx.targets))
    async with started(ctx, names, ctx.upstream.url, failures) as running:
        shapes = await measure_shape(
            ctx,
            running,
            upstream=ctx.upstream,
            streams=sizes.throughput_streams,
            nominal=sizes.throughput_events + 1,
            budget_s=sizes.throughput_budget_s,
            label="throughput",
        )
    for name, shape in shapes.items():
        if shape.good:
            ctx.rates[name] = shape.rate
    rows = _stats_rows(shapes) + _skip_rows(ctx, names, failures, len(STATS_COLUMNS))
    outcome.tables.append(
        Table(
            title=f"Throughput, saturated: {sizes.throughput_streams} sessions {TIMES} "
            f"{sizes.throughput_events:,} notifications (nominal; {sizes.payload_bytes} B "
            f"padding each, interval 0), {sizes.repeat} runs each",
            columns=STATS_COLUMNS,
            rows=rows,
            notes=STATS_NOTES,
        )
    )
    outcome.data = {name: shape.summary() for name, shape in shapes.items()}
    return outcome


# growth ---------------------------------------------------------------------------------------


async def growth(ctx: Context) -> Outcome:
    sizes = ctx.sizes
    outcome = Outcome("growth")
    failures: dict[str, str] = {}
    names = sort_names(list(ctx.targets))
    by_size: dict[int, dict[str, Shape]] = {}
    async with started(ctx, names, ctx.upstream.url, failures) as running:
        for streams, per_stream in sizes.growth:
            by_size[streams] = await measure_shape(
                ctx,
                running,
                upstream=ctx.upstream,
                streams=streams,
                nominal=per_stream,
                budget_s=sizes.growth_budget_s,
                label=f"growth {streams}",
            )
    present = sort_names(sorted({name for shapes in by_size.values() for name in shapes}))
    columns = ["target"] + [f"{s:,} stream{'s' if s > 1 else ''}" for s, _ in sizes.growth]
    rows, cpu_rows = [], []
    series: dict[str, list[tuple[int, float]]] = {}
    for name in present:
        row, cpu_row = [name], [name]
        for streams, _ in sizes.growth:
            shape = by_size[streams].get(name)
            direct = by_size[streams].get("direct")
            if shape is None or shape.error:
                row.append(shape.error if shape else "n/a")
                cpu_row.append("")
                continue
            cell = fmt(shape.rate)
            if name != "direct" and direct is not None:
                cell += f" ({fmt_ratio(shape.rate, direct.rate)})"
            if shape.failed_note:
                cell += f" {shape.failed_note}"
            row.append(cell)
            cpu = "0" if name == "direct" else fmt(shape.cpu("target_cpu_s"), 1)
            cpu_row.append(f"{cpu} ({streams:,} {TIMES} {shape.per_stream:,})")
            series.setdefault(name, []).append((streams, shape.rate))
        rows.append(row)
        cpu_rows.append(cpu_row)
    rows += _skip_rows(ctx, names, failures, len(columns))
    nominal = ", ".join(f"{s:,} {TIMES} {n:,}" for s, n in sizes.growth)
    outcome.tables.append(
        Table(
            title="Throughput vs concurrent streams: events/s (vs direct), median of "
            f"{sizes.repeat} runs",
            columns=columns,
            rows=rows,
            notes=[
                f"nominal sizes (streams {TIMES} events per stream, response included): "
                f"{nominal}; sized per target as in the throughput table (budget "
                f"{sizes.growth_budget_s:g} s per run).",
                "each stream is its own session and connection (set up before the timer); "
                "creating the streams is inside the timed window.",
            ],
        )
    )
    outcome.tables.append(
        Table(
            title="Target CPU µs per event vs concurrent streams (size run)",
            columns=columns,
            rows=cpu_rows,
        )
    )
    outcome.data = {
        str(streams): {name: shape.summary() for name, shape in shapes.items()}
        for streams, shapes in by_size.items()
    }
    outcome.plots["growth"] = series
    return outcome


# latency --------------------------------------------------------------------------------------


def _p(stats: RunStats, q: float) -> float:
    return percentile(stats.latencies_ns, q) / 1e6 if stats.latencies_ns else float("nan")


async def latency(ctx: Context) -> Outcome:
    sizes = ctx.sizes
    outcome = Outcome("latency")
    failures: dict[str, str] = {}
    names = sort_names(list(ctx.targets))
    arguments = {
        "count": sizes.latency_events,
        "interval_ms": sizes.latency_interval_ms,
        "payload_bytes": sizes.payload_bytes,
    }
    timeout_s = 30 + sizes.latency_events * sizes.latency_interval_ms / 1000 * 3
    pairs: dict[str, list[tuple[RunStats, RunStats]]] = {}
    async with started(ctx, names, ctx.upstream.url, failures) as running:
        if "direct" not in running:
            outcome.tables.append(
                Table(title="Latency", columns=["note"], rows=[["needs the direct target"]])
            )
            return outcome
        others = [name for name in sort_names(list(running)) if name != "direct"]
        clients: dict[str, list[McpClient]] = {}
        try:
            for name in running:
                clients[name] = await open_clients(running[name].url, 1)

            async def one(name: str) -> RunStats:
                return await run_calls(
                    running[name],
                    clients[name],
                    arguments,
                    upstream=ctx.upstream,
                    timeout_s=timeout_s,
                    record_latency=True,
                )

            # A fresh process's first stream pays one-time costs (a stall of tens of ms was
            # seen in the gateway's first call): a short paced call each, not measured.
            warmup = {**arguments, "count": min(100, sizes.latency_events)}
            for name in running:
                await run_calls(
                    running[name], clients[name], warmup, upstream=ctx.upstream, timeout_s=60
                )
            for rep in range(sizes.repeat):
                for name in rotate(others, rep):
                    direct = await one("direct")
                    through = await one(name)
                    pairs.setdefault(name, []).append((direct, through))
                    ctx.log(
                        f"  latency rep {rep + 1}/{sizes.repeat} {name}: p50 "
                        f"{_p(through, 50):.3f} ms (direct {_p(direct, 50):.3f}), p99 "
                        f"{_p(through, 99):.3f} ms (direct {_p(direct, 99):.3f})"
                    )
        finally:
            for group in clients.values():
                close_clients(group)
    columns = [
        "target",
        "p50 ms",
        "p99 ms",
        "added p50 ms",
        "added p99 ms",
        "its direct runs: p50 / p99 ms",
        "target CPU µs/event",
        "runs",
    ]
    directs = [d for runs in pairs.values() for d, _ in runs if d.ok]
    rows = [
        [
            "direct",
            fmt(median(_p(d, 50) for d in directs), 3),
            fmt(median(_p(d, 99) for d in directs), 3),
            "0",
            "0",
            "",
            "0",
            f"{len(directs)} ok",
        ]
    ]
    for name in sort_names(list(pairs)):
        good = [(d, t) for d, t in pairs[name] if d.ok and t.ok]
        rows.append(
            [
                name,
                fmt(median(_p(t, 50) for _, t in good), 3),
                fmt(median(_p(t, 99) for _, t in good), 3),
                fmt(median(_p(t, 50) - _p(d, 50) for d, t in good), 3),
                fmt(median(_p(t, 99) - _p(d, 99) for d, t in good), 3),
                f"{fmt(median(_p(d, 50) for d, _ in good), 3)} / "
                f"{fmt(median(_p(d, 99) for d, _ in good), 3)}",
                fmt(median(t.cpu_us_per_event(t.target_cpu_s) for _, t in good), 1),
                f"{len(good)}/{len(pairs[name])} ok",
            ]
        )
    rows += _skip_rows(ctx, names, failures, len(columns))
    outcome.tables.append(
        Table(
            title=f"Latency, paced: 1 stream {TIMES} {sizes.latency_events:,} notifications "
            f"every {sizes.latency_interval_ms:g} ms (~{1000 / sizes.latency_interval_ms:,.0f} "
            f"events/s), {sizes.repeat} runs each",
            columns=columns,
            rows=rows,
            notes=[
                "latency of one event: client receipt (time.time_ns() at the socket read) minus "
                "the upstream's send timestamp in the notification (same host, same clock).",
                "added = (through the target) minus (direct), with a direct run right before each "
                "target run; median over the repetitions of each run's p50 / p99.",
                "each target (and direct) first ran one unmeasured warm-up call on the same "
                "session.",
                "target CPU per event here is for events arriving one per socket read (paced), "
                "unlike the saturated runs, where one read carries many events.",
            ],
        )
    )
    outcome.data = {
        name: [{"direct": d.summary(), "target": t.summary()} for d, t in runs]
        for name, runs in pairs.items()
    }
    return outcome


# replay ---------------------------------------------------------------------------------------


async def _fill_other_streams(ctx: Context, target: Running) -> tuple[int, str | None]:
    """Store about ``replay_other_streams * replay_other_events`` events in other sessions
    (fewer for a slow target: what it stores in ``replay_fill_budget_s``)."""
    sizes = ctx.sizes
    streams = sizes.replay_other_streams
    rate = ctx.rates.get(target.name)
    per_stream = sizes.replay_other_events
    if rate:
        fitted = int(rate * sizes.replay_fill_budget_s / streams)
        per_stream = max(sizes.floor, min(per_stream, fitted))
    mark = await store_mark(target, ctx.upstream)
    clients = await open_clients(target.url, streams)
    try:
        fill = await run_calls(
            target,
            clients,
            {"count": per_stream - 1, "interval_ms": 0, "payload_bytes": sizes.payload_bytes},
            upstream=ctx.upstream,
            timeout_s=_deadline(streams * per_stream, floor_s=60.0),
        )
    finally:
        close_clients(clients)
    try:
        await wait_stored(
            target,
            ctx.upstream,
            mark,
            calls=streams,
            events=streams * per_stream,
            timeout_s=_deadline(streams * per_stream, floor_s=60.0),
        )
    except Exception as exc:
        return fill.events, describe(exc)
    return fill.events, (fill.errors[0] if fill.errors else None)


def _replay_rows(
    sizes: Sizes,
    results: dict[int, dict[str, list[ReplayResult]]],
    with_others: dict[str, list[ReplayResult]],
    others_stored: dict[str, int],
    fill_errors: dict[str, str],
) -> tuple[list[str], list[list[str]], dict[str, list[tuple[int, float]]], dict[str, Any]]:
    columns = ["target"] + [f"{missed:,} missed: ms" for missed in sizes.replay_missed]
    columns += [
        f"{sizes.replay_with_others:,} missed, with other streams stored: ms",
        "events in other streams",
        "replay events/s (largest)",
        "runs",
    ]
    rows = []
    series: dict[str, list[tuple[int, float]]] = {}
    data: dict[str, Any] = {}
    for name in sort_names(sorted({n for by in results.values() for n in by})):
        row = [name]
        errors: list[str] = []
        total = ok = 0
        for missed in [*sizes.replay_missed, None]:
            runs = (results[missed] if missed else with_others).get(name, [])
            good = [r.replay_ms for r in runs if r.error is None]
            errors += [r.error for r in runs if r.error]
            total, ok = total + len(runs), ok + len(good)
            row.append(fmt(median(good), 1))
            if missed:
                series.setdefault(name, []).append((missed, median(good)))
            data.setdefault(name, {})[str(missed or "with_others")] = [vars(r) for r in runs]
        largest = sizes.replay_missed[-1]
        ms = median(r.replay_ms for r in results[largest].get(name, []) if r.error is None)
        note = f"{ok}/{total} ok" + (f"; {errors[0]}" if errors else "")
        if name in fill_errors:
            note += f"; filling: {fill_errors[name]}"
        row += [f"{others_stored.get(name, 0):,}", fmt(largest / ms * 1000 if ms else None), note]
        rows.append(row)
    return columns, rows, series, data


async def replay(ctx: Context) -> Outcome:
    sizes = ctx.sizes
    outcome = Outcome("replay")
    failures: dict[str, str] = {}
    names = sort_names([name for name, target in ctx.targets.items() if target.resumable])
    results: dict[int, dict[str, list[ReplayResult]]] = {}
    others_stored: dict[str, int] = {}
    fill_errors: dict[str, str] = {}
    with_others: dict[str, list[ReplayResult]] = {}

    async def alternate(
        running: dict[str, Running], missed: int, label: str
    ) -> dict[str, list[ReplayResult]]:
        by_target: dict[str, list[ReplayResult]] = {name: [] for name in running}
        for rep in range(sizes.repeat):
            for name in rotate(sort_names(list(running)), rep):
                result = await replay_once(
                    running[name],
                    ctx.upstream,
                    missed=missed,
                    payload_bytes=sizes.payload_bytes,
                    timeout_s=_deadline(missed, floor_s=60.0),
                )
                by_target[name].append(result)
                ctx.log(
                    f"  {label} rep {rep + 1}/{sizes.repeat} {name}: "
                    + (result.error or f"{result.events:,} events in {result.replay_ms:.1f} ms")
                )
        return by_target

    async with started(ctx, names, ctx.upstream.url, failures) as running:
        for missed in sizes.replay_missed:
            results[missed] = await alternate(running, missed, f"replay {missed:,}")
        for name, target in running.items():
            filled, error = await _fill_other_streams(ctx, target)
            earlier = sum(m * len(by.get(name, [])) for m, by in results.items())
            others_stored[name] = filled + earlier
            if error:
                fill_errors[name] = error
            ctx.log(f"  replay: {name} stores {others_stored[name]:,} events in other streams")
        with_others = await alternate(
            running, sizes.replay_with_others, f"replay {sizes.replay_with_others:,} + others"
        )
    columns, rows, series, data = _replay_rows(
        sizes, results, with_others, others_stored, fill_errors
    )
    rows += _skip_rows(ctx, names, failures, len(columns))
    non_resumable = sort_names([n for n, t in ctx.targets.items() if not t.resumable])
    outcome.tables.append(
        Table(
            title="Replay: a client kept only the first event (the priming event) and resumes "
            f"with Last-Event-ID; median of {sizes.repeat} runs",
            columns=columns,
            rows=rows,
            notes=[
                "the call's events (notifications + the response) are complete in the store "
                "before the resume (the upstream finished the call, and the target's stored "
                "count (gateway: events_stored_total; mcp-persist: its Redis counter) includes "
                "them); time from sending GET + Last-Event-ID on an already open connection to "
                "receiving the JSON-RPC response.",
                f"other streams: {sizes.replay_other_streams} more sessions' streams "
                "stored first (at most "
                f"{sizes.replay_other_events:,} events each, fewer for a slow target), plus "
                "the earlier replays' streams.",
                "mcp-persist sends no priming event: its client kept the first notification, "
                "so it resumes one event fewer.",
                f"not run (no resume of their own): {', '.join(non_resumable) or 'none'}.",
            ],
        )
    )
    outcome.data = data
    outcome.plots["replay"] = series
    return outcome


# real upstream --------------------------------------------------------------------------------


async def real_upstream(ctx: Context) -> Outcome:
    from mcp_sse_gateway.example.process import example_upstream_process

    sizes = ctx.sizes
    outcome = Outcome("real_upstream")
    failures: dict[str, str] = {}
    names = sort_names(list(ctx.targets))
    async with example_upstream_process("--log-level", "warning") as example:
        upstream = Upstream(example.url, [example.process.pid], counters=False)
        async with started(ctx, names, example.url, failures) as running:
            shapes = await measure_shape(
                ctx,
                running,
                upstream=upstream,
                streams=sizes.real_streams,
                nominal=sizes.real_events + 1,
                budget_s=None,
                label="real upstream",
            )
    rows = _stats_rows(shapes) + _skip_rows(ctx, names, failures, len(STATS_COLUMNS))
    outcome.tables.append(
        Table(
            title="Real upstream (the official `mcp` SDK example server, tool "
            f"`stream_notifications`): {sizes.real_streams} sessions {TIMES} "
            f"{sizes.real_events:,} notifications (nominal), {sizes.repeat} runs each",
            columns=STATS_COLUMNS,
            rows=rows,
            notes=[
                "goal: the gateway at ≥ 90 % of direct (it should not be what limits a real "
                "server).",
                "every target runs the same size here (the upstream is the bottleneck): the "
                "pilot run is only a warm-up.",
                "upstream CPU: the SDK server's process. Other columns as in the throughput table.",
            ],
        )
    )
    outcome.data = {name: shape.summary() for name, shape in shapes.items()}
    return outcome


# scale ----------------------------------------------------------------------------------------


@dataclass
class Monitor:
    """Samples the target's memory and Redis connections while a phase runs."""

    target: Running
    rss_peak: float = 0.0
    total_rss_peak: float = 0.0
    redis_clients_peak: int = 0
    samples: int = 0

    async def run(self, period_s: float = 0.5) -> None:
        redis_client = None
        if self.target.redis_url is not None:
            import redis.asyncio

            redis_client = redis.asyncio.Redis.from_url(self.target.redis_url)
        try:
            while True:  # until cancelled by monitoring()
                self.sample_memory()
                if redis_client is not None:
                    with contextlib.suppress(Exception):
                        clients = await redis_client.client_list()
                        # The monitor's own connection is not the target's.
                        self.redis_clients_peak = max(self.redis_clients_peak, len(clients) - 1)
                self.samples += 1
                await asyncio.sleep(period_s)
        finally:
            if redis_client is not None:
                await redis_client.aclose()

    def sample_memory(self) -> None:
        if not self.target.pids:
            return
        self.rss_peak = max(self.rss_peak, rss_mib(self.target.pids[0]))
        total = sum(rss_mib(pid) for pid in self.target.pids)
        self.total_rss_peak = max(self.total_rss_peak, total)


@contextlib.asynccontextmanager
async def monitoring(target: Running) -> AsyncIterator[Monitor]:
    monitor = Monitor(target)
    task = asyncio.get_running_loop().create_task(monitor.run())
    try:
        yield monitor
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        monitor.sample_memory()


async def _gather_bounded(awaitables: list[Any], timeout_s: float) -> tuple[list[str], bool]:
    """Await them all, at most *timeout_s*: their errors, and whether time ran out."""
    try:
        async with asyncio.timeout(timeout_s):
            outcomes = await asyncio.gather(*awaitables, return_exceptions=True)
    except TimeoutError:
        return [], True
    return [describe(o) for o in outcomes if isinstance(o, BaseException)], False


def _refusals(heads: Sequence[asyncio.Future[Any]]) -> list[str]:
    """``HTTP <status>`` for each response (headers) that was not a 200 stream."""
    return [
        f"HTTP {head.result().status}"
        for head in heads
        if head.done()
        and not head.cancelled()
        and head.exception() is None
        and head.result().status != 200
    ]


async def _hold(ctx: Context, target: Running) -> tuple[dict[str, Any], list[McpClient]]:
    """Phase 1: S streams open at once, each receiving an event every interval."""
    sizes = ctx.sizes
    streams, count = sizes.scale_streams, sizes.scale_events
    result: dict[str, Any] = {"streams": streams, "events_per_stream": count}
    began = time.monotonic()
    try:
        clients = await open_clients(target.url, streams, concurrency=200, timeout_s=300)
    except Exception as exc:
        raise RuntimeError(f"session setup failed: {describe(exc)}") from exc
    result["setup_s"] = round(time.monotonic() - began, 1)
    idle_rss = rss_mib(target.pids[0]) if target.pids else 0.0
    sinks = [StreamSink() for _ in clients]
    arguments = {
        "count": count,
        "interval_ms": sizes.scale_interval_ms,
        "payload_bytes": sizes.payload_bytes,
    }
    timeout_s = 30 + count * sizes.scale_interval_ms / 1000 * 1.5
    # A server may have closed connections that sat idle during the setup (uvicorn: after 5 s).
    semaphore = asyncio.Semaphore(200)

    async def reconnect(client: McpClient) -> None:
        async with semaphore:
            await client.ensure_connection()

    errors, _ = await _gather_bounded([reconnect(client) for client in clients], 120)
    async with monitoring(target) as monitor:
        started_ns = time.time_ns()
        heads = [client.start_call(s, arguments) for client, s in zip(clients, sinks, strict=True)]
        waits = [sink.done for sink in sinks if sink.done is not None]
        more, timed_out = await _gather_bounded([*heads, *waits], timeout_s)
        errors += more + _refusals(heads)
        ended_ns = time.time_ns()
    received = sum(sink.notifications for sink in sinks)
    result.update(
        {
            "refused": sum(error.startswith("HTTP ") for error in errors),
            "expected": streams * count,
            "received": received,
            "missing": streams * count - received,
            "completed": sum(sink.response is not None for sink in sinks),
            "late_over_1s": sum(sink.late for sink in sinks),
            "max_lag_ms": max((sink.max_lag_ns for sink in sinks), default=0) / 1e6,
            "elapsed_s": (ended_ns - started_ns) / 1e9,
            "timed_out": timed_out,
            "idle_rss_mib": idle_rss,
            "peak_rss_mib": monitor.rss_peak,
            "peak_total_rss_mib": monitor.total_rss_peak,
            "redis_clients_peak": monitor.redis_clients_peak if target.redis_url else None,
            "errors": sorted(set(errors))[:5],
            "error_count": len(errors),
        }
    )
    return result, clients


async def _storm(ctx: Context, target: Running, clients: list[McpClient]) -> dict[str, Any]:
    """Phase 2: R clients, each ``behind`` events behind, resume at once."""
    sizes = ctx.sizes
    behind = sizes.scale_behind
    result: dict[str, Any] = {"resumers": len(clients), "behind": behind}
    mark = await store_mark(target, ctx.upstream)
    primed = [StreamSink(stop_after_priming=True) for _ in clients]
    arguments = {"count": behind - 1, "interval_ms": 0, "payload_bytes": sizes.payload_bytes}
    semaphore = asyncio.Semaphore(100)

    async def prime(client: McpClient, sink: StreamSink) -> None:
        async with semaphore:
            with contextlib.suppress(Exception):
                await client.call(sink, arguments)

    await _gather_bounded([prime(c, s) for c, s in zip(clients, primed, strict=True)], 120)
    # A call that failed (e.g. 503) has no event id: the others resume, the rest is reported.
    kept = [(c, s) for c, s in zip(clients, primed, strict=True) if s.first_id is not None]
    result["not_started"] = len(clients) - len(kept)
    if not kept:
        result["error"] = f"none of the {len(clients)} streams got an event id"
        return result
    clients = [client for client, _ in kept]
    result["resumers"] = len(clients)
    ids = [sink.first_id for _, sink in kept]
    total = len(clients) * behind
    # Without a priming event, the first id'd event was a real one, already received.
    expected = total - sum(sink.events for _, sink in kept)
    try:
        await wait_stored(
            target,
            ctx.upstream,
            mark,
            calls=len(clients),
            events=total,
            timeout_s=_deadline(total, floor_s=60.0),
        )
    except Exception as exc:
        result["error"] = f"the streams were not all stored: {describe(exc)}"
        return result
    endpoint = Endpoint.parse(target.url)
    connections: list[Connection] = []

    async def connect() -> None:
        async with semaphore:
            connections.append(await Connection.open(endpoint.host, endpoint.port))

    await _gather_bounded([connect() for _ in clients], 120)
    sinks = [StreamSink() for _ in clients]
    async with monitoring(target) as monitor:
        sent_ns = time.time_ns()
        heads = [
            client.resume(sink, first_id, connection=connection)
            for client, sink, first_id, connection in zip(
                clients, sinks, ids, connections, strict=True
            )
        ]
        head_tasks = [asyncio.ensure_future(head) for head in heads]
        errors, timed_out = await _gather_bounded(head_tasks, _deadline(total, floor_s=60.0))
        errors += _refusals(head_tasks)
        waits = [sink.done for sink in sinks if sink.done is not None]
        more, timed_out_too = await _gather_bounded(waits, _deadline(total, floor_s=60.0))
        errors += more
    # Which clients never got their response, and how far they got: enough to tell a stream the
    # target ended early (its connection closed) from one still open, should it ever happen.
    stalled = [
        f"{_text(first_id)}: {sink.events} events, last id {_text(sink.last_id)}, connection "
        f"{'closed' if connection.closed.done() else 'open'}"
        for first_id, sink, connection in zip(ids, sinks, connections, strict=True)
        if sink.response is None
    ]
    for connection in connections:
        connection.close()
    done_ms = [(sink.response_ns - sent_ns) / 1e6 for sink in sinks if sink.response is not None]
    result.update(
        {
            "caught_up": len(done_ms),
            "all_caught_up_ms": max(done_ms, default=float("nan")),
            "p50_ms": percentile(done_ms, 50),
            "p99_ms": percentile(done_ms, 99),
            "missing": expected - sum(sink.events for sink in sinks),
            "timed_out": timed_out or timed_out_too,
            "peak_rss_mib": monitor.rss_peak,
            "redis_clients_peak": monitor.redis_clients_peak if target.redis_url else None,
            "errors": errors[:5],
            "error_count": len(errors),
            "stalled": stalled[:5],
            "stalled_count": len(stalled),
        }
    )
    return result


def _text(event_id: bytes | None) -> str:
    return event_id.decode(errors="replace") if event_id is not None else "-"


def _resumers(ctx: Context, name: str) -> int:
    """The storm's clients: as asked, fewer for a slow target (what it stores in the budget)."""
    sizes = ctx.sizes
    rate = ctx.rates.get(name)
    if not rate:
        return sizes.scale_resumers
    fitted = int(rate * sizes.scale_storm_budget_s / sizes.scale_behind)
    return max(min(10, sizes.scale_resumers), min(sizes.scale_resumers, fitted))


async def _scale_one(ctx: Context, name: str, target: Running) -> dict[str, Any]:
    held, clients = await _hold(ctx, target)
    try:
        ctx.log(
            f"  scale {name}: {held['streams']:,} streams (setup {held['setup_s']} s), "
            f"received {held['received']:,}/{held['expected']:,}, late "
            f"{held['late_over_1s']:,}, max lag {held['max_lag_ms']:.0f} ms, RSS "
            f"{held['idle_rss_mib']:.0f}→{held['peak_rss_mib']:.0f} MiB, "
            f"{held['error_count']} errors"
        )
        if ctx.targets[name].resumable:
            resumers = _resumers(ctx, name)
            try:
                held["storm"] = await _storm(ctx, target, clients[:resumers])
            except Exception as exc:
                held["storm"] = {"resumers": resumers, "error": describe(exc)}
            ctx.log(f"  scale {name} resume storm: {_storm_text(held['storm'])}")
    finally:
        close_clients(clients)
    return held


def _storm_text(storm: dict[str, Any]) -> str:
    if "error" in storm:
        return f"FAILED {storm['error']}"
    return (
        f"{storm['caught_up']:,}/{storm['resumers']:,} caught up in "
        f"{storm['all_caught_up_ms']:.0f} ms (p50 {storm['p50_ms']:.0f} ms), missing "
        f"{storm['missing']:,}, {storm['error_count']} errors"
        + (
            f"; {storm['stalled_count']} without their response, e.g. {storm['stalled']}"
            if storm.get("stalled_count")
            else ""
        )
    )


SCALE_COLUMNS = [
    "target",
    f"streams {TIMES} events",
    "session setup s",
    "missing",
    "late > 1 s",
    "max lag ms",
    "proxy RSS idle → peak MiB",
    "KiB per stream",
    "Redis clients (peak)",
    f"storm: clients {TIMES} events",
    "storm: all caught up s",
    "storm: per client p50 / p99 ms",
    "storm: missing",
]


def _first_http(errors: list[str]) -> str:
    return next((error for error in errors if error.startswith("HTTP ")), "HTTP error")


def _scale_row(name: str, held: dict[str, Any]) -> list[str]:
    storm = held.get("storm") or {}
    if name == "direct":
        rss, per_stream = "n/a", "n/a"
    else:
        rss = f"{fmt(held['idle_rss_mib'])} → {fmt(held['peak_rss_mib'])}"
        per_stream = fmt((held["peak_rss_mib"] - held["idle_rss_mib"]) * 1024 / held["streams"], 1)
    missing = f"{held['missing']:,}"
    refused = held.get("refused", 0)
    if refused:
        missing += f" ({refused:,} calls refused: {_first_http(held['errors'])})"
    if held["error_count"] > refused:
        missing += f" ({held['error_count'] - refused:,} errors: {held['errors'][0]})"
    if held["timed_out"]:
        missing += " (timed out)"
    redis_peak = held["redis_clients_peak"]
    if redis_peak is not None:
        redis_peak = max(redis_peak, storm.get("redis_clients_peak") or 0)
    row = [
        name,
        f"{held['streams']:,} {TIMES} {held['events_per_stream']}",
        fmt(held["setup_s"], 1),
        missing,
        f"{held['late_over_1s']:,}",
        fmt(held["max_lag_ms"]),
        rss,
        per_stream,
        "" if redis_peak is None else str(redis_peak),
    ]
    if not storm:
        return [*row, "n/a", "", "", ""]
    clients = f"{storm['resumers']:,} {TIMES} {storm.get('behind', '')}"
    if "error" in storm:
        return [*row, clients, f"failed: {storm['error']}", "", ""]
    storm_missing = f"{storm['missing']:,}"
    if storm.get("not_started"):
        storm_missing += f" ({storm['not_started']:,} calls failed to start)"
    if storm["error_count"]:
        storm_missing += f" ({storm['error_count']:,} errors: {storm['errors'][0]})"
    return [
        *row,
        clients,
        fmt(storm["all_caught_up_ms"] / 1000, 2),
        f"{fmt(storm['p50_ms'])} / {fmt(storm['p99_ms'])}",
        storm_missing,
    ]


async def scale(ctx: Context) -> Outcome:
    sizes = ctx.sizes
    outcome = Outcome("scale")
    raise_nofile_limit()
    failures: dict[str, str] = {}
    names = sort_names([n for n, t in ctx.targets.items() if t.resumable or n == "direct"])
    results: dict[str, list[dict[str, Any]]] = {}
    for rep in range(sizes.scale_repeat):
        for name in rotate(names, rep):
            # One target at a time, freshly started: thousands of streams of one target must
            # not weigh on the next.
            async with started(ctx, [name], ctx.upstream.url, failures) as running:
                if name not in running:
                    continue
                try:
                    held = await _scale_one(ctx, name, running[name])
                except Exception as exc:
                    held = {"error": describe(exc)}
                    ctx.log(f"  scale {name}: FAILED {held['error']}")
                results.setdefault(name, []).append(held)
    rows = []
    for name in sort_names(list(results)):
        for held in results[name]:
            if "error" in held:
                rows.append([name, f"failed: {held['error']}", *[""] * (len(SCALE_COLUMNS) - 2)])
            else:
                rows.append(_scale_row(name, held))
    rows += _skip_rows(ctx, names, failures, len(SCALE_COLUMNS))
    outcome.tables.append(
        Table(
            title=f"Scale: {sizes.scale_streams:,} streams open at once, an event every "
            f"{sizes.scale_interval_ms:g} ms for {sizes.scale_events} events each; then up to "
            f"{sizes.scale_resumers:,} clients, each {sizes.scale_behind} events behind, "
            "resume at once",
            columns=SCALE_COLUMNS,
            rows=rows,
            notes=[
                "each stream is its own session and connection (raw sockets); the sessions are "
                "set up first (200 at a time), then every tools/call is sent at once.",
                "missing: notifications never received (by the deadline: the stream's duration "
                "x 1.5 + 30 s), including those of calls the target refused (e.g. 503); "
                "late: received more than 1 s after the upstream sent them; RSS: VmRSS of the "
                "proxy process (peak, sampled every 0.5 s); KiB per stream: (peak - idle) / "
                "streams.",
                "Redis clients: CLIENT LIST entries, minus the monitor's own connection.",
                "storm: each client starts a call of that many events (the response included), "
                "keeps only its first event, and once all are stored every client sends GET + "
                "Last-Event-ID at once on an already open connection; time until the last one "
                "received its response. Fewer clients for a slow target (what it stores in "
                f"{sizes.scale_storm_budget_s:g} s at its saturated rate).",
            ],
        )
    )
    outcome.data = results
    return outcome


# sweep -----------------------------------------------------------------------------------------

#: The sweep's targets: the reference and the gateway on each backend (the baselines are in the
#: scale table; mcp-persist already misses most events at 5,000 streams).
SWEEP_TARGETS = ("direct", "gateway-memory", "gateway-redis")

SWEEP_COLUMNS = [
    "target",
    "streams",
    "session setup s",
    "missing",
    "late > 1 s",
    "late %",
    "max lag ms",
    f"max lag {TIMES} direct's",
    "proxy RSS peak MiB",
]


async def sweep(ctx: Context) -> Outcome:
    """The scale scenario's paced phase at growing concurrency: late events and max lag."""
    sizes = ctx.sizes
    outcome = Outcome("sweep")
    raise_nofile_limit()
    failures: dict[str, str] = {}
    names = sort_names([n for n in ctx.targets if n in SWEEP_TARGETS])
    results: dict[str, dict[int, dict[str, Any]]] = {}
    for streams in sizes.sweep_streams:
        swept = replace(sizes, scale_streams=streams)
        for name in names:
            async with started(ctx, [name], ctx.upstream.url, failures) as running:
                if name not in running:
                    continue
                try:
                    held, clients = await _hold(replace(ctx, sizes=swept), running[name])
                    close_clients(clients)
                except Exception as exc:
                    held = {"error": describe(exc)}
                results.setdefault(name, {})[streams] = held
                if "error" in held:
                    ctx.log(f"  sweep {name} at {streams:,}: FAILED {held['error']}")
                else:
                    ctx.log(
                        f"  sweep {name} at {streams:,}: late {held['late_over_1s']:,} of "
                        f"{held['expected']:,}, max lag {held['max_lag_ms']:.0f} ms, missing "
                        f"{held['missing']:,}"
                    )
    rows = []
    for name in sort_names(list(results)):
        for streams, held in sorted(results[name].items()):
            rows.append(_sweep_row(name, streams, held, results.get("direct", {}).get(streams)))
    rows += _skip_rows(ctx, names, failures, len(SWEEP_COLUMNS))
    outcome.tables.append(
        Table(
            title=f"Scale sweep: concurrent streams, an event every {sizes.scale_interval_ms:g} "
            f"ms for {sizes.scale_events} events each",
            columns=SWEEP_COLUMNS,
            rows=rows,
            notes=[
                "the scale scenario's first phase (sessions set up 200 at a time, then every "
                "tools/call at once) at each concurrency, each target started fresh; late: "
                "received more than 1 s after the upstream sent it; late %: of the events "
                "expected; max lag: the largest send-to-receipt time of any event.",
                f"targets: {', '.join(SWEEP_TARGETS)} (the baselines are in the scale table).",
            ],
        )
    )
    outcome.plots["sweep_late"] = {
        name: [(n, float(h.get("late_over_1s", math.nan))) for n, h in sorted(by.items())]
        for name, by in results.items()
    }
    outcome.plots["sweep_lag"] = {
        name: [(n, float(h.get("max_lag_ms", math.nan))) for n, h in sorted(by.items())]
        for name, by in results.items()
    }
    outcome.data = {name: {str(n): h for n, h in by.items()} for name, by in results.items()}
    return outcome


def _sweep_row(
    name: str, streams: int, held: dict[str, Any], direct: dict[str, Any] | None
) -> list[str]:
    if "error" in held:
        return [name, f"{streams:,}", f"failed: {held['error']}", *[""] * 6]
    missing = f"{held['missing']:,}"
    if held.get("refused"):
        missing += f" ({held['refused']:,} calls refused: {_first_http(held['errors'])})"
    if held["timed_out"]:
        missing += " (timed out)"
    base = direct.get("max_lag_ms") if direct and "error" not in direct else None
    return [
        name,
        f"{streams:,}",
        fmt(held["setup_s"], 1),
        missing,
        f"{held['late_over_1s']:,}",
        fmt(100 * held["late_over_1s"] / max(1, held["expected"]), 3),
        fmt(held["max_lag_ms"]),
        "" if name == "direct" or not base else fmt(held["max_lag_ms"] / base, 1),
        "n/a" if name == "direct" else fmt(held["peak_rss_mib"]),
    ]


SCENARIOS: dict[str, Callable[[Context], Any]] = {
    "throughput": throughput,
    "growth": growth,
    "latency": latency,
    "replay": replay,
    "real_upstream": real_upstream,
    "scale": scale,
    "sweep": sweep,
    "upgrade": upgrade,
}
