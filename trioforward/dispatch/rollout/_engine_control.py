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

The control kind follows the engine's kind (``_kinds.py``): ``sglang`` is
``sglang``, ``openai`` is ``none``; a configured ``vllm`` is ``vllm``, a
detected one is ``vllm`` only if ``GET /is_paused`` answers
``{"is_paused": ...}`` (dev mode), else ``none``. An engine whose kind is not
known yet at its first pause is asked then: ``/is_paused``, then SGLang's
``GET /model_info`` (``/get_weight_version`` is gone from SGLang 0.5.21).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import orjson
import trio

from trioforward.dispatch.engines._engines import Engine
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
        self,
        pool: ConnectionPool,
        configured: Callable[[str], str | None],
        timeout: float,
        wait_timeout: float | None,
        engine: Callable[[str], Engine | None] = lambda url: None,
    ) -> None:
        self._pool = pool
        self._configured = configured  # engine URL -> its configured kind, None = auto
        self._engine = engine
        self._timeout = timeout
        self._wait_timeout = math.inf if wait_timeout is None else wait_timeout
        self.kinds: dict[str, str] = {}  # engine URL -> detected control kind
        self._detecting: dict[str, trio.Event] = {}  # engine URL -> set when its detection ends

    async def kind(self, url: str) -> str:
        """The engine's control kind (``vllm``, ``sglang`` or ``none``): from its
        configured or detected kind, asked once when needed (raises
        :class:`EngineControlError` if the engine cannot be reached). Callers
        that need it while it is being asked wait for that answer instead of
        asking too (the first abort of a round calls this once per group and
        engine at the same moment); if that detection fails, each asks again."""
        configured = self._configured(url)
        if configured is not None:
            return "none" if configured == "openai" else configured
        while (pending := self._detecting.get(url)) is not None and url not in self.kinds:
            await pending.wait()
        kind = self.kinds.get(url)
        if kind is None:
            done = self._detecting[url] = trio.Event()
            try:
                kind = self.kinds[url] = await self._detect(url)
            finally:
                del self._detecting[url]
                done.set()
            if kind == "none":
                log.warning(
                    "engine %s serves no weight-update endpoints (neither vLLM dev mode's "
                    "/is_paused nor SGLang's): paused at the gateway only",
                    url,
                )
        return kind

    async def _detect(self, url: str) -> str:
        engine = self._engine(url)
        known = engine.kind if engine is not None and engine.kind_known.is_set() else None
        if known == "sglang":
            return "sglang"
        if known == "openai":
            return "none"
        status, body = await self._call(url, "GET", "/is_paused")
        if status == 200 and isinstance(body, dict) and "is_paused" in body:
            return "vllm"
        if known == "vllm":
            return "none"
        status, body = await self._call(url, "GET", "/model_info")
        return "sglang" if status == 200 and isinstance(body, dict) and "weight_version" in body else "none"

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

    async def abort_requests(self, url: str, kind: str, engine_ids: list[str]) -> None:
        """Ask the engine to end the named generations, each answering with what it
        decoded so far and ``finish_reason: "abort"`` (docs/operations.md,
        "Over-sampling: cancelling a round's stragglers"). ``engine_ids``: the ids
        as the engine names them. vLLM dev mode: ``POST /abort_requests
        {"request_ids"}`` (external ids; unknown ones are ignored,
        ``vllm/entrypoints/rl/online/api_router.py``); a vLLM serving the token
        route: ``POST /inference/v1/abort_requests`` (the same engine call,
        ``scale_out/token_in_token_out/api_router.py``); SGLang: ``POST
        /abort_request {"rid"}`` per id (200, empty, for unknown ones too).
        Raises :class:`EngineControlError` when the engine has none of them."""
        engine = self._engine(url)
        token_route = engine is not None and engine.kind == "vllm" and bool(engine.token_route)
        body = {"request_ids": engine_ids}
        if kind == "vllm":
            try:
                await self._expect(url, "POST", "/abort_requests", body)
                return
            except EngineControlError:
                if not token_route:
                    raise
        if token_route:
            await self._expect(url, "POST", "/inference/v1/abort_requests", body)
        elif kind == "sglang":
            async with trio.open_nursery() as nursery:
                for rid in engine_ids:
                    nursery.start_soon(self._expect, url, "POST", "/abort_request", {"rid": rid})
        else:
            raise EngineControlError(f"engine {url} has no abort route", engine=url)

    async def call(
        self, url: str, method: str, path: str, json: Any = None, seconds: float | None = None
    ) -> tuple[int, Any]:
        """One control call to the engine: ``(status, parsed JSON body, or its text,
        or None when empty)``, under ``engine_control_timeout`` unless ``seconds``.
        Raises :class:`EngineControlError` when the engine cannot be reached."""
        return await self._call(url, method, path, json, seconds)

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
            err = EngineControlError(f"engine {url}: {method} {path} failed: {exc}", engine=url)
            err.answered = False  # no answer: the call may have taken effect
            raise err from exc
        try:
            body = orjson.loads(response.content) if response.content else None
        except orjson.JSONDecodeError:
            body = response.content.decode("utf-8", "replace")
        return response.status, body
