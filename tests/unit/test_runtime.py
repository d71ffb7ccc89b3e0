"""The runtime tuning of the serving process: the garbage collector and the open-files limit.

Each check runs in a child interpreter: tuning the test process itself would change every
other test's runtime.
"""

from __future__ import annotations

import json
import subprocess
import sys


def _collector_after(young: int) -> dict[str, object]:
    code = (
        "import gc, json; from mcp_sse_gateway.runtime import tune_gc; "
        f"before = gc.get_threshold(); tune_gc({young}); "
        "print(json.dumps({'before': before, 'after': gc.get_threshold(), "
        "'frozen': gc.get_freeze_count()}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return json.loads(out.strip().splitlines()[-1])  # after any log line


def test_gc_tuning_raises_the_young_threshold_and_freezes_start_up():
    tuned = _collector_after(20000)
    before, after = tuned["before"], tuned["after"]
    assert after == [20000, before[1], before[2]]
    assert tuned["frozen"] > 0


def test_gc_tuning_off_leaves_the_collector_as_it_is():
    untouched = _collector_after(0)
    assert untouched["after"] == untouched["before"]
    assert untouched["frozen"] == 0


def test_the_open_files_limit_is_raised_to_the_hard_limit():
    code = (
        "import resource; from mcp_sse_gateway.runtime import raise_open_files_limit; "
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE); "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard)); "
        "raise_open_files_limit(); "
        "print(resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip().splitlines()[-1] == "True"
