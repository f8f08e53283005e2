"""Weight-update calls to one engine, by engine kind: pause, resume, weight version.

Sent on the client's control pool (its own connections, never queued behind
generations or the dispatch pause gate), each under ``engine_control_timeout``
(a pause in mode ``wait`` under ``dispatch_timeout``: it answers once the
engine's running requests finished). docs/operations.md, "Engine kinds".

| kind | pause | resume | weight version |
|---|---|---|---|
| ``vllm`` | ``POST /pause?mode=keep|wait|abort`` | ``POST /resume`` | ``POST /update_weight_version {"new_version"}`` |
| ``sglang`` | ``POST /pause_generation {"mode": "in_place"|"retract"|"abort"}`` | ``POST /continue_generation`` | ``POST /update_weight_version {"new_version", "abort_all_requests": false}`` |
| ``none`` | — (gate only) | — | — |

Sources: vLLM 0.32 ``vllm/entrypoints/rl/online/api_router.py`` (served with
``VLLM_SERVER_DEV_MODE=1``); SGLang ``http_server.py`` and
``io_struct.PauseGenerationReqInput`` / ``UpdateWeightVersionReqInput`` (whose
``abort_all_requests`` defaults to true, so it is always sent).

The kind is configured (``engine_kind``) or, with ``auto``, detected once per
engine at its first pause: ``GET /is_paused`` answering ``{"is_paused": ...}``
is vLLM in dev mode; ``GET /get_weight_version`` answering 200 is SGLang;
anything else is ``none``.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import orjson
import trio

from trioforward.errors import EngineControlError
from trioforward.http import ConnectionPool, PoolError

__all__ = ["EngineControl", "EngineControlError", "ENGINE_MODES"]

log = logging.getLogger("trioforward.dispatch")

# Gateway engine mode -> (vLLM /pause mode, SGLang /pause_generation mode).
# SGLang has no "wait": the gateway drains its own requests first, then holds
# the engine in place.
ENGINE_MODES: dict[str, tuple[str, str]] = {
    "keep": ("keep", "in_place"),
    "retract": ("keep", "retract"),
    "wait": ("wait", "in_place"),
    "abort": ("abort", "abort"),
}
_JSON: list[tuple[str | bytes, str | bytes]] = [(b"content-type", b"application/json")]


class EngineControl:
    """Kinds and weight-update calls of a client's engines (one per client)."""

    def __init__(
        self, pool: ConnectionPool, kind: str, timeout: float, wait_timeout: float | None
    ) -> None:
        self._pool = pool
        self._configured = kind
        self._timeout = timeout
        self._wait_timeout = math.inf if wait_timeout is None else wait_timeout
        self.kinds: dict[str, str] = {}  # engine URL -> detected kind

    async def kind(self, url: str) -> str:
        """The engine's kind: configured, else detected (once; raises
        :class:`EngineControlError` if the engine cannot be reached)."""
        if self._configured != "auto":
            return self._configured
        kind = self.kinds.get(url)
        if kind is None:
            kind = self.kinds[url] = await self._detect(url)
            if kind == "none":
                log.warning(
                    "engine %s serves no weight-update endpoints (neither vLLM dev mode's "
                    "/is_paused nor SGLang's /get_weight_version): paused at the gateway only",
                    url,
                )
        return kind

    async def _detect(self, url: str) -> str:
        status, body = await self._call(url, "GET", "/is_paused")
        if status == 200 and isinstance(body, dict) and "is_paused" in body:
            return "vllm"
        status, body = await self._call(url, "GET", "/get_weight_version")
        return "sglang" if status == 200 else "none"

    async def pause(self, url: str, kind: str, mode: str) -> None:
        """Pause the engine in gateway ``mode`` (see :data:`ENGINE_MODES`)."""
        vllm_mode, sglang_mode = ENGINE_MODES[mode]
        if kind == "vllm":
            wait = self._wait_timeout if vllm_mode == "wait" else self._timeout
            await self._expect(url, "POST", f"/pause?mode={vllm_mode}", None, wait)
        elif kind == "sglang":
            await self._expect(url, "POST", "/pause_generation", {"mode": sglang_mode})

    async def resume(self, url: str, kind: str) -> None:
        if kind == "vllm":
            await self._expect(url, "POST", "/resume", None)
        elif kind == "sglang":
            await self._expect(url, "POST", "/continue_generation", {})

    async def set_version(self, url: str, kind: str, version: str) -> None:
        """Tell the engine its new weight version (what it reports on ``/weight_info``)."""
        if kind == "vllm":
            await self._expect(url, "POST", "/update_weight_version", {"new_version": version})
        elif kind == "sglang":
            body = {"new_version": version, "abort_all_requests": False}
            await self._expect(url, "POST", "/update_weight_version", body)

    async def _expect(
        self, url: str, method: str, path: str, json: Any, seconds: float | None = None
    ) -> None:
        status, body = await self._call(url, method, path, json, seconds)
        if not 200 <= status < 300:
            detail = orjson.dumps(body).decode()[:300] if body is not None else ""
            raise EngineControlError(
                f"engine {url} answered {status} to {method} {path}: {detail}", engine=url
            )

    async def _call(
        self, url: str, method: str, path: str, json: Any = None, seconds: float | None = None
    ) -> tuple[int, Any]:
        limit = self._timeout if seconds is None else seconds
        content = b"" if json is None else orjson.dumps(json)
        try:
            response = await self._pool.request(
                method,
                url + path,
                headers=_JSON if content else None,
                content=content,
                deadline=trio.current_time() + limit,
            )
        except PoolError as exc:
            raise EngineControlError(
                f"engine {url}: {method} {path} failed: {exc}", engine=url
            ) from exc
        try:
            body = orjson.loads(response.content) if response.content else None
        except orjson.JSONDecodeError:
            body = response.content.decode("utf-8", "replace")
        return response.status, body
