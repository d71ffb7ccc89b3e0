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
