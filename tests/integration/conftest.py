"""Fixtures of the integration tests: a scripted upstream and an HTTP client, both on loopback."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.support.scripted import DEADLINE_S, start_scripted


@pytest.fixture
async def upstream() -> Any:
    scripted, server = await start_scripted()
    yield scripted
    await server.close()


@pytest.fixture
async def http() -> Any:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=DEADLINE_S)) as session:
        yield session
