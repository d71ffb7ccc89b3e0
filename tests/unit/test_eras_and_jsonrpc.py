"""Era rules (DESIGN D2) and the JSON-RPC helpers that feed them."""

from __future__ import annotations

import json

import pytest

from mcp_sse_gateway import jsonrpc
from mcp_sse_gateway.eras import Era, era_for


@pytest.mark.parametrize(
    ("session", "version", "era"),
    [
        (None, "2025-11-25", Era.PASS_THROUGH),
        ("", None, Era.PASS_THROUGH),
        ("s", "2025-03-26", Era.RESUMABLE),
        ("s", "2025-06-18", Era.RESUMABLE),
        ("s", None, Era.RESUMABLE),
        ("s", "draft", Era.RESUMABLE),
        ("s", "2025-11-25", Era.RESUMABLE_PRIMED),
        ("s", "2026-03-01", Era.RESUMABLE_PRIMED),
    ],
)
def test_era_table(session, version, era):
    assert era_for(session, version) is era
    assert era.resumable == (era is not Era.PASS_THROUGH)
    assert era.primes == (era is Era.RESUMABLE_PRIMED)


def test_parse_messages_accepts_single_and_batch():
    single = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    assert jsonrpc.parse_messages(json.dumps(single)) == [single]
    batch = [single, {"jsonrpc": "2.0", "method": "notifications/initialized"}]
    assert jsonrpc.parse_messages(json.dumps(batch).encode()) == batch
    assert jsonrpc.request_ids(batch) == [1]
    for junk in (b"", b"{", b"[]", b"[1]", b"\xff", b"3"):
        assert jsonrpc.parse_messages(junk) is None


def test_initialize_detection():
    init = [{"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}]
    assert jsonrpc.is_initialize(init)
    assert not jsonrpc.is_initialize(None)
    result = [
        {
            "jsonrpc": "2.0",
            "id": 0,
            "result": {"protocolVersion": "2025-06-18", "serverInfo": {"name": "x"}},
        }
    ]
    assert jsonrpc.initialize_version(result) == "2025-06-18"
    assert jsonrpc.initialize_version([{"jsonrpc": "2.0", "id": 0, "result": {}}]) is None
    assert (
        jsonrpc.initialize_version(
            [{"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": 3, "serverInfo": {}}}]
        )
        is None
    )


def test_deeply_nested_json_is_not_parsed():
    deep = b"[" * 100_000 + b"]" * 100_000
    assert jsonrpc.parse_messages(deep) is None


def test_boolean_and_unhashable_ids_are_not_request_ids():
    messages = [
        {"jsonrpc": "2.0", "id": True, "method": "x"},
        {"jsonrpc": "2.0", "id": [1], "method": "y"},
        {"jsonrpc": "2.0", "id": 1, "method": "z"},
    ]
    assert jsonrpc.request_ids(messages) == [1]


@pytest.mark.parametrize(
    ("body", "batch"),
    [
        (b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]', True),
        (b"\xef\xbb\xbf \r\n\t[{}]", True),
        # Leading whitespace of any length: a padded batch of one is still a batch.
        (b" " * 300 + b"[{}]", True),
        (b"\n" * 70_000 + b"[{}]", True),
        (("\ufeff" + " " * 300 + "[{}]").encode("utf-16"), True),
        ((" " * 300 + "[{}]").encode("utf-32-le"), True),
        (b" " * 300 + b'{"jsonrpc":"2.0","id":1,"method":"ping"}', False),
        ((" " * 300 + "{}").encode("utf-16-le"), False),
        (b"", False),
        (b"   ", False),
    ],
)
def test_is_batch_skips_all_leading_whitespace(body: bytes, batch: bool) -> None:
    assert jsonrpc.is_batch(body) is batch
