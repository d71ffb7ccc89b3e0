"""The task runner without sockets (mcp_sse_gateway.streams.tasks): bounds and store failures.

A real in-memory store, the scripted upstream of :mod:`tests.support.fake_upstream`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from mcp_sse_gateway.config import Settings
from mcp_sse_gateway.errors import GatewayBusy, StoreUnavailable
from mcp_sse_gateway.store.memory import MemoryStore
from mcp_sse_gateway.streams import Streams
from mcp_sse_gateway.streams import tasks as tasks_module
from mcp_sse_gateway.streams.upstream import UpstreamCall
from tests.support.fake_upstream import URL_, ScriptedResponse, ScriptedUpstream
from tests.support.streams import make_streams
from tests.support.waiting import eventually

CALL = UpstreamCall(URL_, [("Mcp-Method", "tools/call")])
REQUEST = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t"}}
RESULT = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"content": []}}).encode()


def _streams(store: MemoryStore, upstream: ScriptedUpstream, **server: Any) -> Streams:
    settings = Settings(upstream={"url": str(URL_)}, server=server, tasks={"enabled": True})
    return make_streams(settings, upstream, store)


def _owns(_binding: str) -> bool:
    return True


class _FailingWrites(MemoryStore):
    """Refuses every task write after the first (the creation), as a store that went down."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    async def put_task(self, task_id: str, record: str, *, version: int, ttl_ms: int) -> bool:
        self.writes += 1
        if self.writes > 1:
            raise StoreUnavailable("down")
        return await super().put_task(task_id, record, version=version, ttl_ms=ttl_ms)


async def test_an_outcome_the_store_would_not_take_fails_the_task_once_it_is_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tasks_module, "SETTLE_RETRY_S", (0.0,))
    store = _FailingWrites()
    answer = ScriptedResponse(content_type="application/json", body=[RESULT])
    streams = _streams(store, ScriptedUpstream().then(answer))
    record = await streams.tasks.create(REQUEST, CALL)
    await eventually(lambda: streams.tasks.running == 0)
    assert store.writes == 3  # the creation, then the outcome twice: never stored
    store.writes = -10  # the store is back
    seen = await streams.tasks.get(record.task_id, _owns)
    assert seen.status == "failed"
    assert seen.error is not None
    assert seen.error["message"] == tasks_module.OUTCOME_LOST
    again = await streams.tasks.get(record.task_id, _owns)
    assert again == seen
    assert streams.ctx.metrics.tasks_settled.labels("failed")._value.get() == 1


async def test_no_task_is_created_beyond_the_pump_bound() -> None:
    body: asyncio.Queue[Any] = asyncio.Queue()  # the first call's answer, when the test says
    answer = ScriptedResponse(content_type="application/json", body=body)
    streams = _streams(MemoryStore(), ScriptedUpstream().then(answer), max_pumps=1)
    first = await streams.tasks.create(REQUEST, CALL)
    with pytest.raises(GatewayBusy):
        await streams.tasks.create(REQUEST, CALL)
    body.put_nowait(RESULT)
    body.put_nowait(None)
    await eventually(lambda: streams.tasks.running == 0)
    assert (await streams.tasks.get(first.task_id, _owns)).status == "completed"
