"""Fixtures shared by every test: clean global state, and a gateway factory."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import structlog

from mcp_sse_gateway.config import ENV_PREFIX, Settings
from mcp_sse_gateway.server import RunningGateway, run_gateway
from tests.support.ports import free_port
from tests.support.processes import stop_popen
from tests.support.redis_server import redis_server_command


@pytest.fixture(autouse=True)
def _clean_environ(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No MCP_SSE_GATEWAY_* variable of the caller's shell leaks into a test."""
    import os

    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()


@pytest.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, object]]]:
    """What reaches the event loop's exception handler during the test (callbacks that raised,
    futures and tasks whose exception nobody retrieved)."""
    import asyncio

    loop = asyncio.get_running_loop()
    errors: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    yield errors
    loop.set_exception_handler(previous)


#: The ``auth.digest_key`` of test gateways on Redis (every replica of a test shares it).
TEST_DIGEST_KEY = "test-digest-key-0123456789abcdef"


def make_settings(upstream_url: str, **sections: dict[str, Any]) -> Settings:
    """Settings for a test gateway on a free loopback port in front of *upstream_url*."""
    data: dict[str, Any] = {
        "upstream": {"url": upstream_url},
        "server": {"port": 0, "drain_timeout_s": 2},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    if data.get("store", {}).get("backend") == "redis":
        # Replicas on one Redis share the credential digest key (DESIGN D8).
        data.setdefault("auth", {}).setdefault("digest_key", TEST_DIGEST_KEY)
    return Settings(**data)


GatewayFactory = Callable[..., contextlib.AbstractAsyncContextManager[RunningGateway]]


#: ``GATEWAY_TEST_STORE=redis`` runs every gateway of the integration tests on a real
#: redis-server instead of the memory store (``.ci/run`` runs those tests both ways).
STORE_UNDER_TEST = "GATEWAY_TEST_STORE"


@pytest.fixture
def gateway(request: pytest.FixtureRequest) -> Iterator[GatewayFactory]:
    """``async with gateway(upstream_url, server={...}, sse={...}) as gw:`` runs a real gateway.

    On Redis (``GATEWAY_TEST_STORE=redis``), the test's teardown checks that every key its
    gateways wrote has a TTL: ``SCAN MATCH <prefix>*`` over their key prefixes, once every
    gateway has shut down (pumps drained or cancelled, store closed).
    """
    import os

    from tests.support.redis_keys import assert_every_key_expires, redis_store

    redis_url: str | None = None
    if os.environ.get(STORE_UNDER_TEST) == "redis":
        redis_url = request.getfixturevalue("redis_server")
    # Key prefixes of this test's gateways on the shared redis-server, and how many still run.
    prefixes: list[str] = []
    running_gateways = 0

    @contextlib.asynccontextmanager
    async def factory(
        upstream_url: str, **sections: dict[str, Any]
    ) -> AsyncIterator[RunningGateway]:
        nonlocal running_gateways
        if redis_url is not None and "backend" not in sections.get("store", {}):
            # A key prefix of its own: tests never see each other's sessions or streams.
            store = redis_store(redis_url)
            sections = {**sections, "store": {**store, **sections.get("store", {})}}
        settings = make_settings(upstream_url, **sections)
        store_settings = settings.store
        if (
            redis_url is not None
            and store_settings.backend == "redis"
            and store_settings.redis_url is not None
            and store_settings.redis_url.get_secret_value() == redis_url
        ):
            prefixes.append(store_settings.key_prefix)
        running_gateways += 1
        try:
            async with run_gateway(settings) as running:
                yield running
        finally:
            # run_gateway has returned: the app's cleanup ran (pumps done, store closed).
            running_gateways -= 1

    yield factory

    if redis_url is not None and prefixes:
        assert running_gateways == 0, (
            f"{running_gateways} gateway(s) still running at teardown: "
            "cannot check their Redis keys' TTLs (exit every `async with gateway(...)`)"
        )
        assert_every_key_expires(redis_url, prefixes, scenario=request.node.nodeid)


# A real redis-server for the store tests (DESIGN D7) ---------------------------------------------

#: Starting a redis-server and answering PING takes milliseconds; this bounds a broken start.
REDIS_START_DEADLINE_S = 10.0
REDIS_STOP_DEADLINE_S = 10.0


class RedisServerProcess:
    """A private ``redis-server`` on a loopback port, without persistence; restartable.

    ``stop()`` then ``start()`` brings it back on the same port with an empty data set, as a
    Redis restart without persistence does. *extra_args* are appended to the command line
    (e.g. ``["--user", "app", "on", ">secret", "~*", "&*", "+@all"]``).
    """

    def __init__(self, executable: str, extra_args: list[str] | None = None) -> None:
        self.executable = executable
        self.extra_args = extra_args or []
        self.port = free_port()
        self._process: Any = None
        self._tmp: Any = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        """The running server's process id (for SIGSTOP / SIGCONT)."""
        return int(self._process.pid)

    def start(self) -> None:
        import subprocess
        import tempfile
        import time

        import redis

        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="redis-test-")
        self._process = subprocess.Popen(
            redis_server_command(self.executable, self.port, self._tmp.name, *self.extra_args),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + REDIS_START_DEADLINE_S
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        probe = redis.Redis(
            host="127.0.0.1",
            port=self.port,
            socket_connect_timeout=0.5,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            while True:
                if self._process.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self._process.returncode}")
                try:
                    probe.ping()
                    return
                except redis.AuthenticationError:
                    return  # up, and protected by the ACL the caller configured
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)  # polling a condition with a deadline
        finally:
            probe.close()

    def stop(self) -> None:
        if self._process is None:
            return
        stop_popen(self._process, REDIS_STOP_DEADLINE_S)
        self._process = None

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def redis_server_executable() -> str:
    """The ``redis-server`` to run; skips the test without one (fails when ``$CI`` is set)."""
    import os
    import shutil

    executable = shutil.which("redis-server")
    if executable is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed (required when CI is set)")
        pytest.skip("redis-server is not installed")
    return executable


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """URL of a Redis shared by the session's tests: ``$REDIS_URL``, else a private server.

    The private one listens on a free loopback port, without persistence, and is terminated at
    the end of the session. Tests flush its database before use (see tests/store/conftest.py),
    so ``$REDIS_URL`` must name a disposable database.
    """
    import os

    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    server = RedisServerProcess(redis_server_executable())
    try:
        server.start()
        yield server.url
    finally:
        server.close()


@pytest.fixture
def private_redis() -> Iterator[RedisServerProcess]:
    """A redis-server of this test only (it may stop and restart it)."""
    server = RedisServerProcess(redis_server_executable())
    try:
        server.start()
        yield server
    finally:
        server.close()
