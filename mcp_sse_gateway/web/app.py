"""The composition root: build the aiohttp application from settings.

``create_app`` never reads the environment; the CLI builds the settings.
Injected arguments (store, metrics) override the defaults for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
from collections.abc import AsyncIterator

import structlog
from aiohttp import web

from mcp_sse_gateway.config import Settings
from mcp_sse_gateway.errors import ConfigError, StoreError
from mcp_sse_gateway.metrics import Metrics
from mcp_sse_gateway.store.base import EventStore
from mcp_sse_gateway.store.memory import MemoryStore
from mcp_sse_gateway.store.traced import traced_store
from mcp_sse_gateway.streams import StreamContext, Streams
from mcp_sse_gateway.streams.life import DRAINING
from mcp_sse_gateway.streams.registry import Registry
from mcp_sse_gateway.tracing import NO_TRACING, Tracing
from mcp_sse_gateway.web import relay
from mcp_sse_gateway.web.authz import Authorizer
from mcp_sse_gateway.web.keys import (
    AUTHORIZER,
    METRICS,
    REGISTRY,
    REPLICA_ID,
    SETTINGS,
    STATE,
    STORE,
    STREAMS,
    TRACING,
    UPSTREAM,
    GatewayState,
)
from mcp_sse_gateway.web.middleware import request_context, request_limit, request_span
from mcp_sse_gateway.web.upstream import HttpUpstream

log = structlog.get_logger("mcp_sse_gateway.app")

#: Client connections are closed over this many seconds on drain (at most a quarter of the
#: drain timeout).
DRAIN_SPREAD_S = 2.0
HEALTH_PATH = "/healthz"
READY_PATH = "/readyz"
METRICS_PATH = "/metrics"


def _default_store(settings: Settings, metrics: Metrics) -> EventStore:
    if settings.store.backend == "redis":
        from mcp_sse_gateway.store.redis import RedisStore  # noqa: PLC0415 - only when chosen

        store = RedisStore.from_settings(settings.store, observer=metrics.store_observer())
        metrics.store_queue_depth.set_function(lambda: store.queued)
        return store
    return MemoryStore.from_settings(settings.store)


def create_app(
    settings: Settings,
    *,
    store: EventStore | None = None,
    metrics: Metrics | None = None,
    tracing: Tracing = NO_TRACING,
) -> web.Application:
    """Build the gateway application.

    Args:
        settings: validated settings; ``upstream.url`` must be set.
        store: event store to use instead of the one ``settings.store`` describes.
        metrics: metrics registry to use instead of a new one.
        tracing: the tracer (:mod:`mcp_sse_gateway.otel` when the ``OTEL_*`` variables ask
            for one); off by default.

    Returns:
        The application: the MCP endpoint at ``server.path``, ``/healthz``, ``/readyz``,
        ``/metrics`` (when enabled), and every other path relayed to the upstream.

    Raises:
        ConfigError: ``upstream.url`` is missing, the store backend is unknown, or
            ``auth.jwks_file`` is not a usable key set.
    """
    if settings.upstream.url is None:
        raise ConfigError(
            "upstream.url is required (--upstream URL, [upstream] url, or env "
            "MCP_SSE_GATEWAY_UPSTREAM__URL)"
        )
    # The request's span is outermost: the log line and the error mapping happen inside it.
    middlewares = [request_span] if tracing.enabled else []
    app = web.Application(
        middlewares=[*middlewares, request_context, request_limit],
        client_max_size=settings.server.max_body_bytes,
    )
    app[SETTINGS] = settings
    app[TRACING] = tracing
    app[METRICS] = metrics if metrics is not None else Metrics()
    app[STORE] = traced_store(
        store if store is not None else _default_store(settings, app[METRICS]),
        tracing,
        settings.store.backend,
    )
    app[REGISTRY] = Registry()
    registry = app[REGISTRY]
    app[METRICS].pumps_active.labels("request").set_function(lambda: registry.request_pumps)
    app[METRICS].pumps_active.labels("standalone").set_function(lambda: registry.endless)
    app[STATE] = GatewayState(
        app[REGISTRY], requests_per_turn=settings.server.max_requests_per_turn
    )
    app[REPLICA_ID] = secrets.token_hex(8)
    app[UPSTREAM] = HttpUpstream(
        settings.upstream,
        app[METRICS].upstream_headers_seconds.observe,
        trace_configs=tracing.http_client_hooks(),
    )
    app[STREAMS] = Streams(
        StreamContext(
            store=app[STORE],
            upstream=app[UPSTREAM],
            registry=app[REGISTRY],
            settings=settings,
            metrics=app[METRICS],
            replica_id=app[REPLICA_ID],
            tracing=tracing,
        )
    )
    digest_key = settings.auth.digest_key
    try:
        authorizer = Authorizer(
            settings,
            app[STORE],
            app[METRICS],
            # The memory store lives and dies with this process: a random key is as good as any.
            digest_key.get_secret_value().encode() if digest_key else secrets.token_bytes(32),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    app[AUTHORIZER] = authorizer
    app.cleanup_ctx.append(_store_lifetime)
    app.cleanup_ctx.append(_heartbeat)
    app.cleanup_ctx.append(_upstream_client)
    app.cleanup_ctx.append(_registry_lifetime)
    app.on_shutdown.append(_start_drain)

    app.router.add_get(HEALTH_PATH, relay.health)
    app.router.add_get(READY_PATH, relay.ready)
    if settings.metrics.enabled:
        app.router.add_get(METRICS_PATH, relay.metrics)
    app.router.add_route("*", settings.server.path, relay.relay_mcp)
    app.router.add_route("*", "/{tail:.*}", relay.relay_other)
    return app


async def _upstream_client(app: web.Application) -> AsyncIterator[None]:
    upstream = app[UPSTREAM]
    upstream.start()
    app[AUTHORIZER].upstream = upstream
    try:
        yield
        await app[AUTHORIZER].close()
    finally:
        await upstream.close()


async def _registry_lifetime(app: web.Application) -> AsyncIterator[None]:
    """Pumps finish their upstream requests (up to the drain timeout), then are cancelled."""
    yield
    running = app[REGISTRY].tasks
    cancelled = await app[REGISTRY].close(app[SETTINGS].server.drain_timeout_s)
    if running:  # a drain before logged its own line already
        log.info("shutdown.pumps_stopped", cancelled=cancelled)


async def drain(app: web.Application, *, force: asyncio.Event | None = None) -> int:
    """Graceful drain (DESIGN D8), while the gateway still listens.

    Readiness goes false (load balancers stop sending new requests), attached client
    connections are closed with ``retry`` at jittered times, and request pumps get up to
    ``server.drain_timeout_s`` seconds to finish their upstream requests (or until *force* is
    set, e.g. by a second Ctrl-C). Idempotent.

    Returns:
        The number of pumps cancelled because the drain timeout passed or was forced.
    """
    if app[STATE].draining:
        return 0
    await _start_drain(app)
    registry = app[REGISTRY]
    timeout_s = app[SETTINGS].server.drain_timeout_s
    if registry.tasks:
        log.warning(
            "shutdown.waiting_for_pumps",
            pumps=registry.tasks,
            timeout_s=timeout_s,
            hint="interrupt again to stop now",
        )
    cancelled = await registry.close(timeout_s, force=force)
    log.info("shutdown.pumps_stopped", cancelled=cancelled)
    return cancelled


async def _heartbeat(app: web.Application) -> AsyncIterator[None]:
    """This replica's liveness key (DESIGN D7): written now, then every ``heartbeat_s``."""
    store, replica, metrics = app[STORE], app[REPLICA_ID], app[METRICS]
    period_s = app[SETTINGS].store.heartbeat_s
    loop = asyncio.get_running_loop()
    written_at = loop.time()
    metrics.heartbeat_age_seconds.set_function(lambda: loop.time() - written_at)

    async def write() -> bool:
        nonlocal written_at
        try:
            await store.heartbeat(replica)
        except StoreError:
            metrics.store_up.set(0)
            return False
        written_at = loop.time()
        metrics.store_up.set(1)
        return True

    async def beat() -> None:
        while True:
            if not await write():
                log.warning("store.heartbeat_failed")
            await asyncio.sleep(period_s)

    await write()
    task = asyncio.get_running_loop().create_task(beat(), name="replica.heartbeat")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _store_lifetime(app: web.Application) -> AsyncIterator[None]:
    yield
    await app[STORE].close()


async def _start_drain(app: web.Application) -> None:
    """Shutdown step one: readiness goes false so load balancers stop sending new requests."""
    if app[STATE].draining:
        return
    app[STATE].draining = True
    attachments = app[REGISTRY].attachments()
    log.info("shutdown.draining", connections=len(attachments), pumps=app[REGISTRY].tasks)
    # Close client connections at jittered times so their reconnections do not arrive as one
    # storm at the other replicas.
    spread_s = min(app[SETTINGS].server.drain_timeout_s / 4, DRAIN_SPREAD_S)
    for attachment in attachments:
        asyncio.get_running_loop().call_later(
            random.uniform(0, spread_s),  # noqa: S311 - jitter, not a secret
            attachment.stop,
            DRAINING,
        )
    if attachments:
        await asyncio.sleep(spread_s)
