"""The Python runtime, tuned for a long-lived server holding thousands of streams.

CPython's cycle collector runs a young collection every 700 new container objects (net of those
freed). A gateway holding thousands of streams keeps each stream's waiting objects (a future, a
timer, a task) alive for about the time between its events, so young collections keep promoting
them to the old generation, and every so often a full collection walks the whole heap: at 5,000
streams, 0.3 s with the event loop stopped, every few seconds. :func:`tune_gc` raises the young
threshold (``server.gc_young_threshold``), so that what lives briefly is freed by reference
counting before a collection sees it, and freezes what start-up built (modules, settings), which
no collection needs to walk again. Garbage that only the collector can free (cycles)
is still collected, after more allocations: a bound of about the threshold's worth of objects.

Each stream holds two sockets (the client's and the upstream's), so :func:`raise_open_files_limit`
raises the soft open-files limit to the hard one at start (what Go programs and nginx's
``worker_rlimit_nofile`` do): a soft limit of 1,024, common outside containers, would otherwise
stop a replica at about 500 streams.
"""

from __future__ import annotations

import gc
import resource

import structlog

log = structlog.get_logger("mcp_sse_gateway.runtime")

#: The soft open-files limit asked for when the hard one is unlimited (macOS's OPEN_MAX).
UNLIMITED_OPEN_FILES = 10_240


def tune_gc(young_threshold: int) -> None:
    """Freeze start-up's objects and set the young generation's threshold; 0 changes nothing.

    Args:
        young_threshold: net new container objects between young collections (Python's
            ``gc.set_threshold`` first value); the older generations' thresholds are kept.
    """
    if young_threshold <= 0:
        return
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(young_threshold, older, oldest)
    log.debug("runtime.gc_tuned", young_threshold=young_threshold, frozen=gc.get_freeze_count())


def raise_open_files_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or (hard != resource.RLIM_INFINITY and soft >= hard):
        return soft
    # An unlimited hard limit (macOS) is not a value setrlimit takes for the soft one.
    wanted = UNLIMITED_OPEN_FILES if hard == resource.RLIM_INFINITY else hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError):
        return soft
    log.debug("runtime.open_files_raised", soft=soft, limit=wanted)
    return wanted
