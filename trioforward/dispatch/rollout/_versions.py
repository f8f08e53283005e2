"""One weight version across the engines: an engine that may run other weights takes no work.

docs/operations.md, "One weight version across the engines". Once a version was
recorded (``resume(weight_version=V)``), an engine that is **added**, or
**re-admitted** after an ejection, is *held out* — no new dispatch, its
requests wait in QUEUED as behind a pause, charged to no budget — until it
reports V itself, asked on the control pool every ``health_interval``:

| kind | asked | source |
|---|---|---|
| ``vllm`` (dev mode) | ``GET /weight_info`` → ``{"weight_version"}`` | ``vllm/entrypoints/rl/online/api_router.py`` |
| ``sglang`` | ``GET /model_info`` → ``"weight_version"`` | ``srt/entrypoints/http_server.py`` |
| ``none`` | nothing: it stays out until the operator confirms V (``confirm``) | |

A resume that fails on an engine leaves that engine held out as well (it may
still run the old weights). With no version ever recorded nothing is held.
Per request nothing is added: a held engine is simply not eligible (``_engines.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson
import trio

from trioforward.dispatch.engines._engines import Engine, Registry
from trioforward.dispatch.rollout._engine_control import EngineControl, EngineControlError
from trioforward.http import ConnectionPool, PoolError

__all__ = ["VersionGate"]

log = logging.getLogger("trioforward.dispatch")


class VersionGate:
    """Holds engines out until they report the recorded weight version (see the module)."""

    def __init__(
        self,
        registry: Registry,
        control: EngineControl,
        pool: ConnectionPool,
        required: Callable[[], str | None],
        start_soon: Callable[..., Any],
        interval: float,
        timeout: float,
    ) -> None:
        self._registry = registry
        self._control = control
        self._pool = pool
        self._required = required
        self._start_soon = start_soon
        self._interval = interval if interval > 0 else 5.0
        self._timeout = timeout

    def hold(self, engine: Engine, why: str) -> None:
        """Hold ``engine`` out (``why`` is shown by ``GET /admin/engines``) if a
        version is recorded, and ask it for its version until it reports it."""
        version = self._required()
        if version is None or engine.removed:
            return
        already = engine.held_out is not None
        self._registry.set_held(engine, f"{why}; waiting until it reports weight version {version}")
        log.info("engine %s held out: %s", engine.url, engine.held_out)
        if not already:
            self._start_soon(self._watch, engine)

    def confirm(self, engine: Engine, version: str) -> bool:
        """The operator says ``engine`` runs ``version``: released if that is the
        recorded one (True), else it stays as it is (False)."""
        if version != self._required():
            return False
        engine.reported_version = version
        self._release(engine)
        return True

    def resumed(self, engine: Engine, version: str | None) -> None:
        """``engine`` was resumed and told ``version`` (its own report follows)."""
        if version is not None:
            engine.reported_version = version
            self._release(engine)

    def recheck(self) -> None:
        """A new version was recorded: engines held for an older one are asked again
        (their watch does it at its next turn)."""
        version = self._required()
        for engine in self._registry.engines:
            if engine.held_out is not None and engine.reported_version == version:
                self._release(engine)

    def _release(self, engine: Engine) -> None:
        if engine.held_out is not None:
            log.info("engine %s reports weight version %s: taking work", engine.url, engine.reported_version)
            self._registry.set_held(engine, None)

    async def _watch(self, engine: Engine) -> None:
        while engine.held_out is not None and not engine.removed:
            version = self._required()
            reported = await self.report(engine)
            if reported is not None:
                engine.reported_version = reported
            if version is not None and reported == version:
                self._release(engine)
                return
            if reported is None and engine.held_out is not None and "cannot report" not in engine.held_out:
                kind = await self._kind(engine)
                if kind == "none":
                    self._registry.set_held(
                        engine,
                        f"cannot report its weight version: confirm with POST /admin/engines"
                        f' {{"url", "weight_version": "{version}"}}',
                    )
            await trio.sleep(self._interval)

    async def _kind(self, engine: Engine) -> str:
        try:
            return await self._control.kind(engine.url)
        except EngineControlError:
            return "?"

    async def report(self, engine: Engine) -> str | None:
        """The weight version ``engine`` reports, or ``None`` (cannot, or did not answer)."""
        kind = await self._kind(engine)
        path = {"vllm": "/weight_info", "sglang": "/model_info"}.get(kind)
        if path is None:
            return None
        try:
            response = await self._pool.request(
                "GET", engine.url + path, deadline=trio.current_time() + self._timeout
            )
            doc = orjson.loads(response.content) if response.status == 200 else None
        except (PoolError, orjson.JSONDecodeError):
            return None
        value = doc.get("weight_version") if isinstance(doc, dict) else None
        return value if isinstance(value, str) else None
