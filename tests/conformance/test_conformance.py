"""DESIGN D10: the MCP conformance suite, bare upstream vs. through the gateway, check by check.

Starts the bundled example upstream (``python -m mcp_sse_gateway.example``) and the gateway in
front of it (``python -m mcp_sse_gateway serve``) as real processes on loopback, runs the
referee (``tests/conformance/referee.py``) for every pinned suite version and asserts that no
check is worse through the gateway and that :data:`EXPECTED_THROUGH_GATEWAY` holds.

Environment:
- ``CI`` set: a missing Node toolchain fails the test instead of skipping it.
- ``MCP_CONFORMANCE_NODE``: the Node >= 22 binary (default: the pinned one in node_modules).
- ``MCP_CONFORMANCE_UPSTREAM``: URL of an upstream you already run (then none is started).
- ``MCP_CONFORMANCE_OUT``: directory for the referee's results (default: a pytest temp dir).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from tests.conformance.referee import VERSIONS, Report, referee, toolchain_problem
from tests.conftest import TEST_DIGEST_KEY
from tests.support.gateway_process import gateway_env, serve_command
from tests.support.ports import free_port
from tests.support.processes import stop_popen

# Exact result of these scenarios through the gateway, on every suite version (see referee.py:
# a verdict is the scenario's worst verdict, a value like "3/3 SUCCESS" is the table cell).
# `server-sse-polling` has three verdict checks: priming event, `retry` field, and resume after
# the server closed the stream mid-call. Bare, the upstream (no event store) neither primes nor
# closes: 2 WARNING. Through the gateway configured as below, all three pass on both versions,
# including 0.1.16, which sends `MCP-Protocol-Version: 2025-03-26` on a 2025-11-25 session (D2).
#
# The Tasks extension's scenarios (0.2 only) fail bare: the example server has no tasks (its
# task fixtures are synchronous tools). Through the gateway with deploy/examples/tasks.toml
# every check passes; `tasks-status-notifications` (optional notifications) stays SKIPPED.
EXPECTED_THROUGH_GATEWAY: dict[str, str] = {
    "server-sse-polling": "3/3 SUCCESS",
    "tasks-lifecycle": "9/9 SUCCESS",
    "tasks-capability-negotiation": "5/5 SUCCESS",
    "tasks-wire-fields": "4/4 SUCCESS",
    "tasks-request-state-removal": "3/3 SUCCESS",
    "tasks-mrtr-input": "4/4 SUCCESS",
    "tasks-request-headers": "5/5 SUCCESS",
    "tasks-dispatch-and-envelope": "9/9 SUCCESS",
    "tasks-status-notifications": "SKIPPED",
    "tasks-required-task-error": "3/3 SUCCESS",
    "tasks-mrtr-composition": "2/2 SUCCESS",
}

#: The documented configuration that serves the example server's task fixtures as tasks.
TASKS_CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "tasks.toml"

# The gateway's configuration in this run, as a user would set it: environment variables.
# Polling on: every POST stream of a 2025-11-25 session is closed right after its priming event,
# so every scenario's answers travel through a resume with Last-Event-ID. Tasks on, as
# deploy/examples/tasks.toml says (the TOML file, named by the environment).
GATEWAY_ENVIRONMENT = {
    "MCP_SSE_GATEWAY_SSE__POLL_AFTER_MS": "0",
    "MCP_SSE_GATEWAY_CONFIG": str(TASKS_CONFIG),
}

UPSTREAM_MODULE = "mcp_sse_gateway.example"
START_DEADLINE_S = 30.0
STOP_DEADLINE_S = 10.0
SCENARIO_TIMEOUT_S = 60.0
REFEREE_DEADLINE_S = 600.0

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(REFEREE_DEADLINE_S + 300)]


def _require_toolchain() -> None:
    problem = toolchain_problem(VERSIONS)
    if problem is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"conformance toolchain missing in CI: {problem}")
    pytest.skip(f"conformance toolchain missing: {problem}")


def _drain(stream: IO[bytes], sink: IO[bytes]) -> None:
    for line in iter(stream.readline, b""):
        sink.write(line)
        sink.flush()


def _tail(path: Path, chars: int = 3000) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(encoding="utf-8", errors="replace")[-chars:]
    return ""


@contextlib.contextmanager
def _upstream(log_dir: Path) -> Iterator[str]:
    """The example upstream on a free port; yields the URL it announces on stdout."""
    override = os.environ.get("MCP_CONFORMANCE_UPSTREAM")
    if override:
        yield override
        return
    stdout_log, stderr_log = log_dir / "upstream.stdout.log", log_dir / "upstream.stderr.log"
    cmd = [sys.executable, "-m", UPSTREAM_MODULE, "--host", "127.0.0.1", "--port", "0"]
    with stdout_log.open("wb") as out, stderr_log.open("wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err)
        found: list[str] = []

        def read_announcement() -> None:
            assert proc.stdout is not None
            for line in iter(proc.stdout.readline, b""):
                out.write(line)
                out.flush()
                text = line.decode("utf-8", "replace").strip()
                if text.startswith("LISTENING "):
                    found.append(text.split(" ", 1)[1])
                    break
            _drain(proc.stdout, out)  # keep the pipe from filling up

        reader = threading.Thread(target=read_announcement, daemon=True)
        reader.start()
        try:
            deadline = time.monotonic() + START_DEADLINE_S
            while not found and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if not found:
                how = (
                    f"exited with code {proc.returncode}"
                    if proc.poll() is not None
                    else f"still running after {START_DEADLINE_S:.0f} s"
                )
                raise RuntimeError(
                    f"upstream `{' '.join(cmd)}` never printed LISTENING ({how}); stderr:\n"
                    + _tail(stderr_log)
                )
            yield found[0]
        finally:
            stop_popen(proc, STOP_DEADLINE_S)
            reader.join(10)  # EOF after the process ended: stop writing before the log closes


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # loopback only
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def _gateway(
    upstream_url: str, log_dir: Path, extra_env: dict[str, str] | None = None
) -> Iterator[str]:
    """The gateway in front of *upstream_url*; yields its MCP endpoint URL once /healthz is 200."""
    log = log_dir / "gateway.log"
    env = gateway_env(**{**GATEWAY_ENVIRONMENT, **(extra_env or {})})
    for _attempt in range(3):  # the free port may be taken between probe and bind
        port = free_port()
        cmd = serve_command(upstream_url, port, host="127.0.0.1")
        with log.open("ab") as sink:
            proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + START_DEADLINE_S
            while proc.poll() is None and time.monotonic() < deadline:
                if _healthy(f"http://127.0.0.1:{port}/healthz"):
                    yield f"http://127.0.0.1:{port}/mcp"
                    return
                time.sleep(0.1)
            if proc.poll() is None:
                raise RuntimeError(
                    f"gateway not healthy within {START_DEADLINE_S:.0f} s; log:\n{_tail(log)}"
                )
        finally:
            stop_popen(proc, STOP_DEADLINE_S)
    raise RuntimeError(f"gateway exited at start three times; log:\n{_tail(log)}")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Report:
    """One referee pass (every version, every scenario, both targets) shared by the tests."""
    _require_toolchain()
    logs = tmp_path_factory.mktemp("conformance-processes")
    out_env = os.environ.get("MCP_CONFORMANCE_OUT")
    out = Path(out_env) if out_env else tmp_path_factory.mktemp("conformance-results")
    store_env: dict[str, str] = {}
    if os.environ.get("GATEWAY_TEST_STORE") == "redis":
        # The same run with the events in a real redis-server (see tests/conftest.py).
        store_env = {
            "MCP_SSE_GATEWAY_STORE__BACKEND": "redis",
            "MCP_SSE_GATEWAY_STORE__REDIS_URL": request.getfixturevalue("redis_server"),
            "MCP_SSE_GATEWAY_STORE__KEY_PREFIX": "conformance",
            "MCP_SSE_GATEWAY_AUTH__DIGEST_KEY": TEST_DIGEST_KEY,
        }
    with (
        _upstream(logs) as upstream_url,
        _gateway(upstream_url, logs, store_env) as gateway_url,
    ):
        result = asyncio.run(
            referee(
                upstream_url,
                gateway_url,
                versions=tuple(VERSIONS),
                out_dir=out,
                expect=EXPECTED_THROUGH_GATEWAY,
                timeout_s=SCENARIO_TIMEOUT_S,
                deadline_s=REFEREE_DEADLINE_S,
            )
        )
    result.write()
    print(f"\n{result.table()}\n\nconformance results in {result.out_dir}")
    return result


def test_every_version_ran_every_scenario(report: Report) -> None:
    """Each suite version's whole server scenario list ran against both targets."""
    for version in VERSIONS:
        ran = [row.scenario for row in report.rows if row.version == version]
        assert ran == report.scenario_lists[version]
    assert "server-sse-polling" in report.scenario_lists["0.1"], "pending scenarios must run too"


def test_no_check_worse_through_gateway(report: Report) -> None:
    """DESIGN D10: no check of the conformance suite is worse through the gateway than bare."""
    worse = "\n".join(str(w) for w in report.worse)
    assert not report.worse, (
        f"{len(report.worse)} check(s) worse through the gateway:\n{worse}\n\n"
        f"{report.table()}\n\nfull results: {report.out_dir}"
    )


def test_expectations_through_gateway(report: Report) -> None:
    """The scenarios pinned in EXPECTED_THROUGH_GATEWAY end exactly as expected."""
    failures = "\n".join(report.expectation_failures)
    assert not report.expectation_failures, f"{failures}\n\nfull results: {report.out_dir}"
    pinned = [row for row in report.rows if row.expected is not None]
    assert {row.scenario for row in pinned} == set(EXPECTED_THROUGH_GATEWAY)
