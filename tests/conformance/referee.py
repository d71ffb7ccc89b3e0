"""Conformance referee: the MCP conformance suite, bare upstream vs. gateway, check by check.

For every pinned version of ``@modelcontextprotocol/conformance`` (see ``package.json`` next to
this file) the referee lists **every** server scenario the version offers (``list --server``:
active, pending, draft and extension scenarios alike), runs each one against the bare upstream
and against the gateway in front of it, reads the ``checks.json`` each run writes, and compares
the two results check by check.

Runs: one ``server --suite all --output-dir DIR`` process per version and target (``all`` takes
in the pending scenarios that the default ``active`` suite leaves out), watched scenario by
scenario; a scenario that overruns the timeout is killed and the scenarios after it run one
process each (``server --scenario NAME``), as every scenario does with ``--isolate``. The suite
writes ``DIR/server-<scenario>-<UTC time, ':' and '.' as '-'>/checks.json``: a JSON array of
``{id, name, description, status, timestamp, errorMessage?, specReferences?, details?}`` with
``status`` one of ``SUCCESS``, ``FAILURE``, ``WARNING``, ``SKIPPED``, ``INFO``. Without
``--output-dir`` the suite writes nothing. The exit code of the suite only reflects ``FAILURE``
checks, so the referee never looks at it.

Verdicts, best first (a check's rank through the gateway must not be lower than bare)::

    SUCCESS > WARNING > SKIPPED = INFO > FAILURE (and any unknown status, e.g. ERROR) > missing

- ``INFO`` checks are the suite's log lines (requests sent, responses received): they carry no
  verdict, so an ``INFO``-only check id may be absent through the gateway. A check id that is a
  verdict on one side and ``INFO`` on the other (``server-sse-disconnect-resume`` is ``INFO`` when
  the server never closed a stream) ranks ``INFO`` like ``SKIPPED``.
- ``SKIPPED`` means "the check did not apply" (e.g. the server answered a GET with 405). It ranks
  below ``WARNING``: a check that ran bare (``SUCCESS``/``WARNING``) but is skipped through the
  gateway lost coverage and counts as worse; a check skipped bare may succeed, warn or be skipped
  through the gateway, but not fail.
- A verdict check present bare but missing through the gateway is worse, whatever its verdict
  bare (even ``FAILURE``: the gateway stopped the check from running at all).
- A check present only through the gateway is worse only if it fails.
- A check id occurring several times in one run is compared as a sorted list of verdicts: the
  gateway's n-th best occurrence must be no worse than bare's n-th best.

A run that produces no ``checks.json`` (timeout, crash) counts as one synthetic ``FAILURE`` check
``referee-run`` with the reason, so it shows up in the table and in the comparison.

Expectations pin a scenario's result through the gateway exactly: ``{"server-sse-polling":
"WARNING"}`` means its worst verdict (``FAILURE`` > ``WARNING`` > ``SUCCESS`` > ``SKIPPED``,
``INFO`` ignored) must be ``WARNING``, on every version offering the scenario. A value written
like a table cell (``"3/3 SUCCESS"``) must equal the gateway's cell instead. A key
``"0.2:server-sse-polling"`` applies to one version only and overrides the plain key. A scenario
whose expectation ``N/N SUCCESS`` is met is not worse for a check that failed bare and is missing
through the gateway: such a check exists only when something fails (a scenario's setup check,
``tasks-request-state-removal-setup``).

CLI::

    python -m tests.conformance.referee --bare URL --gateway URL [--versions 0.1,0.2]
        [--out DIR] [--expect SCENARIO=VERDICT ...] [--scenario NAME ...] [--jobs N]
        [--timeout SECONDS] [--deadline SECONDS] [--isolate] [--quiet]

Exit status: 0 nothing worse and every expectation met, 1 otherwise, 2 usage or toolchain error.
Node and the package directory are found next to this file; ``MCP_CONFORMANCE_NODE`` overrides
the node binary (Node >= 22).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent
NODE_ENV = "MCP_CONFORMANCE_NODE"
#: version label -> directory under node_modules (npm aliases in package.json)
VERSIONS: dict[str, str] = {"0.1": "conformance-0.1", "0.2": "conformance-0.2"}
TARGETS = ("bare", "gateway")
#: the 0.2 bundle does not even parse on Node 20
MIN_NODE_MAJOR = 22

SUCCESS, WARNING, SKIPPED, INFO, FAILURE = "SUCCESS", "WARNING", "SKIPPED", "INFO", "FAILURE"
MISSING = "MISSING"
_RANK = {SUCCESS: 4, WARNING: 3, SKIPPED: 2, INFO: 2, FAILURE: 1, MISSING: 0}
#: order of statuses in a table cell
_CELL_ORDER = (SUCCESS, WARNING, FAILURE, SKIPPED)
_SCENARIO_LINE = re.compile(r"^\s*-\s+(?P<name>\S+)(?:\s+\[(?P<specs>[^\]]*)\])?\s*$")

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_JOBS = 4
#: no new scenario process starts after this long (a target that hangs on every scenario would
#: otherwise cost scenarios x timeout)
DEFAULT_DEADLINE_S = 600.0


class RefereeError(RuntimeError):
    """The toolchain is missing or broken (not a conformance result)."""


# --------------------------------------------------------------------------- locating the suite


def node_binary() -> Path:
    """The Node >= 22 binary: ``$MCP_CONFORMANCE_NODE`` or the pinned one in node_modules."""
    override = os.environ.get(NODE_ENV)
    if override:
        return Path(override)
    return PACKAGE_DIR / "node_modules" / "node" / "bin" / "node"


def suite_entry(version: str) -> Path:
    """The ``dist/index.js`` of one pinned conformance version."""
    try:
        alias = VERSIONS[version]
    except KeyError:
        known = ", ".join(VERSIONS)
        raise RefereeError(f"unknown conformance version {version!r} (known: {known})") from None
    return PACKAGE_DIR / "node_modules" / alias / "dist" / "index.js"


def toolchain_problem(versions: Iterable[str] | None = None) -> str | None:
    """Why the suite cannot run here (``None`` when node and every version are installed)."""
    node = node_binary()
    if not (node.is_file() and os.access(node, os.X_OK)):
        return f"node binary not found at {node} (run `npm ci` in {PACKAGE_DIR}, or set {NODE_ENV})"
    try:
        found = subprocess.run(
            [str(node), "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{node} --version failed: {exc}"
    major = re.match(r"v(\d+)\.", found)
    if not major or int(major[1]) < MIN_NODE_MAJOR:
        return f"{node} is Node {found or '?'}; the suite needs Node >= {MIN_NODE_MAJOR}"
    for version in VERSIONS if versions is None else versions:
        try:
            entry = suite_entry(version)
        except RefereeError as exc:
            return str(exc)
        if not entry.is_file():
            return f"conformance {version} not installed at {entry} (run `npm ci` in {PACKAGE_DIR})"
    return None


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["NO_COLOR"] = "1"
    env["FORCE_COLOR"] = "0"
    # Only loopback traffic: never route the suite through a proxy from the caller's shell.
    for name in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ):
        env.pop(name, None)
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost,::1"
    return env


def list_scenarios(version: str, timeout_s: float = 30.0) -> list[str]:
    """Every server scenario *version* offers, in the suite's order (pending ones included)."""
    cmd = [str(node_binary()), str(suite_entry(version)), "list", "--server"]
    try:
        proc = subprocess.run(
            cmd,
            cwd=PACKAGE_DIR,
            env=_child_env(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RefereeError(f"conformance {version}: `list --server` failed: {exc}") from exc
    if proc.returncode != 0:
        raise RefereeError(
            f"conformance {version}: `list --server` exited {proc.returncode}: "
            f"{proc.stderr[-2000:]}"
        )
    return parse_scenario_list(proc.stdout)


def parse_scenario_list(text: str) -> list[str]:
    """Scenario names from ``list --server`` output (the "Server scenarios" section only)."""
    names: list[str] = []
    in_server = False
    for line in text.splitlines():
        if line.strip().endswith(":") and not line.startswith(" "):
            in_server = line.lower().startswith("server scenarios")
            continue
        if in_server and (match := _SCENARIO_LINE.match(line)):
            names.append(match["name"])
    if not names:
        raise RefereeError(f"no server scenarios in `list` output:\n{text[:2000]}")
    return names


# --------------------------------------------------------------------------- running scenarios


@dataclasses.dataclass
class Run:
    """One scenario of one suite version against one target."""

    version: str
    scenario: str
    target: str
    url: str
    checks: list[dict[str, Any]]
    returncode: int | None
    duration_s: float
    error: str | None = None
    checks_path: str | None = None
    log_path: str | None = None


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def _synthetic_failure(reason: str) -> list[dict[str, Any]]:
    return [
        {
            "id": "referee-run",
            "name": "RefereeRun",
            "description": "The scenario run produced a checks.json",
            "status": FAILURE,
            "errorMessage": reason,
        }
    ]


def _suite_command(version: str, url: str, out: Path, timeout_s: float) -> list[str]:
    cmd = [str(node_binary()), str(suite_entry(version)), "server", "--url", url]
    cmd += ["--output-dir", str(out)]
    if version != "0.1":
        # 0.2 bounds each scenario itself and reports a `scenario-timeout` FAILURE check: let
        # that fire before the referee has to kill the process.
        cmd += ["--timeout", str(max(1000, int((timeout_s - 5) * 1000)))]
    return cmd


#: ``<out>/server-<scenario>-<ISO time with : and . replaced by ->/checks.json``
_RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d-\d{3}Z$")
_SCENARIO_START = re.compile(r"^=== Running scenario: (?P<scenario>\S+) ===\s*$")
_SCENARIO_CRASH = re.compile(r"^Failed to run scenario (?P<scenario>\S+): (?P<reason>.*)$")


def _load_checks(path: Path) -> list[dict[str, Any]]:
    loaded = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(loaded, list) or not all(isinstance(c, dict) for c in loaded):
        raise ValueError("not a list of check objects")
    return loaded


def _collect(out: Path) -> dict[str, Path]:
    """Scenario name -> newest ``checks.json`` under *out* (the suite's own layout)."""
    found: dict[str, Path] = {}
    for path in sorted(out.glob("*/checks.json")):
        if match := _RESULT_DIR.match(path.parent.name):
            found[match["scenario"]] = path
    return found


def _run_from(
    version: str,
    scenario: str,
    target: str,
    url: str,
    checks_path: Path | None,
    *,
    duration_s: float,
    returncode: int | None,
    log_path: Path,
    error: str | None,
) -> Run:
    checks: list[dict[str, Any]] = []
    if error is None and checks_path is None:
        error = f"no checks.json written (exit code {returncode}); see {log_path}"
    if error is None and checks_path is not None:
        try:
            checks = _load_checks(checks_path)
        except ValueError as exc:
            error = f"unreadable {checks_path}: {exc}"
    if error is not None:
        checks = _synthetic_failure(error)
    return Run(
        version=version,
        scenario=scenario,
        target=target,
        url=url,
        checks=checks,
        returncode=returncode,
        duration_s=round(duration_s, 3),
        error=error,
        checks_path=str(checks_path) if checks_path and error is None else None,
        log_path=str(log_path),
    )


async def _spawn(cmd: Sequence[str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *cmd,
        cwd=PACKAGE_DIR,
        env=_child_env(),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # own process group: a kill takes its children too
        limit=64 * 1024 * 1024,
    )


async def _reap(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(proc.wait(), 10)


def _fresh_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("*/checks.json"):  # a rerun into the same --out starts clean
        old.unlink()
    return path


async def run_scenario(
    version: str,
    scenario: str,
    target: str,
    url: str,
    *,
    out_dir: Path,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Run:
    """Run ``server --scenario NAME`` in a process of its own, bounded by *timeout_s*."""
    run_dir = _fresh_dir(out_dir / "runs" / version / target / "single" / _safe(scenario))
    cmd = [*_suite_command(version, url, run_dir, timeout_s), "--scenario", scenario]
    log_path = run_dir / "output.log"
    started = time.monotonic()
    error: str | None = None
    proc = await _spawn(cmd)
    try:
        output, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
        log_path.write_bytes(output)
    except TimeoutError:
        error = f"timed out after {timeout_s:.0f} s (killed)"
    finally:
        await _reap(proc)
    return _run_from(
        version,
        scenario,
        target,
        url,
        _collect(run_dir).get(scenario),
        duration_s=time.monotonic() - started,
        returncode=proc.returncode,
        log_path=log_path,
        error=error,
    )


@dataclasses.dataclass
class _SuiteWatch:
    """What the output of one ``--suite all`` process told about its scenarios."""

    timeout_s: float
    started_at: dict[str, float] = dataclasses.field(default_factory=dict)
    ended_at: dict[str, float] = dataclasses.field(default_factory=dict)
    crashed: dict[str, str] = dataclasses.field(default_factory=dict)
    current: str | None = None
    timed_out: str | None = None

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.timeout_s

    def line(self, text: str) -> None:
        """Account for one line of the suite's output."""
        if match := _SCENARIO_START.match(text):
            now = time.monotonic()
            if self.current is not None:
                self.ended_at[self.current] = now
            self.current = match["scenario"]
            self.started_at[self.current] = now
            self.deadline = now + self.timeout_s
        elif match := _SCENARIO_CRASH.match(text):
            self.crashed[match["scenario"]] = match["reason"][:500]

    def expire(self) -> None:
        """The running scenario (or the start-up) exceeded the timeout."""
        self.timed_out = self.current or "<suite start-up>"

    def finish(self) -> None:
        """The process ended: the last scenario ended with it."""
        if self.current is not None:
            self.ended_at.setdefault(self.current, time.monotonic())

    async def follow(self, proc: asyncio.subprocess.Process, log_path: Path) -> None:
        """Read *proc*'s output into *log_path* until it ends or a scenario overruns."""
        assert proc.stdout is not None
        with log_path.open("wb") as log:
            while True:
                remaining = max(0.0, self.deadline - time.monotonic())
                try:
                    line = await asyncio.wait_for(proc.stdout.readline(), remaining)
                except TimeoutError:
                    self.expire()
                    return
                if not line:
                    break
                log.write(line)
                self.line(line.decode("utf-8", "replace").rstrip("\r\n"))
        try:
            await asyncio.wait_for(proc.wait(), max(1.0, self.deadline - time.monotonic()))
        except TimeoutError:
            self.expire()

    def error(self, scenario: str, found: Mapping[str, Path]) -> str | None:
        """Why *scenario* has no usable result (``None`` when it has one)."""
        if scenario == self.timed_out:
            return f"timed out after {self.timeout_s:.0f} s (suite process killed)"
        if scenario in self.crashed and scenario not in found:
            return f"scenario crashed: {self.crashed[scenario]}"
        return None


async def run_suite(
    version: str,
    target: str,
    url: str,
    scenarios: Sequence[str],
    *,
    out_dir: Path,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Run]:
    """Run ``server --suite all`` in one process (one Node start-up instead of one per scenario).

    The suite announces each scenario on stdout; a watchdog kills the process when one scenario
    takes longer than *timeout_s* and records that scenario as timed out; the caller runs the
    scenarios that never started one by one (:func:`run_scenario`). Returns the runs of the
    scenarios of *scenarios* that started.
    """
    run_dir = _fresh_dir(out_dir / "runs" / version / target / "suite")
    cmd = [*_suite_command(version, url, run_dir, timeout_s), "--suite", "all"]
    log_path = run_dir / "output.log"
    watch = _SuiteWatch(timeout_s)
    proc = await _spawn(cmd)
    try:
        await watch.follow(proc, log_path)
    finally:
        await _reap(proc)
    watch.finish()
    found = _collect(run_dir)
    return {
        scenario: _run_from(
            version,
            scenario,
            target,
            url,
            found.get(scenario),
            duration_s=watch.ended_at[scenario] - watch.started_at[scenario],
            returncode=proc.returncode,
            log_path=log_path,
            error=watch.error(scenario, found),
        )
        for scenario in scenarios
        if scenario in watch.started_at
    }


# --------------------------------------------------------------------------- comparing


def normalize_status(status: object) -> str:
    """A check status as ranked here: unknown statuses (``ERROR`` …) count as ``FAILURE``."""
    text = str(status).upper() if status is not None else FAILURE
    return text if text in _RANK and text != MISSING else FAILURE


def rank(status: str) -> int:
    """Higher is better; see the module docstring for the order."""
    return _RANK[status]


def _verdicts_by_id(checks: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Per check id: its non-INFO verdicts best first, or ``[INFO]`` when it only logs."""
    seen: dict[str, list[str]] = {}
    for check in checks:
        seen.setdefault(str(check.get("id")), []).append(normalize_status(check.get("status")))
    out: dict[str, list[str]] = {}
    for check_id, statuses in seen.items():
        verdicts = [s for s in statuses if s != INFO]
        out[check_id] = sorted(verdicts, key=rank, reverse=True) if verdicts else [INFO]
    return out


def _message(checks: Sequence[Mapping[str, Any]], check_id: str) -> str:
    """The most telling text of the worst occurrence of *check_id* (empty when absent)."""
    matching = [c for c in checks if str(c.get("id")) == check_id]
    if not matching:
        return ""
    worst = min(matching, key=lambda c: rank(normalize_status(c.get("status"))))
    return str(worst.get("errorMessage") or worst.get("description") or "")


@dataclasses.dataclass(frozen=True)
class Worse:
    """One check whose verdict through the gateway is worse than bare."""

    version: str
    scenario: str
    check_id: str
    bare: str
    gateway: str
    message: str

    def __str__(self) -> str:
        return (
            f"[{self.version}] {self.scenario} / {self.check_id}: "
            f"bare {self.bare} -> gateway {self.gateway}: {self.message}"
        )


def compare_checks(
    bare: Sequence[Mapping[str, Any]],
    gateway: Sequence[Mapping[str, Any]],
    *,
    version: str = "",
    scenario: str = "",
) -> list[Worse]:
    """Every check whose verdict through the gateway is worse than bare (see module docstring)."""
    bare_ids = _verdicts_by_id(bare)
    gw_ids = _verdicts_by_id(gateway)
    worse: list[Worse] = []
    for check_id in [*bare_ids, *(i for i in gw_ids if i not in bare_ids)]:
        b = bare_ids.get(check_id)
        g = gw_ids.get(check_id)
        if b is None:  # only through the gateway: worse only if it fails
            assert g is not None
            if any(rank(s) <= rank(FAILURE) for s in g):
                worse.append(
                    Worse(version, scenario, check_id, MISSING, g[-1], _message(gateway, check_id))
                )
            continue
        if g is None:
            if b != [INFO]:  # a verdict check the gateway never ran
                message = f"missing through the gateway (bare: {_message(bare, check_id)})"
                worse.append(Worse(version, scenario, check_id, b[-1], MISSING, message))
            continue
        padded = g + [MISSING] * (len(b) - len(g))
        pairs = list(zip(b, padded, strict=False))
        extra_failures = [s for s in g[len(b) :] if rank(s) <= rank(FAILURE)]
        bad = [(bs, gs) for bs, gs in pairs if rank(gs) < rank(bs)]
        if bad or extra_failures:
            bs, gs = bad[-1] if bad else (MISSING, extra_failures[-1])
            message = _message(gateway, check_id) or _message(bare, check_id)
            if len(b) > 1 or len(g) > 1:
                message = f"bare {b}, gateway {g}: {message}"
            worse.append(Worse(version, scenario, check_id, bs, gs, message))
    return worse


def status_counts(checks: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How many checks of each status (``INFO`` included) a run produced."""
    counts: dict[str, int] = {}
    for check in checks:
        status = normalize_status(check.get("status"))
        counts[status] = counts.get(status, 0) + 1
    return counts


def summary_cell(checks: Sequence[Mapping[str, Any]]) -> str:
    """``5/5 SUCCESS`` when every verdict check passed, else e.g. ``2 SUCCESS 1 WARNING``.

    ``INFO`` checks are not counted; a run with nothing but ``INFO`` is ``no verdict (n INFO)``.
    """
    counts = status_counts(checks)
    total = sum(n for s, n in counts.items() if s != INFO)
    if total == 0:
        return f"no verdict ({counts.get(INFO, 0)} INFO)"
    if counts.get(SUCCESS, 0) == total:
        return f"{total}/{total} SUCCESS"
    return " ".join(f"{counts[s]} {s}" for s in _CELL_ORDER if counts.get(s))


def worst_verdict(checks: Sequence[Mapping[str, Any]]) -> str:
    """A scenario's overall verdict: FAILURE > WARNING > SUCCESS > SKIPPED; ``INFO`` if none."""
    counts = status_counts(checks)
    for status in (FAILURE, WARNING, SUCCESS, SKIPPED):
        if counts.get(status):
            return status
    return INFO


def expectation_for(expect: Mapping[str, str], version: str, scenario: str) -> str | None:
    """The expectation for *scenario* on *version* (a ``version:scenario`` key wins)."""
    return expect.get(f"{version}:{scenario}", expect.get(scenario))


def check_expectation(expected: str, checks: Sequence[Mapping[str, Any]]) -> str | None:
    """``None`` when the gateway's result matches *expected*, else what it was instead.

    *expected* is a verdict (``WARNING``: the worst verdict) or, when it starts with a digit, a
    table cell (``3/3 SUCCESS``); either case-insensitive.
    """
    wanted = " ".join(expected.split()).upper()
    actual = summary_cell(checks) if wanted[:1].isdigit() else worst_verdict(checks)
    return None if actual.upper() == wanted else actual


def unmatched_expectations(
    expect: Mapping[str, str], offered: Mapping[str, Sequence[str]]
) -> list[str]:
    """Expectation keys naming a scenario no version in *offered* has (typos, renamed scenarios).

    A ``version:scenario`` key for a version that was not run is not checked.
    """
    unmatched = []
    for key in expect:
        version, sep, scenario = key.rpartition(":")
        if sep and version in offered:
            found = scenario in offered[version]
        elif sep:
            found = True
        else:
            found = any(key in names for names in offered.values())
        if not found:
            unmatched.append(key)
    return sorted(unmatched)


# --------------------------------------------------------------------------- the referee


@dataclasses.dataclass
class Row:
    """One scenario of one version: both runs, what got worse, the expectation if any."""

    version: str
    scenario: str
    bare: Run
    gateway: Run
    worse: list[Worse]
    expected: str | None = None
    expectation_failure: str | None = None

    @property
    def ok(self) -> bool:
        """Nothing worse and the expectation (if any) met."""
        return not self.worse and self.expectation_failure is None


@dataclasses.dataclass
class Report:
    """Everything one referee pass found."""

    bare_url: str
    gateway_url: str
    versions: list[str]
    rows: list[Row]
    scenario_lists: dict[str, list[str]]
    expect: dict[str, str]
    unmatched_expectations: list[str]
    duration_s: float
    out_dir: Path

    @property
    def worse(self) -> list[Worse]:
        """Every check worse through the gateway, in table order."""
        return [w for row in self.rows for w in row.worse]

    @property
    def expectation_failures(self) -> list[str]:
        """Every expectation that did not hold, as a sentence."""
        failures = [
            f"[{r.version}] {r.scenario}: expected {r.expected} through the gateway, "
            f"got {r.expectation_failure} ({summary_cell(r.gateway.checks)})"
            for r in self.rows
            if r.expectation_failure is not None
        ]
        failures += [
            f"expectation {key!r} names no scenario of the suite versions run"
            for key in self.unmatched_expectations
        ]
        return failures

    @property
    def ok(self) -> bool:
        """Nothing worse through the gateway and every expectation met."""
        return not self.worse and not self.expectation_failures

    def problems(self) -> list[str]:
        """One line per worse check and per unmet expectation."""
        return [str(w) for w in self.worse] + self.expectation_failures

    def table(self) -> str:
        """Markdown table scenario x version, bare vs gateway."""
        lines = [
            "| scenario | version | bare | gateway | result |",
            "| --- | --- | --- | --- | --- |",
        ]
        for row in self.rows:
            if row.worse:
                result = f"**WORSE** ({len(row.worse)} check{'s' if len(row.worse) > 1 else ''})"
            else:
                result = "ok"
            if row.expected is not None:
                verdict = "met" if row.expectation_failure is None else "**NOT MET**"
                result += f"; expected {row.expected}: {verdict}"
            errors = [
                f"{run.target} run error"
                for run in (row.bare, row.gateway)
                if run.error is not None
            ]
            if errors:
                result += "; " + ", ".join(errors)
            lines.append(
                f"| {row.scenario} | {row.version} | {summary_cell(row.bare.checks)} "
                f"| {summary_cell(row.gateway.checks)} | {result} |"
            )
        return "\n".join(lines)

    def markdown(self) -> str:
        """The whole report as a markdown document."""
        parts = [
            "# Conformance: bare upstream vs. gateway",
            "",
            f"- bare: `{self.bare_url}`",
            f"- gateway: `{self.gateway_url}`",
            f"- suite versions: {', '.join(self.versions)}; "
            + "; ".join(f"{v}: {len(s)} server scenarios" for v, s in self.scenario_lists.items()),
            f"- expectations: `{json.dumps(self.expect, sort_keys=True)}`",
            f"- duration: {self.duration_s:.1f} s",
            f"- verdict: {'PASS' if self.ok else 'FAIL'}",
            "",
            self.table(),
            "",
        ]
        problems = self.problems()
        if problems:
            parts += ["## Problems", "", *(f"- {p}" for p in problems), ""]
        return "\n".join(parts)

    def as_json(self) -> dict[str, Any]:
        """The raw data: every run with its checks, every comparison, the verdict."""
        return {
            "bare_url": self.bare_url,
            "gateway_url": self.gateway_url,
            "versions": self.versions,
            "scenarios": self.scenario_lists,
            "expect": self.expect,
            "duration_s": round(self.duration_s, 3),
            "ok": self.ok,
            "worse": [dataclasses.asdict(w) for w in self.worse],
            "expectation_failures": self.expectation_failures,
            "rows": [
                {
                    "version": r.version,
                    "scenario": r.scenario,
                    "bare_summary": summary_cell(r.bare.checks),
                    "gateway_summary": summary_cell(r.gateway.checks),
                    "expected": r.expected,
                    "expectation_failure": r.expectation_failure,
                    "worse": [dataclasses.asdict(w) for w in r.worse],
                    "runs": {run.target: dataclasses.asdict(run) for run in (r.bare, r.gateway)},
                }
                for r in self.rows
            ],
        }

    def write(self) -> tuple[Path, Path]:
        """Write ``report.md`` and ``report.json`` into the out dir; returns both paths."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        md = self.out_dir / "report.md"
        raw = self.out_dir / "report.json"
        md.write_text(self.markdown(), encoding="utf-8")
        raw.write_text(json.dumps(self.as_json(), indent=2) + "\n", encoding="utf-8")
        return md, raw


@dataclasses.dataclass
class _Schedule:
    """Runs the scenarios of one referee pass, at most ``jobs`` Node processes at a time."""

    urls: Mapping[str, str]
    out: Path
    jobs: int
    timeout_s: float
    deadline_s: float
    progress: bool

    def __post_init__(self) -> None:
        self.started = time.monotonic()
        self.semaphore = asyncio.Semaphore(max(1, self.jobs))

    def report(self, run: Run) -> None:
        """One progress line per finished run (when asked for)."""
        if self.progress:
            flag = f"  ERROR: {run.error}" if run.error else ""
            print(
                f"  [{run.version}] {run.scenario:<45} {run.target:<8} {run.duration_s:5.1f}s "
                f"{summary_cell(run.checks)}{flag}",
                flush=True,
            )

    async def single(self, version: str, scenario: str, target: str) -> Run:
        """One scenario in a process of its own (none once the deadline has passed)."""
        url = self.urls[target]
        async with self.semaphore:
            if time.monotonic() - self.started > self.deadline_s:
                reason = f"not run: the referee's deadline of {self.deadline_s:.0f} s had passed"
                run = Run(
                    version, scenario, target, url, _synthetic_failure(reason), None, 0, reason
                )
            else:
                run = await run_scenario(
                    version, scenario, target, url, out_dir=self.out, timeout_s=self.timeout_s
                )
        self.report(run)
        return run

    async def target(
        self, version: str, target: str, names: Sequence[str], *, batch: bool
    ) -> dict[str, Run]:
        """Every scenario of *names* against one target: one suite process, then stragglers."""
        runs: dict[str, Run] = {}
        if batch:
            async with self.semaphore:
                runs = await run_suite(
                    version,
                    target,
                    self.urls[target],
                    names,
                    out_dir=self.out,
                    timeout_s=self.timeout_s,
                )
            for run in runs.values():
                self.report(run)
        rest = [n for n in names if n not in runs]
        singles = await asyncio.gather(*(self.single(version, n, target) for n in rest))
        runs.update({run.scenario: run for run in singles})
        return runs


def _row(version: str, scenario: str, bare: Run, gateway: Run, expect: Mapping[str, str]) -> Row:
    row = Row(
        version=version,
        scenario=scenario,
        bare=bare,
        gateway=gateway,
        worse=compare_checks(bare.checks, gateway.checks, version=version, scenario=scenario),
    )
    row.expected = expectation_for(expect, version, scenario)
    if row.expected is not None:
        row.expectation_failure = check_expectation(row.expected, gateway.checks)
        if row.expectation_failure is None and _all_succeed(row.expected):
            # Met exactly as "N/N SUCCESS": a check that failed bare and is missing through the
            # gateway exists only when something fails (a scenario's setup check).
            row.worse = [w for w in row.worse if not (w.bare == FAILURE and w.gateway == MISSING)]
    return row


def _all_succeed(expected: str) -> bool:
    """Whether *expected* is a table cell of successes only (``3/3 SUCCESS``)."""
    count, _, verdict = " ".join(expected.split()).upper().partition(" ")
    done, _, total = count.partition("/")
    return verdict == SUCCESS and done.isdigit() and done == total


async def referee(
    bare_url: str,
    gateway_url: str,
    *,
    versions: Sequence[str] = tuple(VERSIONS),
    out_dir: Path | str | None = None,
    expect: Mapping[str, str] | None = None,
    scenarios: Sequence[str] | None = None,
    jobs: int = DEFAULT_JOBS,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    isolate: bool = False,
    deadline_s: float = DEFAULT_DEADLINE_S,
    progress: bool = False,
) -> Report:
    """Run every server scenario of every version against both URLs and compare.

    By default each (version, target) pair is one ``server --suite all`` process (see
    :func:`run_suite`; the pairs run side by side, at most *jobs* processes at a time) and only
    scenarios that never started there run one by one. ``isolate=True``, or a subset in
    *scenarios*, runs every scenario in a process of its own. Every scenario opens its own MCP
    session(s), so runs against the same upstream do not see each other.

    Raises:
        RefereeError: node or a suite version is missing, or a scenario name is unknown.
    """
    problem = toolchain_problem(versions)
    if problem:
        raise RefereeError(problem)
    expect = dict(expect or {})
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="conformance-"))
    out.mkdir(parents=True, exist_ok=True)
    schedule = _Schedule(
        urls={"bare": bare_url, "gateway": gateway_url},
        out=out,
        jobs=jobs,
        timeout_s=timeout_s,
        deadline_s=deadline_s,
        progress=progress,
    )
    lists = {v: await asyncio.to_thread(list_scenarios, v) for v in versions}
    offered = {s for names in lists.values() for s in names}
    if scenarios is not None and (unknown := sorted(set(scenarios) - offered)):
        raise RefereeError(f"no suite version offers scenario(s) {', '.join(unknown)}")
    selected = {
        v: [s for s in names if not scenarios or s in scenarios] for v, names in lists.items()
    }
    pairs = [(v, t) for v in versions for t in TARGETS]
    results = await asyncio.gather(
        *(
            schedule.target(v, t, selected[v], batch=not isolate and selected[v] == lists[v])
            for v, t in pairs
        )
    )
    runs = {(v, t): by_name for (v, t), by_name in zip(pairs, results, strict=True)}
    rows = [
        _row(v, s, runs[(v, "bare")][s], runs[(v, "gateway")][s], expect)
        for v in versions
        for s in selected[v]
    ]
    return Report(
        bare_url=bare_url,
        gateway_url=gateway_url,
        versions=list(versions),
        rows=rows,
        scenario_lists=lists,
        expect=expect,
        unmatched_expectations=unmatched_expectations(expect, lists),
        duration_s=time.monotonic() - schedule.started,
        out_dir=out,
    )


# --------------------------------------------------------------------------- CLI


def _parse_expect(values: Sequence[str]) -> dict[str, str]:
    expect: dict[str, str] = {}
    for value in values:
        text = value.strip()
        if text.startswith("{"):
            loaded = json.loads(text)
            if not isinstance(loaded, dict):
                raise argparse.ArgumentTypeError(f"--expect JSON must be an object: {value!r}")
            expect.update({str(k): str(v) for k, v in loaded.items()})
        elif "=" in text:
            key, _, verdict = text.partition("=")
            expect[key.strip()] = verdict.strip()
        else:
            raise argparse.ArgumentTypeError(f"--expect wants SCENARIO=VERDICT or JSON: {value!r}")
    return expect


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tests.conformance.referee",
        description="Run the MCP conformance suite against a bare MCP server and the gateway in "
        "front of it; fail if any check is worse through the gateway.",
    )
    parser.add_argument("--bare", required=True, metavar="URL", help="bare upstream MCP endpoint")
    parser.add_argument("--gateway", required=True, metavar="URL", help="gateway MCP endpoint")
    parser.add_argument(
        "--versions",
        default=",".join(VERSIONS),
        help=f"comma-separated suite versions (default: {','.join(VERSIONS)})",
    )
    parser.add_argument("--out", metavar="DIR", help="results directory (default: a new temp dir)")
    parser.add_argument(
        "--expect",
        action="append",
        default=[],
        metavar="SCENARIO=VERDICT",
        help="pin a scenario's result through the gateway, e.g. server-sse-polling=WARNING, "
        "0.2:server-sse-polling='3/3 SUCCESS', or a JSON object; repeatable",
    )
    parser.add_argument(
        "--scenario",
        action="append",
        dest="scenarios",
        metavar="NAME",
        help="run only these scenarios (repeatable; default: all)",
    )
    parser.add_argument(
        "--jobs", type=int, default=DEFAULT_JOBS, help=f"parallel runs (default {DEFAULT_JOBS})"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"bound for one scenario run (default {DEFAULT_TIMEOUT_S:.0f})",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=DEFAULT_DEADLINE_S,
        metavar="SECONDS",
        help="start no scenario process after this long; the rest count as failed "
        f"(default {DEFAULT_DEADLINE_S:.0f})",
    )
    parser.add_argument(
        "--isolate",
        action="store_true",
        help="one Node process per scenario (slower; default: one `--suite all` process per "
        "version and target)",
    )
    parser.add_argument("--quiet", action="store_true", help="no per-run progress lines")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        expect = _parse_expect(args.expect)
    except (argparse.ArgumentTypeError, json.JSONDecodeError) as exc:
        print(f"referee: {exc}", file=sys.stderr)
        return 2
    versions = [v.strip() for v in args.versions.split(",") if v.strip()]
    try:
        report = asyncio.run(
            referee(
                args.bare,
                args.gateway,
                versions=versions,
                out_dir=args.out,
                expect=expect,
                scenarios=args.scenarios,
                jobs=args.jobs,
                timeout_s=args.timeout,
                isolate=args.isolate,
                deadline_s=args.deadline,
                progress=not args.quiet,
            )
        )
    except RefereeError as exc:
        print(f"referee: {exc}", file=sys.stderr)
        return 2
    md, raw = report.write()
    print()
    print(report.table())
    print()
    for line in report.problems():
        print(f"PROBLEM {line}")
    print(f"\n{'PASS' if report.ok else 'FAIL'} in {report.duration_s:.1f} s; wrote {md} and {raw}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
