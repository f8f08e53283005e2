"""Fixtures: a simulated engine and the gateway in front of it (see gateway_harness.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from gateway_harness import Gateway, open_gateway, open_sim


@pytest.fixture
async def engine(fd_baseline: int) -> AsyncIterator[Any]:
    async with open_sim() as engine:
        yield engine


@pytest.fixture
async def gateway(engine: Any) -> AsyncIterator[Gateway]:
    async with open_gateway(engine.url) as gw:
        yield gw
        assert await gw.pool_active() == 0
