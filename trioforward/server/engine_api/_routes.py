"""Quart views: the engines' own control routes, answered by the gateway in each
engine's shape (docs/server.md, "The engines' own control routes").

SGLang's (``srt/entrypoints/http_server.py`` 0.5.23; bodies ``io_struct.py``):

- ``POST /pause_generation {"mode": "abort" | "retract" | "in_place"}`` pauses every
  SGLang engine (``abort`` → engine mode ``abort`` with ``replay: "continue"``, so a
  request in flight continues on the new weights; ``retract`` → ``retract``;
  ``in_place`` → ``keep``) → ``{"message": "Generation paused successfully.",
  "status": "ok"}``;
- ``POST /continue_generation`` resumes them, recording the version a push inside
  the pause named → ``{"message": "Generation continued successfully.", "status": "ok"}``;
- ``POST /update_weights_from_disk {"model_path", "weight_version"?, ...}`` pushes to
  every SGLang engine (``_push.py``) → ``{"success", "message",
  "num_paused_requests", "engines": [...], "rolled_back": [...]}``, 200 / 207 / 400;
- ``GET|POST /flush_cache`` on every SGLang engine → ``Cache flushed. ...`` (text), or
  207 / the engines' status with per-engine results;
- ``GET /model_info`` (and the older ``/get_model_info``): the first SGLang engine's
  answer, its ``weight_version`` the gateway's when one is recorded.

vLLM's (0.32 ``vllm/entrypoints/rl/online/api_router.py``, dev mode):

- ``POST /pause?mode=abort|wait|keep`` (default ``abort``: continued after resume,
  as above) → ``{"status": "paused"}``; ``POST /resume`` → ``{"status": "resumed"}``;
  ``GET /is_paused`` → ``{"is_paused"}``; ``GET /weight_info`` → ``{"weight_version"}``;
- ``POST /init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``,
  ``/finish_weight_update {"weight_version"?}`` and ``/reset_prefix_cache`` fanned
  out to every vLLM engine → the engine's ``{"message"}`` plus ``"engines"``;
  207 on partial failure (a transfer cannot be undone: the engines it reached are
  held out until they report the current version, and nothing stays paused).

Every route takes the admin token when one is set. A body field the engine does
not take is a 400 naming it; no engine of the kind is a 404 ``engine_not_found``.
"""

from __future__ import annotations

from typing import Any

from quart import Response, request
from quart_trio import QuartTrio

from trioforward.dispatch import bad_version_reason
from trioforward.errors import EngineControlError
from trioforward.server.admin._admin_routes import json_response
from trioforward.server.base._errors import RequestError, bad_request
from trioforward.server.base._state import GatewayState, get_state
from trioforward.server.base._validate import parse_body
from trioforward.server.engine_api._pause import is_paused, pause_kind, resume_kind
from trioforward.server.engine_api._push import (
    EngineResult,
    PushOutcome,
    engines_of,
    fan_out,
    kinds_known,
    push,
)

__all__ = ["install_engine_routes"]

# SGLang's pause modes -> the gateway's (engine mode, replay).
_SGLANG_MODES: dict[str, tuple[str, bool | str]] = {"abort": ("abort", "continue"), "retract": ("retract", False), "in_place": ("keep", False)}
_VLLM_MODES: dict[str, tuple[str, bool | str]] = {"abort": ("abort", "continue"), "wait": ("wait", False), "keep": ("keep", False)}
# Every SGLang control body also takes these two (ignored: they address SGLang's
# own workers).
_SGLANG_ANY = ("rid", "http_worker_ipc")
_DISK_FIELDS = (
    "model_path", "load_format", "abort_all_requests", "weight_version", "is_async",
    "torch_empty_cache", "keep_pause", "recapture_cuda_graph", "token_step", "flush_cache",
    "manifest", *_SGLANG_ANY,
)  # fmt: skip
_VLLM_PUSH = {
    "/init_weight_transfer_engine": ("init_info",),
    "/start_weight_update": (),
    "/update_weights": ("update_info",),
    "/finish_weight_update": ("weight_version",),
    "/reset_prefix_cache": (),
}


async def _body(*fields: str) -> dict[str, Any]:
    data = parse_body(await request.get_data(as_text=False), allow_empty=True)
    unknown = sorted(set(data) - set(fields))
    if unknown:
        known = ", ".join(repr(f) for f in fields) or "no fields"
        raise bad_request(f"unknown field {unknown[0]!r} (this call takes {known})", unknown[0])
    return data


def _none_of(kind: str) -> RequestError:
    return RequestError(404, f"no {kind} engine is registered", code="engine_not_found")


def _version_of(data: dict[str, Any], name: str) -> str | None:
    version = data.get(name)
    reason = None if version is None else bad_version_reason(version)
    if reason is not None:
        raise bad_request(f"{name!r} {reason}", name)
    return version


async def _pause(state: GatewayState, kind: str, mode: tuple[str, bool | str]) -> Response | None:
    try:
        await pause_kind(state, kind, *mode)
    except LookupError:
        raise _none_of(kind) from None
    except EngineControlError as err:
        return json_response(err.to_json(), err.status)
    return None


async def _resume(state: GatewayState, kind: str) -> Response | None:
    try:
        await resume_kind(state, kind, None)
    except LookupError:
        raise _none_of(kind) from None
    except EngineControlError as err:
        return json_response(err.to_json(), err.status)
    return None


def _fanned(results: list[EngineResult]) -> int:
    """200 when every engine succeeded, 207 when some did, else their status."""
    failed = [r for r in results if not r.ok]
    if not failed:
        return 200
    if len(failed) < len(results):
        return 207
    return max(r.status for r in failed) or 502


def _undo_disk(result: EngineResult, before: Any) -> dict[str, Any] | None:
    """The ``/update_weights_from_disk`` body that loads what the engine ran before
    (its ``/model_info``), or None when that is not known."""
    if not isinstance(before, dict) or not isinstance(before.get("model_path"), str):
        return None
    body: dict[str, Any] = {"model_path": before["model_path"]}
    if isinstance(before.get("weight_version"), str):
        body["weight_version"] = before["weight_version"]
    return body


def install_engine_routes(app: QuartTrio) -> None:
    """Registers the engines' control routes on ``app``."""

    # -- SGLang ------------------------------------------------------------------

    @app.post("/pause_generation")
    async def sglang_pause_generation() -> Response:
        state = get_state()
        mode = (await _body("mode", *_SGLANG_ANY)).get("mode", "abort")
        if mode not in _SGLANG_MODES:
            raise bad_request("'mode' must be \"abort\", \"retract\" or \"in_place\"", "mode")
        failed = await _pause(state, "sglang", _SGLANG_MODES[mode])
        return failed or json_response({"message": "Generation paused successfully.", "status": "ok"})

    @app.post("/continue_generation")
    async def sglang_continue_generation() -> Response:
        state = get_state()
        await _body("torch_empty_cache", *_SGLANG_ANY)
        failed = await _resume(state, "sglang")
        return failed or json_response({"message": "Generation continued successfully.", "status": "ok"})

    @app.post("/update_weights_from_disk")
    async def sglang_update_weights_from_disk() -> Response:
        state = get_state()
        data = await _body(*_DISK_FIELDS)
        if not isinstance(data.get("model_path"), str) or not data["model_path"]:
            raise bad_request("missing required field 'model_path'", "model_path")
        version = _version_of(data, "weight_version")
        try:
            outcome = await push(
                state, "sglang", "/update_weights_from_disk", data, version, _undo_disk, "/model_info"
            )
        except LookupError:
            raise _none_of("sglang") from None
        except EngineControlError as err:
            return json_response(err.to_json(), err.status)
        return _disk_answer(outcome)

    @app.route("/flush_cache", methods=["GET", "POST"])
    async def sglang_flush_cache() -> Response:
        state = get_state()
        await kinds_known(state)
        urls = [e.url for e in engines_of(state, "sglang")]
        if not urls:
            raise _none_of("sglang")
        query = f"?timeout={request.args['timeout']}" if "timeout" in request.args else ""
        results = await fan_out(state, urls, "POST", "/flush_cache" + query, None)
        status = _fanned(results)
        if status == 200:
            text = results[0].body if isinstance(results[0].body, str) else "Cache flushed."
            return Response(text, status=200, content_type="text/plain; charset=utf-8")
        return json_response({"engines": [r.to_json() for r in results]}, status)

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def sglang_model_info() -> Response:
        state = get_state()
        await kinds_known(state)
        engines = [e for e in engines_of(state, "sglang") if e.healthy] or engines_of(state, "sglang")
        if not engines:
            raise _none_of("sglang")
        [result] = await fan_out(state, [engines[0].url], "GET", "/model_info", None)
        if not result.ok or not isinstance(result.body, dict):
            return json_response(result.to_json(), result.status or 502)
        info = dict(result.body)
        if state.client.weights.version is not None:
            info["weight_version"] = state.client.weights.version
        return json_response(info)

    # -- vLLM --------------------------------------------------------------------

    @app.post("/pause")
    async def vllm_pause() -> Response:
        state = get_state()
        await _body()
        mode = request.args.get("mode", "abort")
        if mode not in _VLLM_MODES:
            raise bad_request("query 'mode' must be abort, wait or keep", "mode")
        failed = await _pause(state, "vllm", _VLLM_MODES[mode])
        return failed or json_response({"status": "paused"})

    @app.post("/resume")
    async def vllm_resume() -> Response:
        state = get_state()
        await _body()
        failed = await _resume(state, "vllm")
        return failed or json_response({"status": "resumed"})

    @app.get("/is_paused")
    async def vllm_is_paused() -> Response:
        state = get_state()
        await kinds_known(state)
        if not engines_of(state, "vllm"):
            raise _none_of("vllm")
        return json_response({"is_paused": is_paused(state, "vllm")})

    @app.get("/weight_info")
    async def vllm_weight_info() -> Response:
        return json_response({"weight_version": get_state().client.weights.version})

    for path, fields in _VLLM_PUSH.items():
        app.add_url_rule(path, "vllm" + path.replace("/", "_"), _vllm_push(path, fields), methods=["POST"])


def _vllm_push(path: str, fields: tuple[str, ...]) -> Any:
    async def view() -> Response:
        state = get_state()
        data = await _body(*fields)
        version = _version_of(data, "weight_version")
        await kinds_known(state)
        urls = [e.url for e in engines_of(state, "vllm")]
        if not urls:
            raise _none_of("vllm")
        if path == "/reset_prefix_cache":
            results = await fan_out(state, urls, "POST", path, None)
            return json_response({"engines": [r.to_json() for r in results]}, _fanned(results))
        try:
            outcome = await push(state, "vllm", path, data, version)
        except EngineControlError as err:
            return json_response(err.to_json(), err.status)
        first = outcome.results[0].body if outcome.results else None
        answer = dict(first) if isinstance(first, dict) and outcome.status == 200 else {}
        return json_response({**answer, **outcome.to_json()}, outcome.status)

    return view


def _disk_answer(outcome: PushOutcome) -> Response:
    ok = outcome.status == 200
    if ok:
        message = "Succeeded to update model weights."
    else:
        failed = ", ".join(r.engine for r in outcome.results if not r.ok)
        message = f"Failed to update model weights on {failed}; the others were rolled back."
    body = {"success": ok, "message": message, "num_paused_requests": 0, **outcome.to_json()}
    return json_response(body, outcome.status)
