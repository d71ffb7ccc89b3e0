"""Where a target's proxy process spends its time under load, with py-spy.

``python -m bench.profile [--target gateway-redis] [--streams 10] [--seconds 10]
[--interval-ms 0] [--count 999] [--after-s 0] [--example] [--out DIR]`` starts the synthetic
upstream (or, with ``--example``, the SDK example server) and the target, keeps ``--streams``
tool calls going (saturated, or one notification every ``--interval-ms``) for ``--seconds``
while ``py-spy record`` samples the proxy (the target's first pid; from ``--after-s`` on, to see
the steady state rather than the streams' creation), then prints the functions with the most
samples (own time, and inclusive) and writes the raw collapsed stacks and a flame graph (SVG) to
``--out``. Needs ``py-spy`` (``pip install py-spy``) and the right to ptrace the child (root, or
``kernel.yama.ptrace_scope`` 0).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.client import StreamSink
from bench.procs import child_process, python, read_announcement
from bench.runner import DEFAULT_OUT
from bench.runs import close_clients, open_clients
from bench.targets import load_targets

TOP = 25


def _functions(frame: str) -> str:
    # py-spy raw frames read "function (file.py:line)"; keep "function (file.py)".
    name, _, where = frame.partition(" (")
    return f"{name} ({where.split(':')[0].rsplit('/', 1)[-1].rstrip(')')})"


def summarize(collapsed: Path, top: int = TOP) -> str:
    """Own and inclusive sample counts per function from py-spy's collapsed stacks."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_functions(frame) for frame in stack.split(";") if frame]
        if frames:
            own[frames[-1]] += count
        for name in set(frames):
            inclusive[name] += count
    if not total:
        return "no samples"
    lines = [f"{total} samples", "", "own time (top):"]
    lines += [f"  {count / total:6.1%}  {name}" for name, count in own.most_common(top)]
    lines += ["", "inclusive (top):"]
    lines += [f"  {count / total:6.1%}  {name}" for name, count in inclusive.most_common(top)]
    return "\n".join(lines)


async def _load(url: str, streams: int, seconds: float, interval_ms: float, count: int) -> int:
    """Calls on *streams* sessions until *seconds* have passed; events received."""
    clients = await open_clients(url, streams, concurrency=200, timeout_s=300)
    deadline = time.monotonic() + seconds
    received = 0

    async def loop(client: object) -> None:
        nonlocal received
        while time.monotonic() < deadline:
            sink = StreamSink()
            arguments = {"count": count, "interval_ms": interval_ms, "payload_bytes": 100}
            await client.call(sink, arguments)  # type: ignore[attr-defined]
            received += sink.events

    try:
        async with asyncio.timeout(seconds + 120):
            await asyncio.gather(*(loop(client) for client in clients))
    finally:
        close_clients(clients)
    return received


async def _profile(args: argparse.Namespace, spy: str) -> int:
    targets, skipped = load_targets()
    if args.target not in targets:
        print(f"target {args.target} unavailable: {skipped.get(args.target)}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    collapsed = args.out / f"{stamp}-profile-{args.target}.txt"
    svg = collapsed.with_suffix(".svg")
    with tempfile.TemporaryDirectory(prefix="mcp-bench-profile-") as tmp:
        workdir = Path(tmp)
        if args.example:
            argv = [python(), "-m", "mcp_sse_gateway.example", "--port", "0"]
            argv += ["--log-level", "warning"]
        else:
            argv = [python(), "-m", "bench.upstream", "--port", "0", "--standalone-get"]
        async with child_process("upstream", argv, workdir=workdir) as upstream:
            url = await read_announcement(upstream, "LISTENING ", 30)
            async with targets[args.target].start(url, workdir=workdir) as running:
                if not running.pids:
                    print(f"{args.target} has no process to profile", file=sys.stderr)
                    return 2
                await _load(running.url, min(args.streams, 10), 1.0, 0, 99)  # warm up
                record = [spy, "record", "--pid", str(running.pids[0]), "--rate", "200"]
                record += ["--duration", str(int(args.seconds))]
                if not args.blocking:
                    record.append("--nonblocking")
                load = asyncio.ensure_future(
                    _load(running.url, args.streams, args.seconds, args.interval_ms, args.count)
                )
                # Let the streams get going first: sample the steady state, not their creation.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(load), args.after_s)
                async with (
                    child_process(
                        "py-spy-raw", [*record, "-f", "raw", "-o", str(collapsed)], workdir=workdir
                    ) as raw,
                    child_process(
                        "py-spy-svg", [*record, "-o", str(svg)], workdir=workdir
                    ) as flame,
                ):
                    events = await load
                    async with asyncio.timeout(60):
                        await raw.process.wait()
                        await flame.process.wait()
    print(f"{args.target}: {events:,} events in {args.seconds:g} s under py-spy")
    print(summarize(collapsed))
    print(f"\ncollapsed stacks: {collapsed}\nflame graph: {svg}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.profile", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--target", default="gateway-memory")
    parser.add_argument("--streams", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--interval-ms", type=float, default=0.0, help="0: saturated")
    parser.add_argument("--count", type=int, default=999, help="notifications per call")
    parser.add_argument(
        "--after-s",
        type=float,
        default=0.0,
        help="start sampling this long after the calls started (0: at once)",
    )
    parser.add_argument(
        "--example", action="store_true", help="the SDK example server as the upstream"
    )
    parser.add_argument(
        "--blocking",
        action="store_true",
        help="pause the process for each sample: exact stacks, at some cost to its speed "
        "(the default samples without pausing, and a stack may come out mixed)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        print("py-spy not found: pip install py-spy", file=sys.stderr)
        return 2
    return asyncio.run(_profile(args, spy))


if __name__ == "__main__":
    sys.exit(main())
