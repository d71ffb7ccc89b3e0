"""The referee's comparison, reporting and process handling, on synthetic data (no Node needed).

The process tests replace Node and the suite with a small Python stand-in (``fake_suite``) that
speaks the suite's CLI (``list --server``; ``server --url --output-dir --scenario|--suite all``)
and writes ``checks.json`` in the suite's layout, so time-outs, crashes and the fallback from one
``--suite all`` process to single runs are exercised for real.
"""

from __future__ import annotations

import asyncio
import json
import stat
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conformance import referee as ref
from tests.conformance.referee import (
    FAILURE,
    INFO,
    MISSING,
    SKIPPED,
    SUCCESS,
    WARNING,
    Report,
    Run,
    check_expectation,
    compare_checks,
    expectation_for,
    parse_scenario_list,
    summary_cell,
    unmatched_expectations,
    worst_verdict,
)


def check(check_id: str, status: str, message: str | None = None) -> dict[str, Any]:
    """A check object as the suite writes it to checks.json."""
    data: dict[str, Any] = {
        "id": check_id,
        "name": check_id.title(),
        "description": f"about {check_id}",
        "status": status,
        "timestamp": "2026-01-01T00:00:00.000Z",
    }
    if message is not None:
        data["errorMessage"] = message
    return data


def worse_ids(bare: list[dict[str, Any]], gateway: list[dict[str, Any]]) -> list[str]:
    return [w.check_id for w in compare_checks(bare, gateway)]


# --------------------------------------------------------------------------- compare_checks


def test_identical_results_are_not_worse() -> None:
    checks = [check("a", SUCCESS), check("b", WARNING), check("c", FAILURE), check("log", INFO)]
    assert compare_checks(checks, [dict(c) for c in checks]) == []


@pytest.mark.parametrize(
    ("bare", "gateway", "worse"),
    [
        (SUCCESS, SUCCESS, False),
        (SUCCESS, WARNING, True),
        (SUCCESS, FAILURE, True),
        (WARNING, SUCCESS, False),
        (WARNING, WARNING, False),
        (WARNING, FAILURE, True),
        (FAILURE, FAILURE, False),
        (FAILURE, WARNING, False),
        (FAILURE, SUCCESS, False),
        # SKIPPED: "did not apply"; ranks below WARNING, above FAILURE
        (SUCCESS, SKIPPED, True),
        (WARNING, SKIPPED, True),
        (SKIPPED, SKIPPED, False),
        (SKIPPED, SUCCESS, False),
        (SKIPPED, WARNING, False),
        (SKIPPED, FAILURE, True),
        (FAILURE, SKIPPED, False),
        # INFO where the other side has a verdict ranks like SKIPPED
        (SUCCESS, INFO, True),
        (INFO, SUCCESS, False),
        (INFO, WARNING, False),
        (INFO, FAILURE, True),
        (INFO, SKIPPED, False),
        # unknown statuses count as FAILURE
        ("ERROR", FAILURE, False),
        (SUCCESS, "ERROR", True),
        (WARNING, "error", True),
    ],
)
def test_verdict_order(bare: str, gateway: str, worse: bool) -> None:
    result = compare_checks([check("x", bare)], [check("x", gateway)])
    assert bool(result) is worse


def test_worse_names_scenario_check_verdicts_and_the_gateways_message() -> None:
    [worse] = compare_checks(
        [check("priming", SUCCESS)],
        [check("priming", WARNING, "no priming event")],
        version="0.1",
        scenario="server-sse-polling",
    )
    assert (worse.version, worse.scenario, worse.check_id) == (
        "0.1",
        "server-sse-polling",
        "priming",
    )
    assert (worse.bare, worse.gateway) == (SUCCESS, WARNING)
    assert worse.message == "no priming event"
    assert "server-sse-polling / priming: bare SUCCESS -> gateway WARNING" in str(worse)


@pytest.mark.parametrize("status", [SUCCESS, WARNING, SKIPPED, FAILURE])
def test_a_verdict_check_missing_through_the_gateway_is_worse(status: str) -> None:
    [worse] = compare_checks([check("a", SUCCESS), check("b", status)], [check("a", SUCCESS)])
    assert (worse.check_id, worse.bare, worse.gateway) == ("b", status, MISSING)
    assert "missing through the gateway" in worse.message


def test_an_info_only_check_may_be_missing_through_the_gateway() -> None:
    bare = [check("incoming-request", INFO), check("incoming-request", INFO), check("a", SUCCESS)]
    assert worse_ids(bare, [check("a", SUCCESS)]) == []


def test_a_check_only_through_the_gateway_is_worse_only_if_it_fails() -> None:
    bare = [check("a", SUCCESS)]
    assert worse_ids(bare, [check("a", SUCCESS), check("new", WARNING)]) == []
    assert worse_ids(bare, [check("a", SUCCESS), check("new", SKIPPED)]) == []
    assert worse_ids(bare, [check("a", SUCCESS), check("new", INFO)]) == []
    [worse] = compare_checks(bare, [check("a", SUCCESS), check("new", FAILURE, "boom")])
    assert (worse.check_id, worse.bare, worse.gateway, worse.message) == (
        "new",
        MISSING,
        FAILURE,
        "boom",
    )


def test_repeated_ids_compare_as_sorted_lists() -> None:
    two_ok = [check("a", SUCCESS), check("a", SUCCESS)]
    assert worse_ids(two_ok, [check("a", SUCCESS), check("a", SUCCESS)]) == []
    assert worse_ids(two_ok, [check("a", SUCCESS)]) == ["a"]  # one occurrence lost
    assert worse_ids(two_ok, [check("a", SUCCESS), check("a", WARNING)]) == ["a"]
    # order within a run does not matter
    mixed = [check("a", WARNING), check("a", SUCCESS)]
    assert worse_ids(mixed, [check("a", SUCCESS), check("a", WARNING)]) == []
    # an extra failing occurrence through the gateway is worse, an extra passing one is not
    assert worse_ids(two_ok, [*two_ok, check("a", FAILURE)]) == ["a"]
    assert worse_ids(two_ok, [*two_ok, check("a", SUCCESS)]) == []
    # INFO occurrences next to verdicts of the same id are log lines
    assert worse_ids([check("a", SUCCESS), check("a", INFO)], [check("a", SUCCESS)]) == []


def test_a_failed_run_shows_as_worse_everywhere() -> None:
    bare = [check("a", SUCCESS), check("b", WARNING), check("log", INFO)]
    gateway = ref._synthetic_failure("timed out after 60 s (killed)")
    assert sorted(worse_ids(bare, gateway)) == ["a", "b", "referee-run"]


# --------------------------------------------------------------------------- cells and verdicts


@pytest.mark.parametrize(
    ("statuses", "cell", "worst"),
    [
        ([SUCCESS] * 5, "5/5 SUCCESS", SUCCESS),
        ([SUCCESS, SUCCESS, INFO], "2/2 SUCCESS", SUCCESS),
        ([SUCCESS, SUCCESS, WARNING, INFO], "2 SUCCESS 1 WARNING", WARNING),
        ([WARNING, WARNING, INFO], "2 WARNING", WARNING),
        ([SUCCESS, FAILURE, FAILURE, WARNING], "1 SUCCESS 1 WARNING 2 FAILURE", FAILURE),
        ([SUCCESS, SKIPPED, SKIPPED], "1 SUCCESS 2 SKIPPED", SUCCESS),
        ([SKIPPED], "1 SKIPPED", SKIPPED),
        ([INFO, INFO, INFO], "no verdict (3 INFO)", INFO),
        ([], "no verdict (0 INFO)", INFO),
        (["ERROR", SUCCESS], "1 SUCCESS 1 FAILURE", FAILURE),
    ],
)
def test_summary_cell_and_worst_verdict(statuses: list[str], cell: str, worst: str) -> None:
    checks = [check(f"c{i}", s) for i, s in enumerate(statuses)]
    assert summary_cell(checks) == cell
    assert worst_verdict(checks) == worst


def test_expectation_by_worst_verdict_or_by_cell() -> None:
    polling_now = [check("priming", WARNING), check("retry", WARNING), check("resume", INFO)]
    polling_next = [check("priming", SUCCESS), check("retry", SUCCESS), check("resume", SUCCESS)]
    half = [check("priming", SUCCESS), check("retry", SUCCESS), check("resume", INFO)]
    assert check_expectation("WARNING", polling_now) is None
    assert check_expectation("warning", polling_now) is None
    assert check_expectation("SUCCESS", polling_now) == WARNING
    assert check_expectation("WARNING", polling_next) == SUCCESS  # "exactly", not "at least"
    assert check_expectation("3/3 SUCCESS", polling_next) is None
    assert check_expectation(" 3/3  success", polling_next) is None
    assert check_expectation("3/3 SUCCESS", half) == "2/2 SUCCESS"
    assert check_expectation("SUCCESS", half) is None


def test_expectation_keys() -> None:
    expect = {"server-sse-polling": "WARNING", "0.2:server-sse-polling": "3/3 SUCCESS"}
    assert expectation_for(expect, "0.1", "server-sse-polling") == "WARNING"
    assert expectation_for(expect, "0.2", "server-sse-polling") == "3/3 SUCCESS"
    assert expectation_for(expect, "0.2", "ping") is None
    offered = {"0.1": ["ping", "server-sse-polling"], "0.2": ["ping"]}
    assert unmatched_expectations(expect, offered) == ["0.2:server-sse-polling"]
    assert unmatched_expectations({"typo": "SUCCESS", "9.9:x": "SUCCESS"}, offered) == ["typo"]


# --------------------------------------------------------------------------- suite output


LIST_OUTPUT = textwrap.dedent(
    """\
    Server scenarios (test against a server):
      - server-initialize [2025-06-18,2025-11-25]
      - server-sse-polling [2025-11-25]
      - sep-2640-skills-directory [extension]
      - sep-2164-resource-not-found [2026-07-28]

    Client scenarios (test against a client):
      - initialize [2025-06-18,2025-11-25]
      - auth/metadata-default [2025-11-25]

    Authorization server scenarios (test against an authorization server):
      - authorization-code-grant [2025-03-26]
    """
)


def test_parse_scenario_list_keeps_server_scenarios_only() -> None:
    assert parse_scenario_list(LIST_OUTPUT) == [
        "server-initialize",
        "server-sse-polling",
        "sep-2640-skills-directory",
        "sep-2164-resource-not-found",
    ]
    with pytest.raises(ref.RefereeError):
        parse_scenario_list("Client scenarios (test against a client):\n  - initialize\n")


def test_collect_maps_result_dirs_to_scenarios(tmp_path: Path) -> None:
    for name in (
        "server-server-sse-polling-2026-11-30T17-45-31-454Z",
        "server-ping-2026-01-02T03-04-05-006Z",
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "checks.json").write_text("[]")
    (tmp_path / "unrelated").mkdir()
    (tmp_path / "unrelated" / "checks.json").write_text("[]")
    found = ref._collect(tmp_path)
    assert sorted(found) == ["ping", "server-sse-polling"]


def test_suite_watch_follows_scenario_lines() -> None:
    watch = ref._SuiteWatch(timeout_s=5)
    for line in [
        "Running all suite (3 scenarios) against http://127.0.0.1:1/mcp",
        "",
        "=== Running scenario: a ===",
        "Checks: ...",
        "=== Running scenario: b ===",
        "Failed to run scenario b: Error: boom",
        "=== Running scenario: c ===",
    ]:
        watch.line(line)
    watch.expire()
    watch.finish()
    assert list(watch.started_at) == ["a", "b", "c"]
    assert set(watch.ended_at) == {"a", "b", "c"}
    assert watch.crashed == {"b": "Error: boom"}
    assert watch.timed_out == "c"
    assert watch.error("a", {"a": Path("x")}) is None
    assert watch.error("b", {}) == "scenario crashed: Error: boom"
    assert "timed out" in (watch.error("c", {}) or "")


# --------------------------------------------------------------------------- report


def make_run(
    scenario: str, target: str, checks: list[dict[str, Any]], error: str | None = None
) -> Run:
    return Run("0.1", scenario, target, f"http://127.0.0.1:1/{target}", checks, 0, 0.1, error)


def make_report(tmp_path: Path, expect: dict[str, str]) -> Report:
    rows = [
        ref._row(
            "0.1",
            "ping",
            make_run("ping", "bare", [check("ping", SUCCESS)]),
            make_run("ping", "gateway", [check("ping", SUCCESS)]),
            expect,
        ),
        ref._row(
            "0.1",
            "server-sse-polling",
            make_run("server-sse-polling", "bare", [check("priming", WARNING), check("r", INFO)]),
            make_run("server-sse-polling", "gateway", [check("priming", WARNING)]),
            expect,
        ),
        ref._row(
            "0.1",
            "tools-list",
            make_run("tools-list", "bare", [check("tools-list", SUCCESS)]),
            make_run("tools-list", "gateway", [check("tools-list", FAILURE, "bad list")]),
            expect,
        ),
    ]
    return Report(
        bare_url="http://127.0.0.1:1/bare",
        gateway_url="http://127.0.0.1:1/gateway",
        versions=["0.1"],
        rows=rows,
        scenario_lists={"0.1": ["ping", "server-sse-polling", "tools-list"]},
        expect=expect,
        unmatched_expectations=[],
        duration_s=1.5,
        out_dir=tmp_path,
    )


def test_report_table_problems_and_files(tmp_path: Path) -> None:
    report = make_report(tmp_path, {"server-sse-polling": "WARNING"})
    assert not report.ok
    assert [str(w) for w in report.worse] == [
        "[0.1] tools-list / tools-list: bare SUCCESS -> gateway FAILURE: bad list"
    ]
    assert report.expectation_failures == []
    table = report.table().splitlines()
    assert table[0] == "| scenario | version | bare | gateway | result |"
    assert "| ping | 0.1 | 1/1 SUCCESS | 1/1 SUCCESS | ok |" in table
    assert (
        "| server-sse-polling | 0.1 | 1 WARNING | 1 WARNING | ok; expected WARNING: met |" in table
    )
    assert "| tools-list | 0.1 | 1/1 SUCCESS | 1 FAILURE | **WORSE** (1 check) |" in table
    md, raw = report.write()
    assert "## Problems" in md.read_text()
    data = json.loads(raw.read_text())
    assert data["ok"] is False
    assert data["worse"][0]["check_id"] == "tools-list"
    assert data["rows"][1]["runs"]["gateway"]["checks"][0]["id"] == "priming"


def test_report_expectation_not_met(tmp_path: Path) -> None:
    report = make_report(tmp_path, {"server-sse-polling": "SUCCESS", "ping": "1/1 SUCCESS"})
    assert report.expectation_failures == [
        "[0.1] server-sse-polling: expected SUCCESS through the gateway, got WARNING (1 WARNING)"
    ]
    assert "expected SUCCESS: **NOT MET**" in report.table()
    assert "expected 1/1 SUCCESS: met" in report.table()


def test_parse_expect_forms() -> None:
    assert ref._parse_expect(
        ["server-sse-polling=WARNING", '{"ping": "SUCCESS"}', "0.2:x = 3/3 SUCCESS"]
    ) == {"server-sse-polling": "WARNING", "ping": "SUCCESS", "0.2:x": "3/3 SUCCESS"}


# --------------------------------------------------------------------------- processes (fake suite)

FAKE_SUITE = r"""
import json, os, sys, time

if sys.argv[1:] == ["--version"]:
    print(os.environ.get("FAKE_NODE_VERSION", "v22.23.5"))
    sys.exit(0)
spec = json.load(open(sys.argv[1]))
args = sys.argv[2:]
if args[:2] == ["list", "--server"]:
    print("Server scenarios (test against a server):")
    for name in spec["scenarios"]:
        print(f"  - {name} [2025-11-25]")
    print()
    print("Client scenarios (test against a client):")
    print("  - initialize [2025-11-25]")
    sys.exit(0)
assert args[0] == "server", args
opts = dict(zip(args[1::2], args[2::2]))
target = opts["--url"].rstrip("/").rsplit("/", 1)[-1]
out = opts["--output-dir"]
with open(os.environ["FAKE_SUITE_CALLS"], "a") as log:
    log.write(f"{target} {opts.get('--scenario') or 'suite'}\n")

def run(name):
    behaviour = spec["scenarios"][name][target]
    if behaviour == "hang":
        time.sleep(600)
    if behaviour == "crash":
        raise RuntimeError("boom")
    stamp = time.strftime("%Y-%m-%dT%H-%M-%S-000Z", time.gmtime())
    path = os.path.join(out, f"server-{name}-{stamp}")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "checks.json"), "w") as f:
        json.dump(behaviour, f)

if "--scenario" in opts:
    run(opts["--scenario"])
else:
    print(f"Running all suite ({len(spec['scenarios'])} scenarios)", flush=True)
    for name in spec["scenarios"]:
        print(f"\n=== Running scenario: {name} ===", flush=True)
        try:
            run(name)
        except RuntimeError as exc:
            print(f"Failed to run scenario {name}: Error: {exc}", flush=True)
"""


@pytest.fixture
def fake_suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Install a fake node + suite; returns a function writing the scenario behaviours."""
    package = tmp_path / "package"
    node = tmp_path / "fake-node"
    node.write_text(f"#!{sys.executable}\n{FAKE_SUITE}")
    node.chmod(node.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv(ref.NODE_ENV, str(node))
    monkeypatch.setattr(ref, "PACKAGE_DIR", package)
    monkeypatch.setattr(ref, "VERSIONS", {"0.1": "conformance-0.1"})
    monkeypatch.setenv("FAKE_SUITE_CALLS", str(tmp_path / "out" / "calls.log"))

    def configure(scenarios: dict[str, dict[str, Any]]) -> Path:
        entry = package / "node_modules" / "conformance-0.1" / "dist" / "index.js"
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.write_text(json.dumps({"scenarios": scenarios}))
        return tmp_path / "out"

    return configure


OK = [check("ok", SUCCESS)]


def run_referee(out: Path, **kwargs: Any) -> Report:
    return asyncio.run(
        ref.referee(
            "http://127.0.0.1:1/bare",
            "http://127.0.0.1:1/gateway",
            versions=("0.1",),
            out_dir=out,
            **kwargs,
        )
    )


def calls(out: Path) -> list[str]:
    return sorted((out / "calls.log").read_text().splitlines())


def test_toolchain_problem_names_the_missing_piece(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(ref.NODE_ENV, str(tmp_path / "no-such-node"))
    assert "node binary not found" in (ref.toolchain_problem() or "")
    with pytest.raises(ref.RefereeError, match="node binary not found"):
        run_referee(tmp_path)


def test_toolchain_problem_rejects_old_node(fake_suite, monkeypatch) -> None:
    fake_suite({"a": {"bare": OK, "gateway": OK}})
    assert ref.toolchain_problem() is None
    monkeypatch.setenv("FAKE_NODE_VERSION", "v20.20.2")
    assert "needs Node >= 22" in (ref.toolchain_problem() or "")


def test_one_suite_process_per_target(fake_suite) -> None:
    out = fake_suite(
        {
            "a": {"bare": OK, "gateway": OK},
            "b": {"bare": [check("b", SUCCESS)], "gateway": [check("b", WARNING, "meh")]},
        }
    )
    report = run_referee(out, expect={"a": "SUCCESS"})
    assert calls(out) == ["bare suite", "gateway suite"]
    assert [(r.scenario, r.bare.error, r.gateway.error) for r in report.rows] == [
        ("a", None, None),
        ("b", None, None),
    ]
    assert [str(w) for w in report.worse] == ["[0.1] b / b: bare SUCCESS -> gateway WARNING: meh"]
    assert report.expectation_failures == []
    assert report.rows[0].bare.checks_path is not None


def test_a_hanging_scenario_is_killed_and_the_rest_run_one_by_one(fake_suite) -> None:
    out = fake_suite(
        {
            "a": {"bare": OK, "gateway": OK},
            "hangs": {"bare": OK, "gateway": "hang"},
            "c": {"bare": OK, "gateway": OK},
            "crashes": {"bare": "crash", "gateway": "crash"},
        }
    )
    report = run_referee(out, timeout_s=2)
    assert calls(out) == [
        "bare suite",
        "gateway c",  # never started in the killed suite process: run alone
        "gateway crashes",
        "gateway suite",
    ]
    rows = {r.scenario: r for r in report.rows}
    assert rows["a"].ok
    assert rows["c"].ok
    assert "timed out after 2 s" in (rows["hangs"].gateway.error or "")
    assert {w.check_id for w in rows["hangs"].worse} == {"ok", "referee-run"}
    # crashed on both sides: the same synthetic failure, so not worse
    assert rows["crashes"].bare.error == "scenario crashed: Error: boom"
    assert "no checks.json written" in (rows["crashes"].gateway.error or "")
    assert rows["crashes"].worse == []


def test_isolate_and_subsets_run_one_process_per_scenario(fake_suite) -> None:
    out = fake_suite({"a": {"bare": OK, "gateway": OK}, "b": {"bare": OK, "gateway": OK}})
    report = run_referee(out, scenarios=["b"])
    assert calls(out) == ["bare b", "gateway b"]
    assert [r.scenario for r in report.rows] == ["b"]
    report = run_referee(out, isolate=True)
    assert len(calls(out)) == 6
    with pytest.raises(ref.RefereeError, match="nosuch"):
        run_referee(out, scenarios=["nosuch"])


def test_deadline_stops_starting_new_processes(fake_suite) -> None:
    out = fake_suite({"a": {"bare": OK, "gateway": OK}})
    report = run_referee(out, isolate=True, deadline_s=0)
    assert not (out / "calls.log").exists()
    assert "deadline" in (report.rows[0].gateway.error or "")


def test_cli_exit_codes(fake_suite, capsys) -> None:
    out = fake_suite({"a": {"bare": OK, "gateway": [check("ok", WARNING)]}})
    base = ["--bare", "http://127.0.0.1:1/bare", "--gateway", "http://127.0.0.1:1/gateway"]
    base += ["--versions", "0.1", "--out", str(out), "--quiet"]
    assert ref.main(base) == 1
    printed = capsys.readouterr().out
    assert "| a | 0.1 | 1/1 SUCCESS | 1 WARNING | **WORSE** (1 check) |" in printed
    assert "PROBLEM [0.1] a / ok: bare SUCCESS -> gateway WARNING" in printed
    assert (out / "report.md").is_file()
    assert (out / "report.json").is_file()
    out = fake_suite({"a": {"bare": OK, "gateway": OK}})
    assert ref.main([*base, "--expect", "a=SUCCESS"]) == 0
    assert ref.main([*base, "--expect", "a=WARNING"]) == 1
    assert ref.main([*base, "--expect", "nonsense"]) == 2
    assert ref.main([*base, "--scenario", "nosuch"]) == 2


def test_a_setup_check_that_failed_bare_may_be_missing_when_all_succeed_as_expected() -> None:
    bare = make_run("tasks-x", "bare", [check("setup", FAILURE)])
    gateway = make_run("tasks-x", "gateway", [check("a", SUCCESS), check("b", SUCCESS)])
    assert ref._row("0.2", "tasks-x", bare, gateway, {"tasks-x": "2/2 SUCCESS"}).ok
    # Without the expectation, or with one that is not all successes, it is still worse.
    for expect in ({}, {"tasks-x": "SUCCESS"}):
        row = ref._row("0.2", "tasks-x", bare, gateway, expect)
        assert [w.check_id for w in row.worse] == ["setup"]
