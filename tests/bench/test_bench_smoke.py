"""The benchmark harness end to end: ``python -m bench --smoke`` on loopback, in seconds.

It starts the synthetic upstream, the gateway (memory and Redis stores) and the real example
server, runs every scenario at tiny sizes and must write its tables with events for each target.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The harness's own bound; the test's timeout leaves room to kill it and report.
RUN_TIMEOUT_S = 90


def _expected_targets() -> list[str]:
    targets = ["direct", "gateway-memory"]
    if shutil.which("redis-server"):
        targets.append("gateway-redis")
    return targets


def _newest_logs(out: Path, count: int = 4, chars: int = 1500) -> str:
    """The tails of the last process logs the run wrote (what was running when it hung)."""
    logs = sorted(out.glob("*-logs/**/*.log"), key=lambda path: path.stat().st_mtime)
    return "".join(
        f"\n--- {path.relative_to(out)}:\n{path.read_text(errors='replace')[-chars:]}"
        for path in logs[-count:]
    )


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_smoke_run_writes_tables_with_events_for_every_target(tmp_path: Path) -> None:
    # A session of its own, so a run past its deadline is killed with all its children.
    process = subprocess.Popen(
        [sys.executable, "-m", "bench", "--smoke", "--keep-logs", "--out", str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(
            f"`python -m bench --smoke` ran over {RUN_TIMEOUT_S} s:\n{stderr[-4000:]}"
            f"{_newest_logs(tmp_path)}"
        )
    assert process.returncode == 0, f"exit {process.returncode}:\n{stderr[-4000:]}"

    reports = sorted(tmp_path.glob("*.md"))
    assert len(reports) == 1, list(tmp_path.iterdir())
    markdown = reports[0].read_text()
    assert markdown in stdout  # the same tables on stdout
    for section in (
        "throughput",
        "growth",
        "latency",
        "replay",
        "real_upstream",
        "scale",
        "upgrade",
    ):
        assert f"## {section} (" in markdown, section
    assert ": failed" not in markdown

    raw = json.loads(reports[0].with_suffix(".json").read_text())
    scenarios = raw["scenarios"]
    for name in _expected_targets():
        assert f"| {name} |" in markdown, name
        for scenario in ("throughput", "real_upstream"):
            runs = scenarios[scenario]["data"][name]["runs"]
            assert runs, (scenario, name)
            assert all(run["events"] > 0 and not run["errors"] for run in runs), (scenario, runs)
        latency_runs = scenarios["latency"]["data"].get(name, [])
        assert all(pair["target"]["events"] > 0 for pair in latency_runs), latency_runs
        held = scenarios["scale"]["data"][name][0]
        assert held["received"] == held["expected"] > 0, held
    for name in _expected_targets()[1:]:
        replays = scenarios["replay"]["data"][name]
        for runs in replays.values():
            assert runs, name
            assert all(run["error"] is None and run["events"] > 0 for run in runs), runs
        storm = scenarios["scale"]["data"][name][0]["storm"]
        assert storm["caught_up"] == storm["resumers"] > 0, storm
    assert sum(run["events"] for run in scenarios["growth"]["data"]["1"]["direct"]["runs"]) > 0
    upgraded = scenarios["upgrade"]["data"]
    assert upgraded["answers"]["gateway-memory"] == "JSON"
    assert upgraded["answers"]["gateway-memory+upgrade"] == "SSE"
    assert all(upgraded["runs"][name] for name in upgraded["answers"]), upgraded
