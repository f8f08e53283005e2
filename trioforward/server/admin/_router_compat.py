"""The worker routes of SGLang's router (``sglang-router``), so slime-style
trainers can use the gateway as their router (docs/compatibility.md, "Pointing
slime-style code at the gateway").

slime registers each SGLang engine with its router (``POST
/add_worker?url=U``), sends ``/generate`` to the router, and aborts a rollout
by asking the router for its workers (``GET /list_workers`` → ``{"urls"}``, or
``GET /workers`` → ``{"workers": [{"url"}]}`` on newer routers) and posting
``/abort_request {"abort_all": true}`` to each (slime
``rollout/sglang_rollout.py``, ``abort``). Here:

- ``POST /add_worker?url=U`` registers engine ``U`` as ``POST /admin/engines``
  does (its kind detected), ``POST /remove_worker?url=U`` removes it; both take
  the admin token when one is set, and answer ``{"status": "success",
  "message"}`` (200; 400 for a bad URL, 404 for an unknown one on remove);
- ``POST /finish_session?session_id=ID`` (vllm-router's shape; a JSON body
  ``{"session_id": ID}`` too) ends a session for routing: its next request is
  placed afresh (docs/dispatch.md, "Sessions that move"); 200
  ``{"status": "success", "session_id", "finished"}`` (``finished``: routing
  remembered it), 400 without an id. It takes a client API key, as ``/v1``;
- ``GET /list_workers`` and ``GET /workers`` name **the gateway itself** (the
  URL the request came to), not the engines: the trainer's abort then reaches
  the gateway's ``/abort_request`` (docs/server.md, "Token routes"), which also
  cancels the requests still queued in the gateway, which an abort sent to
  the engines would miss.
"""

from __future__ import annotations

from quart import Response, request
from quart_trio import QuartTrio

from trioforward._engine_url import EngineURLError, engine_url
from trioforward.server.admin._admin_routes import json_response
from trioforward.server.admin._fleet_calls import fleet_wide
from trioforward.server.base._errors import RequestError
from trioforward.server.base._state import get_state

__all__ = ["install_router_routes"]


def _worker_url() -> str:
    value = request.args.get("url")
    if not value:
        message = "missing ?url= (the engine's root, e.g. http://127.0.0.1:30000)"
        raise RequestError(400, message, code="invalid_engine_url", param="url")
    try:
        return engine_url(value)
    except EngineURLError as exc:
        raise RequestError(400, str(exc), code="invalid_engine_url", param="url") from None


def _self_url() -> str:
    """The gateway's URL as the caller reached it."""
    return f"{request.scheme}://{request.host}"


def install_router_routes(app: QuartTrio) -> None:
    """Add the router-compatible worker routes to ``app``."""

    @app.post("/add_worker")
    async def add_worker() -> Response:
        state = get_state()
        url = _worker_url()
        if state.fleet is not None:
            await fleet_wide(state.fleet.control.add_engine(url))
        else:
            state.client.engines.add(url, None)
        return json_response({"status": "success", "message": f"Successfully added worker: {url}"})

    @app.post("/remove_worker")
    async def remove_worker() -> Response:
        state = get_state()
        url = _worker_url()
        if url not in {e.url for e in state.client.engines.list()}:
            raise RequestError(404, f"no engine {url}", code="engine_not_found", param="url")
        if state.fleet is not None:
            await fleet_wide(state.fleet.control.remove_engine(url))
        else:
            state.client.engines.remove(url)
        return json_response({"status": "success", "message": f"Successfully removed worker: {url}"})

    @app.post("/finish_session")
    async def finish_session() -> Response:
        session = request.args.get("session_id")
        if session is None:
            data = await request.get_json(force=True, silent=True)
            session = data.get("session_id") if isinstance(data, dict) else None
        if not isinstance(session, str) or not session:
            message = "missing session_id (?session_id=ID, or a JSON body {\"session_id\": ID})"
            raise RequestError(400, message, code="invalid_session_id", param="session_id")
        finished = get_state().client.finish_session(session)
        return json_response({"status": "success", "session_id": session, "finished": finished})

    @app.get("/list_workers")
    async def list_workers() -> Response:
        return json_response({"urls": [_self_url()]})

    @app.get("/workers")
    async def workers() -> Response:
        return json_response({"workers": [{"url": _self_url()}], "total": 1})
