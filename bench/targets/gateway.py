"""``gateway-memory`` and ``gateway-redis``: mcp-sse-gateway, started with its CLI.

``python -m mcp_sse_gateway serve --upstream URL --host 127.0.0.1 --port N`` with settings from
``MCP_SSE_GATEWAY_*`` variables: log level ``warning`` (JSON, to a log file in the work
directory), a 2 s drain so stopping is quick, and otherwise the defaults of
``config.example.toml`` (the store's bounds, keepalive, slow-reader cut). The Redis variant
starts a redis-server of its own on a free loopback port, without persistence
(``--save '' --appendonly no``); its CPU counts as the target's.

Readiness is ``/readyz`` answering 200 (the store answers too), polled with a deadline.
"""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from bench.procs import (
    Child,
    StartError,
    child_env,
    child_process,
    free_port,
    http_get,
    python,
    wait_until,
)
from bench.targets.base import Running

RESUMABLE = True
START_TIMEOUT_S = 30.0
PORT_ATTEMPTS = 3
#: Settings for benchmarking: quiet logs; everything else as shipped.
GATEWAY_ENV = {
    "MCP_SSE_GATEWAY_LOGGING__LEVEL": "warning",
    "MCP_SSE_GATEWAY_LOGGING__FORMAT": "json",
    "MCP_SSE_GATEWAY_SERVER__DRAIN_TIMEOUT_S": "2",
}
DESCRIPTIONS = {
    "gateway-memory": "mcp-sse-gateway, memory store",
    "gateway-redis": "mcp-sse-gateway, Redis Streams store (own redis-server, no persistence)",
}


def available() -> str | None:
    return None


def available_redis() -> str | None:
    if shutil.which("redis-server") is None:
        return "redis-server not installed"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "the redis Python package is missing"
    return None


@contextlib.asynccontextmanager
async def redis_server(workdir: Path) -> AsyncIterator[tuple[Child, str]]:
    """A redis-server on a free loopback port, no persistence; yields it and its URL."""
    import redis.asyncio

    for attempt in range(PORT_ATTEMPTS):
        port = free_port()
        argv = [
            "redis-server",
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(workdir),
            "--maxclients", "10000",
        ]  # fmt: skip
        url = f"redis://127.0.0.1:{port}/0"
        async with child_process(f"redis-{port}", argv, workdir=workdir) as child:
            client = redis.asyncio.Redis.from_url(url)
            try:

                async def pong(client: redis.asyncio.Redis = client) -> bool:
                    try:
                        return bool(await client.ping())
                    except redis.exceptions.ConnectionError:
                        return False

                try:
                    await wait_until(pong, timeout_s=START_TIMEOUT_S, what="PING", alive=child)
                except StartError:
                    if attempt + 1 < PORT_ATTEMPTS and child.process.returncode is not None:
                        continue  # the port was taken in between: try another
                    raise
            finally:
                await client.aclose()
            yield child, url
            return


@contextlib.asynccontextmanager
async def gateway_process(
    name: str, upstream_url: str, *, workdir: Path, env: dict[str, str]
) -> AsyncIterator[tuple[Child, str]]:
    """The gateway CLI on a free loopback port; yields it once /readyz answers 200."""
    for attempt in range(PORT_ATTEMPTS):
        port = free_port()
        argv = [
            python(), "-m", "mcp_sse_gateway", "serve",
            "--upstream", upstream_url, "--host", "127.0.0.1", "--port", str(port),
        ]  # fmt: skip
        async with child_process(
            f"{name}-{port}", argv, workdir=workdir, env=child_env({**GATEWAY_ENV, **env})
        ) as child:

            async def ready(port: int = port) -> bool:
                status, _ = await http_get("127.0.0.1", port, "/readyz")
                return status == 200

            try:
                await wait_until(ready, timeout_s=START_TIMEOUT_S, what="/readyz", alive=child)
            except StartError:
                if attempt + 1 < PORT_ATTEMPTS and child.process.returncode is not None:
                    continue
                raise
            yield child, f"http://127.0.0.1:{port}"
            return


@contextlib.asynccontextmanager
async def start(upstream_url: str, *, workdir: Path) -> AsyncIterator[Running]:
    env = {"MCP_SSE_GATEWAY_STORE__BACKEND": "memory"}
    async with gateway_process("gateway-memory", upstream_url, workdir=workdir, env=env) as (
        child,
        base,
    ):
        yield Running(
            name="gateway-memory",
            url=f"{base}/mcp",
            pids=[child.pid],
            metrics_url=f"{base}/metrics",
        )


@contextlib.asynccontextmanager
async def start_redis(upstream_url: str, *, workdir: Path) -> AsyncIterator[Running]:
    async with redis_server(workdir) as (redis_child, redis_url):
        env = {
            "MCP_SSE_GATEWAY_STORE__BACKEND": "redis",
            "MCP_SSE_GATEWAY_STORE__REDIS_URL": redis_url,
            "MCP_SSE_GATEWAY_STORE__KEY_PREFIX": f"bench-{uuid.uuid4().hex[:8]}",
            # Shared by replicas in production; any secret of 16+ characters here.
            "MCP_SSE_GATEWAY_AUTH__DIGEST_KEY": uuid.uuid4().hex,
        }
        async with gateway_process("gateway-redis", upstream_url, workdir=workdir, env=env) as (
            child,
            base,
        ):
            yield Running(
                name="gateway-redis",
                url=f"{base}/mcp",
                pids=[child.pid, redis_child.pid],
                redis_url=redis_url,
                metrics_url=f"{base}/metrics",
            )


TARGETS = {
    "gateway-memory": (available, start),
    "gateway-redis": (available_redis, start_redis),
}
