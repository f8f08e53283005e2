"""Quart views: ``/livez``, ``/health`` (``/readyz``), ``/metrics`` and
``GET /v1/models``; the admin API's views are in ``_admin_routes.py`` (installed
with these).
"""

from __future__ import annotations

from typing import Any

from quart import Response
from quart_trio import QuartTrio

from trioforward.server.admin._admin_routes import (
    install_admin_routes,
    json_response,
    sampling_sessions,
)
from trioforward.server.admin._router_compat import install_router_routes
from trioforward.server.base._state import STATE_KEY, GatewayState, get_state
from trioforward.server.engine_api import install_engine_routes
from trioforward.server.proxy._sessions import install_session_routes
from trioforward.server.telemetry._metrics import CONTENT_TYPE_LATEST

__all__ = ["install_routes"]


def install_routes(app: QuartTrio) -> None:
    """Registers the views on ``app``."""

    @app.get("/livez")
    async def livez() -> Response:
        # Liveness (Kubernetes convention): the process serves requests. Never
        # depends on the engines: restarting the gateway would not bring one back.
        if app.extensions.get(STATE_KEY) is None:
            return json_response({"status": "starting"}, 503)
        return json_response({"status": "alive"})

    @app.get("/health")
    @app.get("/readyz")
    async def health() -> Response:
        # Readiness: 200 only when a request can be served — an engine is
        # registered and healthy (a paused one counts: requests wait for resume).
        # 503 otherwise, so a readiness probe takes the gateway out of rotation.
        state: GatewayState | None = app.extensions.get(STATE_KEY)
        if state is None:
            return json_response({"status": "starting"}, 503)
        engines = state.client.engines.list()
        healthy = sum(1 for e in engines if e.healthy)
        if not engines:
            status = "no_engines"
        elif not healthy:
            status = "degraded"
        else:
            status = "ok"
        ready = status == "ok"
        body: dict[str, Any] = {
            "status": status,
            "engines": len(engines),
            "healthy_engines": healthy,
            "dispatchable_engines": sum(1 for e in engines if e.healthy and not e.paused),
        }
        if state.fleet is not None:  # fleet mode (docs/fleet.md)
            body["fleet"] = state.fleet.summary()
            if state.fleet.degraded and ready:
                # Shared state unreachable: the OpenAI routes still serve (still
                # ready, 200), Tinker submits answer 503 until it is back. Not
                # "degraded", which always means 503: no engine can serve.
                body["status"] = "shared_state_unreachable"
        return json_response(body, 200 if ready else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        state = get_state()
        state.metrics.sampling_sessions.set(sampling_sessions(state))
        return Response(state.metrics.render(), content_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> Response:
        state = get_state()
        seen: dict[str, dict[str, Any]] = {}
        for model in await state.client.engine_models():
            seen.setdefault(model["id"], model)
        bases = [m["id"] for m in seen.values() if not m.get("parent")]
        registry = state.client.adapters
        for name, path in registry.list().items():
            if name not in seen:
                seen[name] = {
                    "id": name,
                    "object": "model",
                    "owned_by": "trioforward",
                    "root": path,
                    "parent": registry.parent(name) or (bases[0] if len(bases) == 1 else None),
                }
        return json_response({"object": "list", "data": list(seen.values())})

    install_admin_routes(app)
    install_router_routes(app)  # SGLang router's worker routes (slime: _router_compat.py)
    install_session_routes(app)  # agent sessions (docs/sessions.md)
    install_engine_routes(app)  # the engines' own control routes (engine_api/)
