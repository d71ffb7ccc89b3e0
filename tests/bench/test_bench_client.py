"""The benchmark client's SSE parse: inline, and deferred for a replay's timing."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from bench.client import Connection, Response, StreamSink


class _Transport:
    def is_closing(self) -> bool:
        return False


def _stream(events: int) -> bytes:
    blocks = [
        f"event: message\nid: life-{i}\ndata: "
        + json.dumps({"jsonrpc": "2.0", "method": "notifications/message", "params": {"i": i}})
        + "\n\n"
        for i in range(1, events + 1)
    ]
    blocks.append(": keepalive\n\n")
    blocks.append('data: {"jsonrpc":"2.0","method":"m",\ndata: "params":{}}\n\n')  # two lines
    blocks.append(f'id: life-{events + 1}\ndata: {{"jsonrpc":"2.0","id":1,"result":{{}}}}\n\n')
    return "".join(blocks).encode()


async def _feed(sink: StreamSink, pieces: list[tuple[int, bytes]]) -> Connection:
    connection = Connection()
    connection.transport = _Transport()  # type: ignore[assignment]
    connection.state, connection.until_close = "body", True
    connection.response = Response(200, {})
    connection.sink, sink.connection = sink, connection
    sink.done = asyncio.get_running_loop().create_future()
    for now_ns, piece in pieces:
        connection._body(piece, now_ns)
    return connection


def _pieces(wire: bytes, size: int) -> list[tuple[int, bytes]]:
    return [(1000 + i, wire[i : i + size]) for i in range(0, len(wire), size)]


async def test_a_deferred_parse_counts_what_the_inline_one_does_at_the_same_times():
    wire = _stream(300)
    for size in (1, 7, 64, 4096, len(wire)):
        inline, deferred = StreamSink(), StreamSink(track_lag=False, parse_after_end=True)
        await _feed(inline, _pieces(wire, size))
        await _feed(deferred, _pieces(wire, size))
        assert deferred.done is not None
        assert deferred.done.done()  # the response was seen
        for sink in (inline, deferred):
            assert (sink.events, sink.notifications) == (302, 301)
            assert sink.last_id == b"life-301"
            assert sink.response == b'{"jsonrpc":"2.0","id":1,"result":{}}'
        # The response's time is that of the read that completed it, parsed later or not.
        assert deferred.response_ns == inline.response_ns == 1000 + (len(wire) - 1) // size * size


async def test_a_deferred_parse_keeps_the_reads_until_one_may_hold_the_response():
    wire = _stream(50)
    response_at = wire.index(b'"result"')
    sink = StreamSink(track_lag=False, parse_after_end=True)
    connection = await _feed(sink, [(1, wire[:response_at])])
    assert sink.events == 0
    assert connection.reads  # kept, not parsed yet
    await _feed_more(connection, [(2, wire[response_at : response_at + 3])])  # '"re'
    assert sink.events == 0
    await _feed_more(connection, [(3, wire[response_at + 3 :])])  # the marker straddles reads
    assert sink.events == 52
    assert sink.response_ns == 3


async def _feed_more(connection: Connection, pieces: list[tuple[int, bytes]]) -> None:
    for now_ns, piece in pieces:
        connection._body(piece, now_ns)


def test_the_parse_ends_on_a_run_of_blank_lines():
    # In a child process with a timeout: a parse that loops would otherwise hang the suite.
    code = (
        "import asyncio\n"
        "from bench.client import Connection, StreamSink\n"
        "async def main():\n"
        "    c = Connection(); c.sink = StreamSink()\n"
        "    c._parse(b'data: a\\n\\n\\n', 1)\n"
        "    c._parse(b'\\ndata: b\\n\\n\\n\\n\\n', 2)\n"
        "    print(c.sink.events)\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30, check=True)
    assert done.stdout.strip() == b"2"
