"""Fixtures shared by every test: clean global state, and a gateway factory."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import structlog

from mcp_sse_gateway.config import ENV_PREFIX, Settings
from mcp_sse_gateway.server import RunningGateway, run_gateway


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


def make_settings(upstream_url: str, **sections: dict[str, Any]) -> Settings:
    """Settings for a test gateway on a free loopback port in front of *upstream_url*."""
    data: dict[str, Any] = {
        "upstream": {"url": upstream_url},
        "server": {"port": 0, "drain_timeout_s": 2},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return Settings(**data)


GatewayFactory = Callable[..., contextlib.AbstractAsyncContextManager[RunningGateway]]


@pytest.fixture
def gateway() -> GatewayFactory:
    """``async with gateway(upstream_url, server={...}, sse={...}) as gw:`` runs a real gateway."""

    @contextlib.asynccontextmanager
    async def factory(
        upstream_url: str, **sections: dict[str, Any]
    ) -> AsyncIterator[RunningGateway]:
        async with run_gateway(make_settings(upstream_url, **sections)) as running:
            yield running

    return factory
