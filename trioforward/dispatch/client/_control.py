"""Control calls: engine requests that are not generations (docs/semantics.md,
"Which path each engine call takes").

A control call — a model listing, a health probe, an adapter load — is answered
from the side: the client's control pool (unlimited connections), bounded by its
own short timeout, never behind an engine's capacity queue or the weight-update
pause. A gateway whose engines are saturated or paused still answers "which
models are there?" at once.
"""

from __future__ import annotations

from typing import Any

import orjson
import trio

from trioforward.dispatch.engines._engines import Engine
from trioforward.http import ConnectionPool, PoolError

__all__ = ["engine_models"]


async def engine_models(
    engines: list[Engine], pool: ConnectionPool, answer_within: float
) -> list[dict[str, Any]]:
    """``GET /v1/models`` of every engine at once, each within ``answer_within`` seconds.

    Returns the model objects (dicts with at least ``"id"``) in engine order, an
    engine's models together; an engine that does not answer 200 with a JSON
    ``{"data": [...]}`` in time is left out. Never raises for an engine's fault.
    """
    answers: list[list[dict[str, Any]]] = [[] for _ in engines]

    async def one(i: int, engine: Engine) -> None:
        try:
            response = await pool.request(
                "GET", engine.url + "/v1/models", deadline=trio.current_time() + answer_within
            )
        except PoolError:
            return
        if response.status != 200:
            return
        try:
            data = orjson.loads(response.content).get("data", [])
        except (orjson.JSONDecodeError, AttributeError):
            return
        if isinstance(data, list):
            answers[i] = [m for m in data if isinstance(m, dict) and "id" in m]

    async with trio.open_nursery() as nursery:
        for i, engine in enumerate(engines):
            nursery.start_soon(one, i, engine)
    return [model for models in answers for model in models]
