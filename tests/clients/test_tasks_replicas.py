"""Tasks across replicas (DESIGN D11 with D7, D8): real processes on a real redis-server.

Three gateway replicas share one redis-server in front of the real example server (no Tasks
support of its own), each with ``deploy/examples/tasks.toml``. The client is raw HTTP of the
2026-07-28 era (no SDK speaks its Tasks extension yet):

* a task created on one replica is polled to its result on another, its creating connection
  long closed;
* a rolling restart (SIGTERM: a drain) of the replica running a task lets the call finish;
  another replica serves the result;
* a SIGKILL of that replica fails the task once its heartbeat expired, exactly once however many
  replicas poll it at the same time;
* every key the replicas wrote has a TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mcp_sse_gateway.example.process import example_upstream
from tests.conftest import TEST_DIGEST_KEY
from tests.support import modern_client as mc
from tests.support.gateway_process import gateway_env, gateway_process, serve_command
from tests.support.ports import free_port
from tests.support.redis_keys import assert_every_key_expires

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

TASKS_TOML = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "tasks.toml"
DEADLINE_S = 30.0
HEARTBEAT_EXPIRY_S = 1.0


@contextlib.asynccontextmanager
async def _replica(upstream_url: str, redis_url: str, prefix: str) -> AsyncIterator[Any]:
    port = free_port()
    env = gateway_env(
        MCP_SSE_GATEWAY_CONFIG=str(TASKS_TOML),
        MCP_SSE_GATEWAY_TASKS__POLL_INTERVAL_MS="200",
        MCP_SSE_GATEWAY_STORE__BACKEND="redis",
        MCP_SSE_GATEWAY_STORE__REDIS_URL=redis_url,
        MCP_SSE_GATEWAY_STORE__KEY_PREFIX=prefix,
        MCP_SSE_GATEWAY_SERVER__DRAIN_TIMEOUT_S="20",
        MCP_SSE_GATEWAY_STORE__HEARTBEAT_S="0.2",
        MCP_SSE_GATEWAY_STORE__HEARTBEAT_EXPIRY_S=str(HEARTBEAT_EXPIRY_S),
        MCP_SSE_GATEWAY_AUTH__DIGEST_KEY=TEST_DIGEST_KEY,
    )
    async with gateway_process(
        serve_command(upstream_url, port),
        env=env,
        ready_url=f"http://127.0.0.1:{port}/readyz",
        ready_timeout_s=DEADLINE_S,
    ) as process:
        process.mcp_url = f"http://127.0.0.1:{port}/mcp"
        process.metrics_url = f"http://127.0.0.1:{port}/metrics"
        yield process


@contextlib.asynccontextmanager
async def _replicas(private_redis: Any) -> AsyncIterator[tuple[Any, Any, Any]]:
    prefix = uuid.uuid4().hex
    async with (
        example_upstream() as upstream_url,
        _replica(upstream_url, private_redis.url, prefix) as a,
        _replica(upstream_url, private_redis.url, prefix) as b,
        _replica(upstream_url, private_redis.url, prefix) as c,
    ):
        yield a, b, c
    assert_every_key_expires(private_redis.url, [prefix], scenario="tasks across replicas")


async def _settled(http: aiohttp.ClientSession, replica: Any, status: str) -> float:
    async with http.get(replica.metrics_url) as response:
        text = await response.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "mcp_sse_gateway_tasks_settled_total" and sample.labels == {
                "status": status
            }:
                return float(sample.value)
    return 0.0


def _compute(seconds: float) -> dict[str, Any]:
    return {"name": "slow_compute", "arguments": {"seconds": seconds, "label": "replicas"}}


async def test_a_task_is_polled_to_its_result_on_another_replica(private_redis: Any) -> None:
    async with _replicas(private_redis) as (a, b, _), aiohttp.ClientSession() as http:
        created = await mc.call(http, a.mcp_url, "tools/call", _compute(1.0))
        working = await mc.call(http, b.mcp_url, "tasks/get", {"taskId": created["taskId"]})
        assert working["status"] == "working"
        done = await mc.poll(http, b.mcp_url, created["taskId"])
    assert done["status"] == "completed"
    assert done["result"]["content"][0]["text"] == "Computed replicas in 1 s"


async def test_a_rolling_restart_lets_the_running_call_finish(private_redis: Any) -> None:
    async with _replicas(private_redis) as (a, b, _), aiohttp.ClientSession() as http:
        created = await mc.call(http, a.mcp_url, "tools/call", _compute(2.0))
        a.send_signal(signal.SIGTERM)  # a rolling restart: A drains
        done = await mc.poll(http, b.mcp_url, created["taskId"], timeout_s=DEADLINE_S)
        code = await asyncio.wait_for(a.wait(), DEADLINE_S)
    assert done["status"] == "completed"
    assert done["result"]["content"][0]["text"] == "Computed replicas in 2 s"
    assert code == 0


async def test_a_killed_replicas_task_fails_exactly_once(private_redis: Any) -> None:
    async with _replicas(private_redis) as (a, b, c), aiohttp.ClientSession() as http:
        created = await mc.call(http, a.mcp_url, "tools/call", _compute(60.0))
        task = {"taskId": created["taskId"]}
        a.kill()
        await a.wait()
        # Both remaining replicas poll at once until they see the end.
        seen = await asyncio.gather(
            *(mc.poll(http, r.mcp_url, created["taskId"]) for r in (b, c, b, c))
        )
        failures = [await _settled(http, r, "failed") for r in (b, c)]
        # Settled means settled: a cancellation afterwards changes nothing.
        assert await mc.call(http, c.mcp_url, "tasks/cancel", task) == {"resultType": "complete"}
        after = await mc.call(http, b.mcp_url, "tasks/get", task)
    assert {s["status"] for s in seen} == {"failed"}
    assert {s["error"]["code"] for s in seen} == {-32003}
    assert sum(failures) == 1
    assert after["status"] == "failed"
