"""Micro-benchmark of the SSE codec: events/s for encode and decode, small and large events.

Run: ``python bench/sse_codec.py``. Bounded: under a minute, about 200 MB of memory at most.
Times are the process's CPU time (best of 3 rounds), so other load on the machine skews them
less than wall-clock time would.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from mcp_sse_gateway.sse import SSEDecoder, encode_event

SMALL_N = 100_000
LARGE_N = 10
LARGE_BYTES = 1 << 20
CHUNK = 16 * 1024  # a typical socket read


def _small_payload(i: int) -> str:
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {"progressToken": i, "progress": i, "total": SMALL_N},
        }
    )


def _best(fn: Callable[[], int], rounds: int = 3) -> tuple[float, int]:
    best = float("inf")
    count = 0
    for _ in range(rounds):
        start = time.process_time()
        count = fn()
        best = min(best, time.process_time() - start)
    return best, count


def _chunks(wire: bytes, size: int) -> list[bytes]:
    return [wire[i : i + size] for i in range(0, len(wire), size)]


def _report(label: str, seconds: float, events: int, nbytes: int) -> None:
    print(f"{label:<44} {events / seconds:>12,.0f} events/s {nbytes / seconds / 1e6:>9,.1f} MB/s")


def main() -> None:
    small = [_small_payload(i) for i in range(SMALL_N)]
    ids = [f"s1-{i}" for i in range(SMALL_N)]

    seconds, _ = _best(lambda: len([encode_event(d) for d in small]))
    wire_plain = b"".join(encode_event(d) for d in small)
    _report(f"encode {SMALL_N:,} small (data only)", seconds, SMALL_N, len(wire_plain))

    pairs = list(zip(small, ids, strict=True))
    seconds, _ = _best(lambda: len([encode_event(d, event="message", id=i) for d, i in pairs]))
    wire = b"".join(encode_event(d, id=i) for d, i in zip(small, ids, strict=True))
    _report(f"encode {SMALL_N:,} small (event + id + data)", seconds, SMALL_N, len(wire))

    chunks = _chunks(wire, CHUNK)

    def decode_small() -> int:
        decoder = SSEDecoder(max_event_bytes=1 << 20)
        return sum(len(decoder.feed(c)) for c in chunks)

    seconds, count = _best(decode_small)
    assert count == SMALL_N, count
    _report(
        f"decode {SMALL_N:,} small (id + data, {CHUNK // 1024} KiB reads)",
        seconds,
        count,
        len(wire),
    )

    one_per_read = [encode_event(d, id=i) for d, i in zip(small, ids, strict=True)]

    def decode_small_unbatched() -> int:
        decoder = SSEDecoder(max_event_bytes=1 << 20)
        return sum(len(decoder.feed(c)) for c in one_per_read)

    seconds, count = _best(decode_small_unbatched)
    assert count == SMALL_N, count
    _report(f"decode {SMALL_N:,} small (one event per read)", seconds, count, len(wire))

    big = "x" * (LARGE_BYTES - 20)
    big_lines = "\n".join("y" * 1000 for _ in range(LARGE_BYTES // 1001))
    seconds, _ = _best(lambda: len([encode_event(big, id=str(i)) for i in range(LARGE_N)]))
    wire_big = b"".join(encode_event(big, id=str(i)) for i in range(LARGE_N))
    _report(f"encode {LARGE_N} x 1 MB (one line)", seconds, LARGE_N, len(wire_big))
    seconds, _ = _best(lambda: len([encode_event(big_lines) for _ in range(LARGE_N)]))
    wire_lines = b"".join(encode_event(big_lines) for _ in range(LARGE_N))
    _report(f"encode {LARGE_N} x 1 MB (1 KB lines)", seconds, LARGE_N, len(wire_lines))

    for label, data in (("one line", wire_big), ("1 KB lines", wire_lines)):
        for size in (4 * 1024, 64 * 1024):
            big_chunks = _chunks(data, size)

            def decode_big(big_chunks: list[bytes] = big_chunks) -> int:
                decoder = SSEDecoder(max_event_bytes=2 * LARGE_BYTES)
                return sum(len(decoder.feed(c)) for c in big_chunks)

            seconds, count = _best(decode_big)
            assert count == LARGE_N, count
            _report(
                f"decode {LARGE_N} x 1 MB ({label}, {size // 1024} KiB reads)",
                seconds,
                count,
                len(data),
            )


if __name__ == "__main__":
    main()
