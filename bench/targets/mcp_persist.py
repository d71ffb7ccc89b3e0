"""``mcp-persist``: the mcp-persist PyPI package's proxy, Redis backend (the closest peer).

mcp-persist (MIT, https://pypi.org/project/mcp-persist/) ships ``PersistenceProxy``, an ASGI app
served by uvicorn that fronts a Streamable HTTP MCP server and makes its SSE streams resumable:
it parses every upstream SSE event, validates it as a JSON-RPC message, writes it to its event
store (one ``EVALSHA`` per event on Redis: ``INCR`` of a global counter, an ``event:<id>`` hash
of stream id + payload, a ``stream:<session>:<request id>`` sorted set) and only then forwards
it to the client with that counter value as the SSE ``id`` (``1``, ``2``, ...: one counter for
all sessions). The upstream stream is read to its end even when the client has gone. A ``GET``
with ``Last-Event-ID`` first opens the session's standalone stream upstream, then replays what
Redis holds of the event's stream *at that moment* and continues with the live standalone
stream: events of a POST stream stored after the replay are not sent on it, so a resume is
complete only once the upstream stream has ended (and been stored), and the resumed response
never ends by itself (it is the standalone stream). Two more limits (mcp-persist 2.2.0,
``proxy.py``): while the proxy holds a live standalone GET stream for the session (opened by a
client's ``GET`` or by an earlier resume; kept while the upstream keeps it open, plus 60 s), a
resume of a POST stream replays nothing (logged as "blocked cross-stream replay"); and an
upstream that answers ``GET`` with 405 makes every resume a 405 (nothing replayed). So a fair
replay measurement resumes each stream once, on a session without a standalone stream, after
the stream is stored, against an upstream that serves ``GET``. :func:`stream_length` and
:func:`events_stored` read Redis to know when a stream is fully stored.

It runs from ``bench/.venv-peer`` (``bench/setup_baselines.sh``), never the project's venv. The
launcher below is the package's own CLI, ``mcp-persist-proxy --upstream U --backend redis --url
R --ttl 3600 --host 127.0.0.1 --port P``, with these differences, all for a fair measurement:

* no access log and log level ``warning`` (the CLI hard-codes uvicorn's ``info`` with an access
  line per request, which the gateway does not pay for);
* an upstream connection pool without a cap (the CLI's httpx2 client keeps httpx's default of
  100 connections, 20 of them kept alive: more than 100 concurrent streams would queue in the
  peer, not in the measured code; the gateway has no cap either);
* the listening socket is bound to port 0 before uvicorn starts and announced on stdout
  (``LISTENING <url>``), so there is no free-port race;
* uvicorn's ``http="auto"`` (httptools, installed by the setup script) on the stock asyncio
  loop, like the gateway (aiohttp's C parser, stock loop); no uvloop;
* a 2 s graceful shutdown, so stopping is quick even with streams open.

The store is built by mcp-persist itself (``build_store_context("redis", url, ttl=3600)``: the
store ``--backend redis --url R --ttl 3600`` makes), on a private redis-server (no
persistence) whose CPU counts as the target's. One proxy process, like the gateway.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

from bench.procs import ROOT, StartError, child_env, child_process, read_announcement
from bench.targets.base import Running
from bench.targets.gateway import available_redis, redis_server

NAME = "mcp-persist"
RESUMABLE = True
DESCRIPTION = "mcp-persist 2.2.0 PersistenceProxy, Redis event store (own redis-server)"

#: The version setup_baselines.sh installs and this target was checked with.
TESTED_VERSION = "2.2.0"
PEER_VENV = ROOT / "bench" / ".venv-peer"
PEER_PYTHON = PEER_VENV / "bin" / "python"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
#: Seconds stored events live in Redis (the CLI's --ttl; without one the store warns).
EVENT_TTL_S = 3600
#: mcp-persist's Redis key prefix (RedisEventStore's default; the CLI has no option for it).
KEY_PREFIX = "mcp:"
ANNOUNCEMENT = "LISTENING "
CONFIG_LINE = "CONFIG "

#: Run with the peer venv's interpreter: argv = upstream base, MCP path, Redis URL, ttl.
LAUNCHER = r"""
import asyncio, json, socket, sys

import httpx2 as httpx
import uvicorn
from importlib.metadata import version
from mcp_persist import PersistenceProxy
from mcp_persist.config import build_store_context

upstream, path, redis_url, ttl = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])


class Server(uvicorn.Server):
    def __init__(self, config, url):
        super().__init__(config)
        self.url = url

    async def startup(self, sockets=None):
        await super().startup(sockets)
        if self.started:
            print("LISTENING " + self.url, flush=True)


async def main():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)
    port = sock.getsockname()[1]
    client = httpx.AsyncClient(
        timeout=httpx.Timeout(300.0, read=None),
        follow_redirects=True,
        limits=httpx.Limits(
            max_connections=None, max_keepalive_connections=None, keepalive_expiry=15.0
        ),
    )
    async with build_store_context("redis", redis_url, ttl=ttl) as store:
        proxy = PersistenceProxy(upstream, store, mcp_path=path, client=client)
        config = uvicorn.Config(
            proxy, http="auto", lifespan="on", log_level="warning", access_log=False,
            timeout_graceful_shutdown=2, backlog=4096,
        )
        config.load()
        facts = {name: version(name) for name in ("mcp-persist", "mcp", "uvicorn")}
        facts["http"] = config.http_protocol_class.__name__
        facts["loop"] = type(asyncio.get_running_loop()).__module__
        facts["store"] = type(store).__name__
        print("CONFIG " + json.dumps(facts), flush=True)
        try:
            await Server(config, f"http://127.0.0.1:{port}{path}").serve(sockets=[sock])
        finally:
            await proxy.close_all()
            sock.close()


asyncio.run(main())
"""


async def stream_length(redis_url: str, session_id: str, request_id: str | int) -> int:
    """How many events mcp-persist has stored for the POST stream of *request_id* (ZCARD)."""
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        return int(await client.zcard(f"{KEY_PREFIX}stream:{session_id}:{request_id}"))
    finally:
        await client.aclose()


async def events_stored(redis_url: str) -> int:
    """Events mcp-persist has stored so far, all streams (its global id counter)."""
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        return int(await client.get(f"{KEY_PREFIX}counter") or 0)
    finally:
        await client.aclose()


def peer_version() -> str | None:
    """mcp-persist's version in the peer venv, or None when it (or the venv) is missing."""
    if not PEER_PYTHON.exists():
        return None
    probe = subprocess.run(
        [
            str(PEER_PYTHON),
            "-c",
            "import importlib.metadata as m, mcp_persist.proxy, redis.asyncio, uvicorn, httpx2;"
            "print(m.version('mcp-persist'))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return probe.stdout.strip() if probe.returncode == 0 else None


def available() -> str | None:
    if not PEER_PYTHON.exists():
        return "bench/.venv-peer missing (run bench/setup_baselines.sh)"
    found = peer_version()
    if found is None:
        return "mcp-persist not importable in bench/.venv-peer (run bench/setup_baselines.sh)"
    if found != TESTED_VERSION:
        return (
            f"bench/.venv-peer has mcp-persist {found}, not {TESTED_VERSION} "
            "(run bench/setup_baselines.sh)"
        )
    return available_redis()


@contextlib.asynccontextmanager
async def start(upstream_url: str, *, workdir: Path) -> AsyncIterator[Running]:
    parts = urlsplit(upstream_url)
    if not parts.scheme or not parts.netloc:
        raise ValueError(f"mcp-persist target needs an absolute upstream URL, got {upstream_url!r}")
    upstream_base = f"{parts.scheme}://{parts.netloc}"
    path = parts.path or "/mcp"
    if not PEER_PYTHON.exists():
        raise StartError("bench/.venv-peer missing (run bench/setup_baselines.sh)")
    async with redis_server(workdir) as (redis_child, redis_url):
        argv = [str(PEER_PYTHON), "-c", LAUNCHER, upstream_base, path, redis_url, str(EVENT_TTL_S)]
        env = child_env({"PYTHONUNBUFFERED": "1"})
        env.pop("PYTHONPATH", None)  # the peer venv sees only its own packages
        async with child_process(
            f"mcp-persist-{redis_url.rsplit(':', 1)[1].split('/')[0]}",
            argv,
            workdir=workdir,
            env=env,
            stop_timeout_s=STOP_TIMEOUT_S,
        ) as child:
            url = await read_announcement(child, ANNOUNCEMENT, START_TIMEOUT_S)
            config = await read_announcement(child, CONFIG_LINE, START_TIMEOUT_S)
            yield Running(
                name=NAME,
                url=url,
                pids=[child.pid, redis_child.pid],
                redis_url=redis_url,
                notes=[
                    f"mcp-persist: {', '.join(f'{k} {v}' for k, v in json.loads(config).items())}"
                ],
            )
