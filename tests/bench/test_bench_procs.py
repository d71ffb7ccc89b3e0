"""The benchmark's CPU reading of other processes."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench.procs import CLK_TCK, cpu_seconds, proc_cpu_seconds, process_cpu_clock

# Spins until it has used 0.2 s of CPU, says so, then waits for its standard input to close.
_BURN = """
import sys, time
while time.process_time() < 0.2:
    pass
print("burnt", flush=True)
sys.stdin.read()
"""


def test_cpu_seconds_reads_a_child_finer_than_the_clock_tick() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "burnt\n"
        try:
            time.clock_gettime(process_cpu_clock(child.pid))
        except OSError:
            pytest.skip("this kernel does not let a process read another's CPU clock")
        before_ticks = proc_cpu_seconds(child.pid)
        seconds = cpu_seconds([child.pid])
        after_ticks = proc_cpu_seconds(child.pid)
        # The same time as /proc's ticks (truncated, and split between user and system time by
        # sampling: two ticks either side), but not rounded to them.
        assert before_ticks - 2 / CLK_TCK <= seconds <= after_ticks + 2 / CLK_TCK
        assert seconds >= 0.2
        assert seconds * CLK_TCK != round(seconds * CLK_TCK)
        assert cpu_seconds([child.pid, child.pid]) >= 2 * seconds
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)
    assert cpu_seconds([child.pid]) == 0.0
    assert cpu_seconds([0, -1]) == 0.0
