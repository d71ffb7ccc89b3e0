"""The command line: start the upstream, run the scenarios, write the report.

``python -m bench [--smoke] [--only a,b] [--targets a,b] [--repeat N] [--out DIR]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import functools
import io
import json
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.procs import (
    ROOT,
    child_process,
    cpu_model,
    python,
    raise_nofile_limit,
    read_announcement,
)
from bench.report import Table, plot_series
from bench.runs import Upstream
from bench.scenarios import SCENARIOS, Context, Outcome, Sizes
from bench.targets import load_targets, sort_names

DEFAULT_OUT = ROOT / "bench" / "results"
SMOKE_TARGETS = ("direct", "gateway-memory", "gateway-redis")
UPSTREAM_START_S = 30.0
#: A scenario still running after this long is stopped and reported failed, with where each of
#: the harness's tasks was waiting: a hang shows itself instead of holding the run, seconds.
SCENARIO_TIMEOUT_S = 1500.0
#: The same bound for ``--smoke`` (its scenarios take seconds; the smoke test allows 90 s in all).
SMOKE_SCENARIO_TIMEOUT_S = 60.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark mcp-sse-gateway against a direct connection and other proxies, "
        "in one run, on this machine (loopback only). Writes a markdown report (and PNG plots, "
        "and the raw numbers as JSON) to --out.",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, 1 repetition, only direct + gateway-memory + gateway-redis (seconds)",
    )
    parser.add_argument(
        "--only",
        metavar="SCENARIOS",
        help=f"comma-separated scenarios to run (default: all): {', '.join(SCENARIOS)}",
    )
    parser.add_argument(
        "--targets",
        metavar="NAMES",
        help="comma-separated targets (default: all available; direct is always added as the "
        "reference): direct, nginx, aiohttp-relay, mcp-persist, gateway-memory, gateway-redis",
    )
    parser.add_argument("--repeat", type=int, metavar="N", help="repetitions per run (default 3)")
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        metavar="DIR",
        help=f"report directory ({DEFAULT_OUT})",
    )
    parser.add_argument(
        "--scale-streams",
        type=int,
        metavar="S",
        help="streams of the scale scenario (default 5000)",
    )
    parser.add_argument(
        "--scale-resumers", type=int, metavar="R", help="clients of the resume storm (default 1000)"
    )
    parser.add_argument(
        "--upstream-workers",
        type=int,
        default=1,
        metavar="N",
        help="synthetic upstream processes (1)",
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the targets' logs in DIR/<stamp>-logs"
    )
    return parser


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _git_commit() -> str:
    with contextlib.suppress(Exception):
        out = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        return out.stdout.strip() or "unknown"
    return "unknown"


def _header(
    args: argparse.Namespace,
    sizes: Sizes,
    chosen: list[str],
    skipped: dict[str, str],
    argv: Sequence[str],
) -> str:
    lines = [
        f"# mcp-sse-gateway benchmark, {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        "",
        f"* command: `{' '.join(['python -m bench', *argv])}`",
        f"* machine: {cpu_model()}, {_cpus()} CPUs, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}",
        f"* code: {_git_commit()}",
        f"* mode: {'smoke' if args.smoke else 'full'}, {sizes.repeat} repetitions, runs alternate "
        "between targets (the first one rotates), medians reported",
        f"* targets: {', '.join(chosen)}",
    ]
    for name, reason in sorted(skipped.items()):
        lines.append(f"* skipped {name}: {reason}")
    return "\n".join(lines) + "\n"


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


def _sizes(args: argparse.Namespace) -> Sizes:
    sizes = Sizes.smoke() if args.smoke else Sizes()
    if args.repeat is not None:
        sizes.repeat = max(1, args.repeat)
    if args.scale_streams is not None:
        sizes.scale_streams = max(1, args.scale_streams)
    if args.scale_resumers is not None:
        sizes.scale_resumers = max(1, args.scale_resumers)
    sizes.scale_resumers = min(sizes.scale_resumers, sizes.scale_streams)
    return sizes


def _choose(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    usable, skipped = load_targets()
    if args.targets:
        wanted = [name.strip() for name in args.targets.split(",") if name.strip()]
    elif args.smoke:
        wanted = list(SMOKE_TARGETS)
    else:
        wanted = list(usable) + list(skipped)
    if "direct" not in wanted:
        wanted.insert(0, "direct")
    unknown = [name for name in wanted if name not in usable and name not in skipped]
    if unknown:
        known = ", ".join(sort_names([*usable, *skipped]))
        raise SystemExit(f"unknown targets: {', '.join(unknown)} (known: {known})")
    chosen = {name: usable[name] for name in wanted if name in usable}
    reasons = {name: skipped[name] for name in wanted if name in skipped}
    return chosen, reasons, sort_names(list(chosen))


def _scenarios(args: argparse.Namespace) -> list[str]:
    if not args.only:
        return list(SCENARIOS)
    scenarios = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in scenarios if name not in SCENARIOS]
    if unknown:
        raise SystemExit(f"unknown scenarios: {', '.join(unknown)} (known: {', '.join(SCENARIOS)})")
    return scenarios


@dataclass
class Report:
    """The markdown report and the raw JSON, rewritten after every scenario."""

    out: Path
    stamp: str
    plots: bool
    sections: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.out / f"{self.stamp}.md"

    def add(self, outcome: Outcome, elapsed_s: float) -> None:
        section = f"## {outcome.name} ({elapsed_s:.0f} s)\n\n" + "\n".join(
            table.markdown() for table in outcome.tables
        )
        if self.plots:
            section += _plots(outcome, self.out, self.stamp)
        self.sections.append(section)
        self.raw.setdefault("scenarios", {})[outcome.name] = {
            "elapsed_s": elapsed_s,
            "data": outcome.data,
        }
        self.write()

    def write(self) -> None:
        self.path.write_text("\n".join(self.sections))
        (self.out / f"{self.stamp}.json").write_text(json.dumps(self.raw, indent=1, default=str))


async def _scenario(
    name: str, ctx: Context, timeout_s: float = SCENARIO_TIMEOUT_S
) -> tuple[Outcome, bool]:
    """Run one scenario; a crash becomes a table saying so (and the run's exit code 1).

    One still running after *timeout_s* seconds is cancelled and reported the same way; the
    stacks of the harness's tasks at that moment go to the log first (what it waited on).
    """
    loop = asyncio.get_running_loop()
    stacks: list[str] = []
    # Just before the timeout cancels it: a cancelled task's stack is unwound.
    watchdog = loop.call_later(max(timeout_s - 0.5, 0), lambda: stacks.append(task_stacks()))
    try:
        async with asyncio.timeout(timeout_s) as deadline:
            return await SCENARIOS[name](ctx), True
    except Exception as exc:
        if isinstance(exc, TimeoutError) and deadline.expired():
            error = f"still running after {timeout_s:g} s (a hang): stopped"
            _log(f"scenario {name} FAILED: {error}; the harness's tasks then:\n" + "".join(stacks))
        else:
            error = f"{type(exc).__name__}: {exc}"
            _log(f"scenario {name} FAILED: {error}")
        outcome = Outcome(name)
        outcome.tables.append(Table(title=f"{name}: failed", columns=["error"], rows=[[error]]))
        return outcome, False
    finally:
        watchdog.cancel()


def task_stacks() -> str:
    """Where each running task of this loop waits now: its coroutine chain, innermost last."""
    out = io.StringIO()
    for task in sorted(asyncio.all_tasks(), key=lambda task: task.get_name()):
        if task is asyncio.current_task():
            continue
        out.write(f"--- {task.get_name()}:\n")
        task.print_stack(file=out)
    return out.getvalue()


async def _with_upstream(
    name: str,
    args: argparse.Namespace,
    workdir: Path,
    context: Callable[..., Context],
) -> tuple[Outcome, bool]:
    """Run one scenario with a synthetic upstream of its own (started fresh, so a crash or a
    kill of one cannot spoil the next scenario); a death during the scenario is reported."""
    argv_up = [
        python(), "-m", "bench.upstream", "--port", "0", "--standalone-get",
        "--workers", str(args.upstream_workers),
    ]  # fmt: skip
    async with child_process("upstream", argv_up, workdir=workdir) as child:
        url = await read_announcement(child, "LISTENING ", UPSTREAM_START_S)
        pids_line = await read_announcement(child, "PIDS ", UPSTREAM_START_S)
        upstream = Upstream(url, [int(pid) for pid in pids_line.split()])
        timeout_s = SMOKE_SCENARIO_TIMEOUT_S if args.smoke else SCENARIO_TIMEOUT_S
        outcome, ok = await _scenario(name, context(upstream=upstream), timeout_s)
        code = child.process.returncode
        if code is not None:
            _log(f"the synthetic upstream exited with code {code} during {name}")
            outcome.tables.insert(
                0,
                Table(
                    title=f"{name}: the synthetic upstream died during the scenario",
                    columns=["exit code", "its log (tail)"],
                    rows=[[str(code), child.log_tail(600)]],
                    notes=[
                        "a negative code is the signal that ended it (-9 SIGKILL, -15 SIGTERM)."
                    ],
                ),
            )
            ok = False
    return outcome, ok


async def _run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    sizes = _sizes(args)
    scenarios = _scenarios(args)
    targets, skipped, chosen = _choose(args)
    raise_nofile_limit()
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    report = Report(args.out, stamp, plots=not args.no_plots)
    report.sections.append(_header(args, sizes, chosen, skipped, argv))
    report.raw.update({"sizes": vars(sizes), "targets": chosen, "skipped": skipped})
    failed: list[str] = []
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mcp-bench-") as tmp:
        workdir = args.out / f"{stamp}-logs" if args.keep_logs else Path(tmp)
        rates: dict[str, float] = {}
        _log(f"targets: {', '.join(chosen)}")
        for name in scenarios:
            _log(f"scenario {name}")
            started = time.monotonic()
            here = workdir / name
            outcome, ok = await _with_upstream(
                name,
                args,
                here,
                functools.partial(
                    Context,
                    sizes,
                    targets=targets,
                    skipped=skipped,
                    workdir=here,
                    log=_log,
                    rates=rates,
                ),
            )
            if not ok:
                failed.append(name)
            elapsed = time.monotonic() - started
            _log(f"scenario {name} done in {elapsed:.0f} s")
            report.add(outcome, elapsed)
    report.sections.append(f"\nTotal: {time.monotonic() - began:.0f} s.\n")
    report.write()
    print("\n".join(report.sections))
    _log(f"report: {report.path}")
    return 1 if failed else 0


def _plots(outcome: Outcome, out: Path, stamp: str) -> str:
    text = ""
    if "growth" in outcome.plots:
        path = plot_series(
            outcome.plots["growth"],
            out / f"{stamp}-growth.png",
            title="Throughput vs concurrent streams",
            xlabel="concurrent streams",
            ylabel="events/s",
        )
        if path is not None:
            text += f"\n![throughput vs concurrent streams]({path.name})\n"
    if "replay" in outcome.plots:
        path = plot_series(
            outcome.plots["replay"],
            out / f"{stamp}-replay.png",
            title="Replay time vs missed events",
            xlabel="missed events",
            ylabel="ms until the response",
            logy=True,
        )
        if path is not None:
            text += f"\n![replay time vs missed events]({path.name})\n"
    for key, title, ylabel, logy in (
        ("sweep_late", "Events more than 1 s late vs concurrent streams", "late events", False),
        ("sweep_lag", "Largest lag vs concurrent streams", "max lag, ms", True),
    ):
        if key in outcome.plots:
            path = plot_series(
                outcome.plots[key],
                out / f"{stamp}-{key.replace('_', '-')}.png",
                title=title,
                xlabel="concurrent streams",
                ylabel=ylabel,
                logy=logy,
            )
            if path is not None:
                text += f"\n![{title.lower()}]({path.name})\n"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(arguments)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_run(args, arguments))
    return uvloop.run(_run(args, arguments))
