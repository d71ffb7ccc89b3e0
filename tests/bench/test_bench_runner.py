"""The benchmark runner: a scenario that hangs is stopped and reported, not waited on forever."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench import runner
from bench.runs import Upstream
from bench.scenarios import Context, Outcome, Sizes


async def _hangs(ctx: Context) -> Outcome:
    await asyncio.Event().wait()  # nothing ever sets it
    raise AssertionError("unreachable")


async def _fails(ctx: Context) -> Outcome:
    raise RuntimeError("boom")


def _context(tmp_path: Path) -> Context:
    upstream = Upstream("http://127.0.0.1:9/mcp", [])  # never contacted
    return Context(Sizes.smoke(), upstream, {}, {}, tmp_path, log=lambda _: None)


async def test_a_scenario_that_hangs_is_stopped_and_reported_with_where_it_waited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(runner.SCENARIOS, "hangs", _hangs)

    async with asyncio.timeout(30):
        outcome, ok = await runner._scenario("hangs", _context(tmp_path), timeout_s=1.0)

    assert not ok
    assert outcome.tables[0].rows == [["still running after 1 s (a hang): stopped"]]
    logged = capsys.readouterr()
    assert "_hangs" in logged.out + logged.err  # the stack of the task that waited


async def test_a_scenario_that_raises_is_reported_with_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(runner.SCENARIOS, "fails", _fails)

    outcome, ok = await runner._scenario("fails", _context(tmp_path), timeout_s=30.0)

    assert not ok
    assert outcome.tables[0].rows == [["RuntimeError: boom"]]
