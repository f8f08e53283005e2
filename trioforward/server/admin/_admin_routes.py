"""Quart views: the admin API (installed by ``_routes.install_routes``).

The API (JSON in, JSON out; ``Authorization: Bearer <admin_token>`` when set):

- ``GET /admin/engines`` -> ``{"engines": [{"url", "healthy", "paused", "in_flight",
  "queued", "capacity", "consecutive_failures", "kind", "token_route"}]}`` (``kind``:
  vllm | sglang | openai | null while not known; ``token_route``: whether it serves its
  kind's token route, docs/operations.md, "Engine kinds")
- ``POST /admin/engines {"url", "kind"?}`` adds an engine; ``DELETE /admin/engines {"url"}``
  (or ``?url=``) removes it (its in-flight requests are aborted by the dispatch core).
- ``POST /admin/pause {"engines": [url, ...] | null, "mode": "wait" | "abort",
  "engine_mode": "keep" | "retract" | "wait" | "abort" | null, "replay": bool | "whole" | "continue"}``:
  stops new dispatch (requests wait in QUEUED, no budget charged) and, with
  ``engine_mode``, pauses the engines themselves (all or nothing: 502
  ``engine_control_failed`` naming the engine that failed); answers once the
  mode's promise holds — so a trainer may update weights as soon as it returns.
  ``POST /admin/resume {"engines": [...] | null, "weight_version": str | null,
  "flush_cache": bool}`` resumes the engines, records the version, then releases
  the queue in FIFO order; ``flush_cache`` first resets every engine's prefix
  cache (vLLM ``/reset_prefix_cache``, SGLang ``/flush_cache``) and answers the
  results under ``"flushed"`` (207 when one failed; the resume goes on). Both answer the engine list plus ``weight_version`` and
  ``engine_pauses`` (docs/operations.md).
- ``POST /admin/abort {"group" | "request_ids" | "all"}`` aborts requests
  (``server/admin/_abort.py``); answers ``{"queued", "on_engine", "finished"}``.
- ``GET/POST/DELETE /admin/staleness``: ``{"tenant" | "group_prefix", "step", "eta",
  "on_stale"?}`` declares a staleness bound (docs/operations.md, "Staleness-bounded
  admission"); GET lists them with ``started``, ``allowed``, ``waiting``, ``running``.
- ``GET/POST/DELETE /admin/adapters``: ``{"name", "path", "parent"?}`` registers a
  LoRA adapter the gateway loads on demand.

A body field a call does not take is a 400 naming it (the call does nothing).
Engine URLs come only from here and from the configuration, never from a
client request. In fleet mode (docs/fleet.md, "Control plane") every change is
made fleet-wide and answers once all live members applied it (503
``fleet_lagging`` naming the laggards otherwise); ``GET /admin/engines`` adds a
``"fleet"`` object with totals and each member.
"""

from __future__ import annotations

from typing import Any

import orjson
from quart import Response, request
from quart_trio import QuartTrio

from trioforward._engine_url import EngineURLError, engine_url
from trioforward.dispatch import (
    ENGINE_KINDS,
    ENGINE_MODES,
    StalenessBound,
    bad_version_reason,
    pause_conflict,
)
from trioforward.errors import EngineControlError
from trioforward.server.admin._abort import abort_args, abort_here
from trioforward.server.admin._fan_out import flush_prefix_caches
from trioforward.server.admin._fleet_calls import fleet_pause, fleet_resume, fleet_wide
from trioforward.server.base._errors import RequestError, bad_request
from trioforward.server.base._state import GatewayState, get_state
from trioforward.server.base._validate import parse_body

__all__ = ["install_admin_routes", "json_response", "sampling_sessions"]


def json_response(data: Any, status: int = 200) -> Response:
    """``data`` as a JSON answer (``application/json``)."""
    return Response(orjson.dumps(data), status=status, content_type="application/json")


async def _body(*fields: str) -> dict[str, Any]:
    """The JSON object body (empty = ``{}``) holding only ``fields``: a misspelt
    field is a 400 naming it, not a call that silently did the default (a pause
    with ``"engine-mode"`` would not pause the engines)."""
    data = parse_body(await request.get_data(as_text=False), allow_empty=True)
    unknown = sorted(set(data) - set(fields))
    if unknown:
        known = ", ".join(repr(f) for f in fields)
        raise bad_request(f"unknown field {unknown[0]!r} (this call takes {known})", unknown[0])
    return data


def _engine_list(data: dict[str, Any]) -> list[str] | None:
    engines = data.get("engines")
    if engines is None:
        return None
    if not isinstance(engines, list) or not all(isinstance(e, str) for e in engines):
        raise bad_request("'engines' must be a list of engine URLs", "engines")
    return [e.rstrip("/") for e in engines]


def _known_engines(state: GatewayState, data: dict[str, Any]) -> list[str] | None:
    """``data["engines"]``, each one registered (404 ``engine_not_found`` otherwise)."""
    engines = _engine_list(data)
    if engines is not None:
        known = {e.url for e in state.client.engines.list()}
        for url in engines:
            if url not in known:
                raise RequestError(404, f"no engine {url}", code="engine_not_found", param="engines")
    return engines


def _url(value: object) -> str:
    """``value`` as an engine URL (the one rule: docs/server.md, "Engine URLs");
    400 ``invalid_engine_url`` saying what is wrong with it (or that it is
    missing) otherwise."""
    if value is None:
        raise RequestError(
            400,
            "missing 'url' (the engine's root, e.g. http://127.0.0.1:8001)",
            code="invalid_engine_url",
            param="url",
        )
    try:
        return engine_url(value)
    except EngineURLError as exc:
        raise RequestError(400, str(exc), code="invalid_engine_url", param="url") from None


def _engines_json(state: GatewayState) -> dict[str, Any]:
    body: dict[str, Any] = {
        "engines": [
            {
                "url": e.url,
                "healthy": e.healthy,
                "paused": e.paused,
                "in_flight": e.in_flight,
                "queued": e.queued,
                "capacity": e.capacity,
                "share": e.share,
                "consecutive_failures": e.consecutive_failures,
                "kind": e.kind,
                "token_route": e.token_route,
                "weight_version": e.weight_version,  # the version it reported
                "held_out": e.held_out,  # why it takes no work (docs/operations.md)
            }
            for e in state.client.engines.list()
        ]
    }
    if state.fleet is not None:  # fleet mode: totals over every member, and each member
        body["fleet"] = state.fleet.summary()
    return body


def _weights_json(state: GatewayState) -> dict[str, Any]:
    weights = state.client.weights
    pauses = {
        url: {"kind": p.kind, "engine_mode": p.mode} for url, p in weights.engine_pauses.items()
    }
    return {**_engines_json(state), "weight_version": weights.version, "engine_pauses": pauses}


def _check_version(value: object) -> None:
    """A ``weight_version`` field's 400 (``bad_version_reason``), if it is not one."""
    reason = bad_version_reason(value)
    if reason is not None:
        raise bad_request(f"'weight_version' {reason}", "weight_version")


def sampling_sessions(state: GatewayState) -> int:
    """Tinker sampling sessions kept (0 before the first Tinker call)."""
    tinker = state.extras.get("tinker")
    return int(getattr(tinker, "sampling_sessions", 0))


def _max_sampling_sessions() -> int:
    from trioforward.server.tinker._state import MAX_SAMPLING_SESSIONS

    return MAX_SAMPLING_SESSIONS


def install_admin_routes(app: QuartTrio) -> None:
    """Registers the admin views on ``app``."""

    @app.get("/admin/engines")
    async def list_engines() -> Response:
        return json_response(_engines_json(get_state()))

    @app.post("/admin/engines")
    async def add_engine() -> Response:
        state = get_state()
        data = await _body("url", "kind", "weight_version")
        url = _url(data.get("url"))
        kind = data.get("kind")
        confirmed = data.get("weight_version")
        if confirmed is not None:
            _check_version(confirmed)
        if kind is not None and kind not in ENGINE_KINDS:
            raise bad_request(f"'kind' must be null or one of {', '.join(ENGINE_KINDS)}", "kind")
        if kind is not None and state.fleet is not None:
            raise bad_request("in fleet mode an engine's kind is set with engine_kinds", "kind")
        # Idempotent, as PUT would be: re-adding a registered engine is 200 with
        # the list unchanged; 201 only when this call created the record.
        known = url in {e.url for e in state.client.engines.list()}
        if state.fleet is not None:
            await fleet_wide(state.fleet.control.add_engine(url))
        else:
            state.client.engines.add(url, kind)
        if confirmed is not None:
            # The operator's word that it runs this version (an engine that cannot
            # report one): docs/operations.md, "One weight version across the engines";
            # in fleet mode every member takes it (the version is fleet-wide).
            current = state.client.weights.version
            if confirmed != current:
                raise RequestError(
                    409,
                    f"weight_version {confirmed!r} is not the current one ({current!r})",
                    code="weight_version_mismatch",
                    param="weight_version",
                )
            if state.fleet is not None:
                await fleet_wide(state.fleet.control.confirm_version(url, confirmed))
            else:
                state.client.versions.confirm(state.client.engines.get(url), confirmed)
        return json_response(_engines_json(state), 200 if known else 201)

    @app.delete("/admin/engines")
    async def remove_engine() -> Response:
        state = get_state()
        url = _url(request.args.get("url") or (await _body("url")).get("url"))
        if url not in {e.url for e in state.client.engines.list()}:
            raise RequestError(404, f"no engine {url}", code="engine_not_found", param="url")
        if state.fleet is not None:
            await fleet_wide(state.fleet.control.remove_engine(url))
        else:
            state.client.engines.remove(url)
        return json_response(_engines_json(state))

    @app.post("/admin/pause")
    async def pause() -> Response:
        state = get_state()
        data = await _body("engines", "mode", "engine_mode", "replay")
        mode = data.get("mode", "wait")
        if mode not in ("wait", "abort"):
            raise bad_request('\'mode\' must be "wait" or "abort"', "mode")
        engine_mode = data.get("engine_mode")
        if engine_mode is not None and engine_mode not in ENGINE_MODES:
            modes = ", ".join(f'"{m}"' for m in ENGINE_MODES)
            raise bad_request(f"'engine_mode' must be null or one of {modes}", "engine_mode")
        replay = data.get("replay", False)
        if replay not in (True, False, "whole", "continue") or isinstance(replay, int) and not isinstance(replay, bool):
            raise bad_request('\'replay\' must be true, false, "whole" or "continue"', "replay")
        conflict = pause_conflict(mode, engine_mode, replay)
        if conflict is not None:
            raise bad_request(*conflict)
        engines = _known_engines(state, data)
        try:
            if state.fleet is None:
                await state.client.pause(engines, mode, engine_mode=engine_mode, replay=replay)
            else:
                await fleet_pause(state, engines, mode, engine_mode, replay)
        except EngineControlError as err:
            return json_response(err.to_json(), err.status)
        return json_response(_weights_json(state))

    @app.post("/admin/abort")
    async def abort() -> Response:
        # docs/operations.md, "Over-sampling: cancelling a round's stragglers".
        state = get_state()
        ids, group, every = abort_args(await _body("group", "request_ids", "all"))
        if state.fleet is None:
            return json_response(await abort_here(state, ids, group, every))
        return json_response(await fleet_wide(state.fleet.control.abort(ids, group, every)))

    @app.post("/admin/resume")
    async def resume() -> Response:
        state = get_state()
        data = await _body("engines", "weight_version", "flush_cache")
        version = data.get("weight_version")
        flush = data.get("flush_cache", False)
        if not isinstance(flush, bool):
            raise bad_request("'flush_cache' must be true or false", "flush_cache")
        if version is not None and not isinstance(version, str):
            raise bad_request("'weight_version' must be a string or null", "weight_version")
        if version is not None:
            _check_version(version)
        engines = _known_engines(state, data)
        # Before the engines take work again: no KV of the old weights serves the new.
        flushed = await flush_prefix_caches(state, engines) if flush else []
        try:
            if state.fleet is None:
                await state.client.resume(engines, weight_version=version)
            else:
                await fleet_resume(state, engines, version)
        except EngineControlError as err:
            return json_response(err.to_json(), err.status)
        if not flush:
            return json_response(_weights_json(state))
        answer = {**_weights_json(state), "flushed": [r.to_json() for r in flushed]}
        return json_response(answer, 200 if all(r.ok for r in flushed) else 207)

    @app.get("/admin/staleness")
    async def list_staleness() -> Response:
        return json_response({"bounds": get_state().client.admission.statistics()})

    @app.post("/admin/staleness")
    async def declare_staleness() -> Response:
        state = get_state()
        data = await _body("tenant", "group_prefix", "step", "eta", "on_stale")
        try:
            bound = StalenessBound(
                data.get("step"),  # type: ignore[arg-type]  # checked by StalenessBound
                data.get("eta"),  # type: ignore[arg-type]
                data.get("on_stale", "continue"),
                data.get("tenant"),
                data.get("group_prefix"),
            )
            if bound.tenant is not None:
                state.client.tenants.named(bound.tenant)
        except (ValueError, TypeError) as exc:
            raise bad_request(str(exc)) from None
        if state.fleet is not None:
            await fleet_wide(state.fleet.control.declare_staleness(bound))
        else:
            state.client.admission.declare(bound)
        return json_response(bound.to_json(), 201)

    @app.delete("/admin/staleness")
    async def withdraw_staleness() -> Response:
        state = get_state()
        data = await _body("tenant", "group_prefix")
        tenant, prefix = data.get("tenant"), data.get("group_prefix")
        if not isinstance(tenant, str) and not isinstance(prefix, str):
            raise bad_request("send 'tenant' or 'group_prefix' (a string)")
        known = {b.key for b in state.client.admission.bounds()}
        if (f"tenant:{tenant}" if tenant is not None else f"group:{prefix}") not in known:
            raise RequestError(404, "no such staleness bound", code="not_found")
        if state.fleet is not None:
            await fleet_wide(state.fleet.control.withdraw_staleness(tenant, prefix))
        else:
            state.client.admission.withdraw(tenant, prefix)
        return json_response({"tenant": tenant, "group_prefix": prefix, "deleted": True})

    @app.get("/admin/adapters")
    async def list_adapters() -> Response:
        state = get_state()
        registry = state.client.adapters
        adapters = registry.list()
        settings = state.settings
        return json_response(
            {
                "adapters": [
                    {"name": n, "path": p, "parent": registry.parent(n)} for n, p in adapters.items()
                ],
                # The bounds (docs/server.md, "Admin API"): what each engine holds,
                # and how many adapters and Tinker sampling sessions are kept.
                "loaded": state.client.statistics().adapters_loaded,
                "max_loaded_adapters": settings.max_loaded_adapters,
                "max_registered_adapters": settings.max_registered_adapters,
                "sampling_sessions": sampling_sessions(state),
                "max_sampling_sessions": _max_sampling_sessions(),
            }
        )

    @app.post("/admin/adapters")
    async def register_adapter() -> Response:
        state = get_state()
        data = await _body("name", "path", "parent")
        name, path, parent = data.get("name"), data.get("path"), data.get("parent")
        if not isinstance(name, str) or not name:
            raise bad_request("'name' must be a non-empty string", "name")
        if not isinstance(path, str) or not path:
            raise bad_request("'path' must be a non-empty string", "path")
        if parent is not None and not isinstance(parent, str):
            raise bad_request("'parent' must be a string", "parent")
        if state.fleet is not None:
            await fleet_wide(state.fleet.control.register_adapter(name, path, parent))
        else:
            # Re-registering replaces the record: a parent not given is cleared.
            state.client.adapters.register(name, path, parent)
        return json_response({"name": name, "path": path, "parent": parent}, 201)

    @app.delete("/admin/adapters")
    async def unregister_adapter() -> Response:
        state = get_state()
        name = request.args.get("name") or (await _body("name")).get("name")
        if not isinstance(name, str) or not name:
            raise bad_request("'name' must be a non-empty string", "name")
        if name not in state.client.adapters.list():
            raise RequestError(404, f"no adapter {name!r}", code="adapter_not_found", param="name")
        if state.fleet is not None:
            await fleet_wide(state.fleet.control.unregister_adapter(name))
        else:
            state.client.adapters.unregister(name)
        return json_response({"name": name, "deleted": True})
