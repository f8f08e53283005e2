"""Control calls fanned out to many engines at once on the client's control pool
(never behind generations or the pause gate), each engine's result kept: what
the weight pushes of the engines' own routes and ``/admin/resume
{"flush_cache": true}`` are made of (docs/operations.md, "The whole update
through the gateway")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import trio

from trioforward.dispatch import EngineInfo
from trioforward.errors import EngineControlError
from trioforward.server.base._state import GatewayState

__all__ = ["EngineResult", "FLUSH_PATHS", "engines_of", "fan_out", "flush_prefix_caches", "kinds_known"]

#: Each kind's prefix-cache reset (vLLM 0.32 ``POST /reset_prefix_cache``, SGLang
#: 0.5.23 ``POST /flush_cache``): what ``/admin/resume {"flush_cache": true}`` calls.
FLUSH_PATHS = {"vllm": "/reset_prefix_cache", "sglang": "/flush_cache"}


@dataclass(frozen=True, slots=True)
class EngineResult:
    """One engine's answer to a fanned-out call: its HTTP status (0: not reached)
    and its parsed body (JSON, text, or the reason it was not reached)."""

    engine: str
    status: int
    body: Any

    @property
    def ok(self) -> bool:
        # SGLang answers a refused load 400 {"success": false}; a 200 with
        # success false is counted as refused too.
        refused = isinstance(self.body, dict) and self.body.get("success") is False
        return 200 <= self.status < 300 and not refused

    def to_json(self) -> dict[str, Any]:
        return {"engine": self.engine, "status": self.status, "success": self.ok, "answer": self.body}


def engines_of(state: GatewayState, kind: str) -> list[EngineInfo]:
    """The registered engines of ``kind`` (``vllm`` or ``sglang``), in registry order."""
    return [e for e in state.client.engines.list() if e.kind == kind]


async def kinds_known(state: GatewayState) -> None:
    """Wait, at most ``health_timeout`` seconds, until every registered engine's
    kind is known (detected once after it is added: docs/operations.md, "Engine
    kinds"), so that a control call made right after startup reaches every
    engine of its kind. One still unknown then is left out of the call."""
    engines = state.client.engines
    with trio.move_on_after(state.settings.health_timeout):
        for info in engines.list():
            if info.kind is None:
                await engines.wait_kind(info.url)


async def fan_out(
    state: GatewayState, urls: list[str], method: str, path: str, body: Any, seconds: float | None = None
) -> list[EngineResult]:
    """``method path`` with JSON ``body`` to every one of ``urls`` at once; the
    results in the order of ``urls``. Never raises for one engine: an engine not
    reached is a result with status 0."""
    control = state.client.weights.control
    results: dict[str, EngineResult] = {}

    async def one(url: str) -> None:
        try:
            status, answer = await control.call(url, method, path, body, seconds)
        except EngineControlError as exc:
            status, answer = 0, str(exc)
        results[url] = EngineResult(url, status, answer)

    async with trio.open_nursery() as nursery:
        for url in urls:
            nursery.start_soon(one, url)
    return [results[url] for url in urls]


async def flush_prefix_caches(state: GatewayState, urls: list[str] | None) -> list[EngineResult]:
    """Reset the prefix cache of every engine among ``urls`` (all if ``None``) whose
    kind has a reset (:data:`FLUSH_PATHS`), at once: KV computed under the old
    weights must not serve the new ones (docs/operations.md, "The whole update
    through the gateway"). Never raises for one engine; results in registry order."""
    await kinds_known(state)
    wanted = None if urls is None else set(urls)
    by_path: dict[str, list[str]] = {}
    for info in state.client.engines.list():
        path = FLUSH_PATHS.get(info.kind or "")
        if path is not None and (wanted is None or info.url in wanted):
            by_path.setdefault(path, []).append(info.url)
    results: list[EngineResult] = []
    for path, engines in by_path.items():
        results += await fan_out(state, engines, "POST", path, None)
    return results
