"""Engine kinds — ``vllm``, ``sglang``, ``openai`` — and what each engine serves
(docs/operations.md, "Engine kinds").

An engine's kind is set by the operator (``engine_kind`` for every engine,
``engine_kinds`` per engine URL) or, with ``auto``, detected once when the
engine is registered, from its own endpoints, on the control pool:

1. ``GET /model_info`` answering a JSON object with ``weight_version`` or
   ``model_path`` is SGLang (every SGLang release from 0.5.6 to 0.5.23 serves
   it, ``srt/entrypoints/http_server.py``; ``/get_weight_version``, the old
   probe, answers 404 from 0.5.10 and is gone from 0.5.21);
2. ``GET /version`` answering ``{"version": ...}`` is vLLM
   (``vllm/entrypoints/serve/instrumentator/basic.py``), and so is a
   ``GET /v1/models`` whose cards say ``"owned_by": "vllm"``;
3. any other server answering ``GET /v1/models`` 200 is ``openai``.

What it serves: SGLang always serves its native ``POST /generate``; a vLLM
serves ``POST /inference/v1/generate`` only when started with
``--enable-scale-out`` or ``--tokens-only``. Without them vLLM 0.32 still
registers the path, with a stand-in that answers every ``POST`` 403 "Scale-out
endpoints are disabled" (``vllm/entrypoints/scale_out/factories.py``), so ``GET``'s
405 says nothing either way. The probe is a ``POST`` of ``{}``: refused before any
generation, 403 (or 404 on older releases) when the route is off, a validation
error (400, or FastAPI's 422) when it is served. No generation is ever started to
find out.

An engine that cannot be reached is asked again later (:func:`detect_loop`);
until then its kind is ``None`` and it takes no native-route request.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
import trio

from trioforward.dispatch.engines._engines import Engine
from trioforward.http import ConnectionPool, PoolError

__all__ = ["KINDS", "TOKEN_ROUTE", "detect", "detect_loop", "kind_setting"]

log = logging.getLogger("trioforward.dispatch")

#: The engine kinds (``engine_kind`` also takes ``auto``, and ``none``: the former
#: name of ``openai``).
KINDS = ("vllm", "sglang", "openai")
#: Each kind's token-in/token-out route (``openai``: none).
TOKEN_ROUTE = {"vllm": "/inference/v1/generate", "sglang": "/generate"}
_RETRY_MAX = 30.0  # s: longest wait between two detections of an unreachable engine


def kind_setting(value: str) -> str | None:
    """``engine_kind``'s value as a kind (``None`` for ``auto``)."""
    if value == "auto":
        return None
    return "openai" if value == "none" else value


class _Unreachable(Exception):
    pass


async def _get(pool: ConnectionPool, url: str, path: str, probe_seconds: float) -> tuple[int, Any]:
    try:
        response = await pool.request("GET", url + path, deadline=trio.current_time() + probe_seconds)
    except PoolError as exc:
        raise _Unreachable(f"GET {path}: {exc}") from exc
    try:
        body = orjson.loads(response.content) if response.content else None
    except orjson.JSONDecodeError:
        body = None
    return response.status, body


async def _token_route(pool: ConnectionPool, url: str, probe_seconds: float) -> bool:
    try:
        response = await pool.request(
            "POST",
            url + TOKEN_ROUTE["vllm"],
            headers=[(b"content-type", b"application/json")],
            content=b"{}",
            deadline=trio.current_time() + probe_seconds,
        )
    except PoolError as exc:
        raise _Unreachable(f"POST {TOKEN_ROUTE['vllm']}: {exc}") from exc
    return response.status in (400, 422)


async def detect(
    pool: ConnectionPool, url: str, probe_seconds: float, kind: str | None = None, found: dict[str, str] | None = None
) -> tuple[str, bool]:
    """``(kind, token route served)`` of the engine at ``url``; ``kind`` given:
    only what it serves is asked. Each call has ``probe_seconds``. Raises
    ``OSError``-free :class:`_Unreachable` when the engine does not answer."""
    if kind == "sglang":
        return kind, True
    if kind == "openai":
        return kind, False
    if kind == "vllm":
        return kind, await _token_route(pool, url, probe_seconds)
    status, body = await _get(pool, url, "/model_info", probe_seconds)
    if status == 200 and isinstance(body, dict) and ("weight_version" in body or "model_path" in body):
        name = body.get("served_model_name") or body.get("model_path")
        if found is not None and isinstance(name, str) and name:
            found["served_model"] = name  # the base of its OpenAI routes' "<base>:<adapter>"
        return "sglang", True
    status, body = await _get(pool, url, "/version", probe_seconds)
    if status == 200 and isinstance(body, dict) and isinstance(body.get("version"), str):
        return "vllm", await _token_route(pool, url, probe_seconds)
    status, body = await _get(pool, url, "/v1/models", probe_seconds)
    cards = body.get("data") if isinstance(body, dict) else None
    if status == 200 and isinstance(cards, list):
        if any(isinstance(c, dict) and c.get("owned_by") == "vllm" for c in cards):
            return "vllm", await _token_route(pool, url, probe_seconds)
        return "openai", False
    raise _Unreachable(f"no /model_info, /version or /v1/models (last status {status})")


async def detect_loop(
    pool: ConnectionPool, engine: Engine, configured: str | None, probe_seconds: float
) -> None:
    """Set ``engine.kind`` and ``engine.token_route``, asking again (1 s, doubling,
    at most 30 s apart) until the engine answers or is removed."""
    if configured is not None:
        engine.kind = configured  # known at once; what it serves follows
    delay = 1.0
    while not engine.removed:
        try:
            found: dict[str, str] = {}
            kind, served = await detect(pool, engine.url, probe_seconds, configured, found)
        except _Unreachable as exc:
            log.debug("engine %s: kind not detected yet (%s)", engine.url, exc)
            await trio.sleep(delay)
            delay = min(_RETRY_MAX, delay * 2)
            continue
        engine.kind, engine.token_route = kind, served
        engine.served_model = found.get("served_model")
        if kind == "sglang":
            engine.health_path = "/ready"  # /health blocks 20 s while paused (_health.py)
        engine.kind_known.set()
        log.info(
            "engine %s is %s%s",
            engine.url,
            kind,
            f" (serves {TOKEN_ROUTE[kind]})" if served else "",
        )
        return
