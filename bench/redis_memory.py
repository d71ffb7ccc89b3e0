"""Redis memory per stored event: ``used_memory`` before and after appending N events.

Run: ``python bench/redis_memory.py`` (starts its own ``redis-server`` on a free loopback port,
without persistence; about 10 s). Prints bytes of Redis memory per event for 200-byte-ish
JSON-RPC notifications, in one stream and spread over ten.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import tempfile
import time

import redis.asyncio as aioredis

from mcp_sse_gateway.event_ids import new_life
from mcp_sse_gateway.store.redis import RedisStore

EVENTS = 20_000
START_DEADLINE_S = 10.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _wait_ready(client: aioredis.Redis) -> None:
    deadline = time.monotonic() + START_DEADLINE_S
    while True:
        try:
            await client.ping()
        except aioredis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.02)
        else:
            return


async def main() -> None:
    port = _free_port()
    with tempfile.TemporaryDirectory() as workdir:
        server = subprocess.Popen(  # noqa: ASYNC220 - started once, before any load
            [
                *("redis-server", "--port", str(port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--dir", workdir),
            ],
            stdout=subprocess.DEVNULL,
        )
        admin = aioredis.Redis(port=port)
        try:
            await _wait_ready(admin)
            store = RedisStore.from_url(f"redis://127.0.0.1:{port}/0", max_events_per_stream=EVENTS)
            await store.record_session("s", "2025-11-25")
            message = {
                "jsonrpc": "2.0",
                "method": "notifications/message",
                "params": {"level": "info", "data": "x" * 120},
            }
            data = json.dumps(message)
            print(f"{'streams':>8} {'event bytes':>12} {'Redis bytes/event':>18}")
            for streams in (1, 10):
                await admin.execute_command("MEMORY", "PURGE")
                before = (await admin.info("memory"))["used_memory"]
                for _ in range(streams):
                    life = new_life()
                    await store.create_stream("s", life, kind="request", owner="bench")
                    for _ in range(EVENTS // streams):
                        await store.append("s", life, data, None)
                after = (await admin.info("memory"))["used_memory"]
                print(f"{streams:>8} {len(data):>12} {(after - before) / EVENTS:>18.1f}")
            await store.close()
        finally:
            await admin.aclose()
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    asyncio.run(main())
