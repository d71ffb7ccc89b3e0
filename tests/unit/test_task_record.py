"""Task records and their wire shapes (SEP-2663), without I/O (``streams.task_record``)."""

from __future__ import annotations

import re

import pytest

from mcp_sse_gateway.streams.task_record import (
    META_CLIENT_CAPABILITIES,
    META_PROTOCOL_VERSION,
    TASKS_EXTENSION,
    Outcome,
    TaskRecord,
    declares_tasks,
    gateway_error,
    is_modern,
    missing_capability,
    new_record,
)

ISO = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
REQUEST = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "t"}}


def _record() -> TaskRecord:
    return new_record(REQUEST, owner="replica-a", auth="", ttl_ms=60_000, poll_ms=500)


def test_a_new_task_answers_a_flat_create_task_result() -> None:
    record = _record()
    created = record.create_result()
    assert created == {
        "resultType": "task",
        "taskId": record.task_id,
        "status": "working",
        "createdAt": record.created_at,
        "lastUpdatedAt": record.created_at,
        "ttlMs": 60_000,
        "pollIntervalMs": 500,
    }
    assert ISO.match(record.created_at)
    assert len(record.task_id) >= 22  # 128 random bits, URL-safe
    assert _record().task_id != record.task_id


@pytest.mark.parametrize(
    ("message", "status", "field"),
    [
        ({"id": 3, "result": {"content": [], "resultType": "complete"}}, "completed", "result"),
        ({"id": 3, "result": {"content": [], "isError": True}}, "completed", "result"),
        ({"id": 3, "error": {"code": -32603, "message": "x"}}, "failed", "error"),
        ({"id": 3, "result": "not an object"}, "failed", "error"),
    ],
)
def test_an_answer_settles_the_task(message: dict, status: str, field: str) -> None:
    settled = _record().settled(Outcome.of_response(message))
    detailed = settled.detailed()
    assert detailed["status"] == status
    assert field in detailed
    assert {"result", "error", "inputRequests"} & set(detailed) == {field}
    assert detailed["resultType"] == "complete"
    if field == "result":
        assert "resultType" not in detailed["result"]
    assert settled.terminal
    assert settled.owner == ""


def test_input_required_shows_pending_requests_and_never_the_request_state() -> None:
    asked = {"resultType": "input_required", "inputRequests": {"a": {}, "b": {}}}
    record = _record().settled(
        Outcome.of_response({"id": 3, "result": {**asked, "requestState": "s"}})
    )
    assert record.status == "input_required"
    assert set(record.detailed()["inputRequests"]) == {"a", "b"}
    assert "requestState" not in record.detailed()
    partial = record.answered({"a": {"action": "accept"}, "zzz": {}}, owner="replica-b")
    assert partial.status == "input_required"
    assert set(partial.detailed()["inputRequests"]) == {"b"}
    assert "zzz" not in partial.responses
    done = partial.answered({"b": {"action": "decline"}}, owner="replica-b")
    assert done.status == "working"
    assert done.owner == "replica-b"
    again = done.reissued()
    assert again["params"]["inputResponses"] == {
        "a": {"action": "accept"},
        "b": {"action": "decline"},
    }
    assert again["params"]["requestState"] == "s"
    assert again["params"]["name"] == "t"


def test_a_record_round_trips_through_json_and_refuses_garbage() -> None:
    record = _record().settled(gateway_error("boom"))
    assert TaskRecord.from_json(record.to_json()) == record
    for text in ("", "[]", '{"task_id": 1}'):
        with pytest.raises(ValueError):
            TaskRecord.from_json(text)


def test_the_era_and_the_declaration_are_read_from_meta() -> None:
    assert is_modern({"_meta": {META_PROTOCOL_VERSION: "2026-07-28"}}, None)
    assert is_modern({}, "2026-07-28")
    assert not is_modern({}, "2025-11-25")
    # The request's own _meta wins over the header.
    assert not is_modern({"_meta": {META_PROTOCOL_VERSION: "2025-11-25"}}, "2026-07-28")
    declared = {META_CLIENT_CAPABILITIES: {"extensions": {TASKS_EXTENSION: {}}}}
    assert declares_tasks({"_meta": declared})
    assert not declares_tasks({"_meta": {META_CLIENT_CAPABILITIES: {}}})
    assert not declares_tasks(None)
    error = missing_capability(7)
    assert error["error"]["code"] == -32021
    assert TASKS_EXTENSION in error["error"]["data"]["requiredCapabilities"]["extensions"]
