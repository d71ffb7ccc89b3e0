"""Stopping the processes a test started, with a deadline (SIGKILL when it runs out)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess


async def stop_process(
    process: asyncio.subprocess.Process,
    sig: int = signal.SIGKILL,
    *,
    timeout_s: float | None = None,
) -> None:
    """Send *sig* to *process* if it still runs and reap it.

    TimeoutError when it has not exited after *timeout_s* seconds (None: no deadline); it is
    killed and reaped all the same.
    """
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):  # it exited in the meantime
            process.send_signal(sig)
    try:
        await asyncio.wait_for(process.wait(), timeout_s)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def stop_popen(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Terminate *process* if it still runs; kill it when it has not exited after *timeout_s*."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout_s)
