"""The simulated engine's weight pushes and cache resets (docs/sim.md, "Weight pushes").

What a trainer calls to put new weights into an engine, as each kind answers:

``"sglang"`` (SGLang 0.5.23 ``http_server.py``; bodies ``io_struct.py``; facts in
docs/compatibility.md, "SGLang engines"):

- ``POST /update_weights_from_disk {"model_path", "weight_version"?, "load_format"?,
  "abort_all_requests"?, ...}`` → 200 ``{"success": true, "message": "Succeeded to
  update model weights.", "num_paused_requests": 0}``; a failed load (the
  ``fail_weight_push`` fault) → 400 ``{"success": false, "message": ...}``, the
  engine keeps its weights. Success records ``model_path`` (``GET /model_info``
  reports it) and, when given, ``weight_version``. ``model_path`` missing → 400.
- ``GET|POST /flush_cache`` → 200 ``text/plain`` ``Cache flushed. ...``; 400 with a
  message while generations run (SGLang refuses then; held requests of a paused
  engine do not count).

``"vllm"`` (vLLM 0.32 ``vllm/entrypoints/rl/online/api_router.py``, dev mode): the
distributed-transfer calls ``POST /init_weight_transfer_engine {"init_info"}``,
``/start_weight_update``, ``/update_weights {"update_info"}`` and
``/finish_weight_update {"weight_version"?}`` → 200 ``{"message": ...}``; a
failed step (the ``fail_weight_push`` fault) → 500 ``{"error": ...}``. The sim
moves no tensors: it counts the calls (``stats.by_path``) and records the
version ``finish_weight_update`` names.

Each failure consumes one use of ``faults.fail_weight_push`` (a count fault).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from trioforward.sim.engine._engine import SimEngine

__all__ = ["PUSH_PATHS", "serve_push"]

PUSH_PATHS: dict[str, frozenset[str]] = {
    "sglang": frozenset({"/update_weights_from_disk", "/flush_cache"}),
    "vllm": frozenset(
        {"/init_weight_transfer_engine", "/start_weight_update", "/update_weights", "/finish_weight_update"}
    ),
}
_JSON = b"application/json"
_VLLM_MESSAGES = {
    "/init_weight_transfer_engine": "Weight transfer initialized",
    "/start_weight_update": "Weight update started",
    "/update_weights": "Weights updated",
    "/finish_weight_update": "Weight update finished",
}

Answer = tuple[int, bytes, bytes]


def _json(status: int, data: Any) -> Answer:
    return status, _JSON, orjson.dumps(data)


async def serve_push(engine: SimEngine, path: str, method: bytes, body: bytes) -> Answer:
    """Answer one request on ``PUSH_PATHS[engine.kind]``."""
    if path == "/flush_cache":
        if engine.stats.running:
            message = (
                "Cache not flushed because there are pending requests. "
                f"#queue-req: 0, #running-req: {engine.stats.running}"
            )
            return 400, b"text/plain; charset=utf-8", message.encode()
        if engine.prefix_cache is not None:
            engine.prefix_cache.clear()
        message = (
            "Cache flushed.\nPlease check backend logs for more details. (When there are "
            "running or waiting requests, the operation will not be performed.)\n"
        )
        return 200, b"text/plain; charset=utf-8", message.encode()
    if method != b"POST":
        return _json(405, {"detail": "Method Not Allowed"})
    try:
        data = orjson.loads(body) if body else {}
    except orjson.JSONDecodeError:
        return _json(400, {"detail": "Invalid JSON format"})
    if not isinstance(data, dict):
        return _json(400, {"detail": "Request body must be a JSON object"})
    if engine.kind == "sglang":
        return _sglang_update(engine, data)
    if engine.faults.take("fail_weight_push"):
        engine.stats.faults["fail_weight_push"] += 1
        return _json(500, {"error": f"Failed {path.strip('/')}: injected failure"})
    if path == "/finish_weight_update":
        version = data.get("weight_version")
        if version is not None:
            engine.rl.weight_version = str(version)
    return _json(200, {"message": _VLLM_MESSAGES[path]})


def _sglang_update(engine: SimEngine, data: dict[str, Any]) -> Answer:
    model_path = data.get("model_path")
    if not isinstance(model_path, str) or not model_path:
        return _json(400, {"object": "error", "message": "model_path is required", "code": 400})
    if engine.faults.take("fail_weight_push"):
        engine.stats.faults["fail_weight_push"] += 1
        message = f"Failed to update weights: cannot load {model_path} (injected failure)."
        return _json(400, {"success": False, "message": message, "num_paused_requests": 0})
    engine.model_path = model_path
    version = data.get("weight_version")
    if isinstance(version, str):
        engine.rl.weight_version = version
    message = "Succeeded to update model weights."
    return _json(200, {"success": True, "message": message, "num_paused_requests": 0})
