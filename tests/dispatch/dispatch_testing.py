"""Helpers of the dispatch tests: a client with test-friendly knobs that checks it settled."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from trioforward.dispatch import Client, open_client
from trioforward.sim import SimEngine

# No background probes unless a test asks; short backoffs so retries are quick.
FAST: dict[str, Any] = {"health_interval": 3600.0, "backoff_initial": 0.01, "backoff_max": 0.05}

COMPLETION = "/v1/completions"


def body(
    model: str = "sim-base", prompt: list[int] | None = None, max_tokens: int = 4, **extra: Any
) -> dict[str, Any]:
    return {"model": model, "prompt": prompt or [1, 2, 3], "max_tokens": max_tokens, **extra}


def assert_settled(client: Client) -> None:
    """No request holds capacity, a queue place or an upstream connection."""
    stats = client.statistics()
    assert stats.pool.active == 0, stats.pool
    assert stats.pool.connecting == 0, stats.pool
    assert stats.in_flight == 0 and stats.queued == 0, stats


@asynccontextmanager
async def client_for(*engines: SimEngine | str, **knobs: Any) -> AsyncIterator[Client]:
    """``open_client`` on ``engines`` with :data:`FAST` knobs; asserts settled at the end."""
    urls = [e if isinstance(e, str) else e.url for e in engines]
    async with open_client(engines=urls, **{**FAST, **knobs}) as client:
        yield client
        assert_settled(client)


def completions(engine: SimEngine) -> int:
    """Generation requests the engine received (engine-side attempt count)."""
    return engine.stats.by_path[COMPLETION]
