"""Fixtures for the simulated-engine tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from trioforward.sim import SimEngine, open_engine


@pytest.fixture
async def engine(fd_baseline: int) -> AsyncIterator[SimEngine]:
    """An instant engine with default options; fd leaks are checked."""
    async with open_engine() as e:
        yield e
