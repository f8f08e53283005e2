"""Agent sessions on the gateway (docs/sessions.md): a chat turn that names its
session (``X-Session-Id``) and the session routes.

- ``POST /v1/chat/completions`` with ``X-Session-Id``: served by
  :meth:`trioforward.sessions.Sessions.turn` (the front's chat route hands it
  here: :func:`session_turn`);
- ``GET /v1/sessions/{id}``: the trajectory; ``DELETE /v1/sessions/{id}``: end
  it (answers the trajectory); ``POST /v1/sessions/{id}/reward``
  ``{"reward": float, "turn"?: int, "name"?: str}``; ``GET /v1/sessions``:
  every session of the caller's tenant as JSONL, one trajectory a line.

Every route is the caller's tenant's only (its API key): another tenant's
session answers 404 as an unknown one does. Errors are OpenAI-style JSON.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from quart import Response, request
from quart_trio import QuartTrio

from trioforward.dispatch import bad_id_reason
from trioforward.errors import EngineRejected, TrioforwardError
from trioforward.server.admin._admin_routes import json_response
from trioforward.server.base._errors import dispatch_error_body, dispatch_error_headers, passed_on
from trioforward.server.base._state import GatewayState, get_state
from trioforward.server.front._asgi import Call, respond
from trioforward.server.front._auth import check_auth
from trioforward.sessions import LocalRenderer, SessionError, Sessions

__all__ = ["session_turn", "install_session_routes", "sessions_of", "Relay"]

# The chat route's stream relay: (state, path, call, send, log, transform) -> None.
Relay = Callable[..., Awaitable[None]]

_KEY = "sessions"


def sessions_of(state: GatewayState) -> Sessions:
    """The gateway's :class:`Sessions`, made on first use from the settings
    (``max_sessions``, ``session_ttl``, ``session_tokenizer``, ``session_tool_parser``)."""
    sessions: Sessions | None = state.extras.get(_KEY)
    if sessions is None:
        settings = state.settings
        path = settings.session_tokenizer
        renderer = LocalRenderer.from_directory(path) if path else None
        shared = (
            None if state.fleet is None else state.fleet.sessions
        )  # docs/sessions.md, "Fleet mode"
        sessions = Sessions(
            state.client,
            renderer=renderer,
            max_sessions=settings.max_sessions,
            ttl=settings.session_ttl,
            shared=shared,
            tool_parser=settings.session_tool_parser,
        )
        state.extras[_KEY] = sessions
    return sessions


def _error(err: SessionError) -> bytes:
    return orjson.dumps(err.to_json())


async def session_turn(call: Call, forward: dict[str, Any], relay: Relay) -> None:
    """Answer a chat turn of session ``forward["session"]``; ``forward``: the chat
    route's keyword arguments for the dispatch client; ``relay``: the chat
    route's stream relay (``_forward.relay_stream``), for a streamed turn."""
    log, send = call.log, call.send
    id_header = (b"x-request-id", (log.request_id or "").encode())
    session_id = forward["session"]
    reason = bad_id_reason(session_id)
    if reason is not None:
        log.status = 400
        err = SessionError(400, f"X-Session-Id {reason}", "invalid_session_id")
        await respond(send, 400, _error(err), extra=(id_header,))
        return
    if call.data.get("stream"):
        await _streamed_turn(call, forward, relay)
        return
    kwargs = {k: forward[k] for k in ("headers", "on_dispatch", "span", "request_id", "group")}
    try:
        response, content = await sessions_of(call.state).turn(
            session_id, call.data, tenant=call.tenant, **kwargs
        )
    except SessionError as err:
        log.status, log.error = err.status, err.code
        log.complete = True
        await respond(send, err.status, _error(err), extra=(id_header,))
        return
    except TrioforwardError as err:
        log.dispatched(err.engine, err.attempts, err.queue_time, err.engine_time)
        log.status, log.error = err.status, err.code
        log.complete = True
        if isinstance(err, EngineRejected):
            await respond(send, err.status, err.body, extra=(*passed_on(err.headers), id_header))
        else:
            extra = (*dispatch_error_headers(err), id_header)
            await respond(send, err.status, dispatch_error_body(err), extra=extra)
        return
    log.dispatched(response.engine, response.attempts, response.queue_time, response.engine_time)
    log.status = response.status
    log.complete = True
    extra = (*passed_on(response.headers), id_header)
    version = log.version = response.weight_version
    if version is not None:
        extra = (*extra, (b"x-weight-version", version.encode()))
    await respond(
        send, response.status, response.content if content is None else content, extra=extra
    )


async def _streamed_turn(call: Call, forward: dict[str, Any], relay: Relay) -> None:
    """A streamed turn (docs/sessions.md, "Streamed turns"): the engine's
    completion stream relayed as chat chunks by the chat route's own relay."""
    log = call.log
    relayed = False
    try:
        async with sessions_of(call.state).streamed(
            forward["session"], call.data, tenant=call.tenant, request_id=log.request_id or ""
        ) as turn:
            stream = {k: v for k, v in forward.items() if k not in ("json", "content")}
            stream["json"] = turn.completion
            relayed = True
            await relay(call.state, "/v1/completions", stream, call.send, log, turn.events)
            turn.engine, turn.queue_time = log.engine or "", log.queue_time
            turn.version = log.version
    except SessionError as err:
        log.error = err.code
        if relayed:  # the stream went out; the turn is not recorded
            return
        log.status = err.status
        log.complete = True
        id_header = (b"x-request-id", (log.request_id or "").encode())
        await respond(call.send, err.status, _error(err), extra=(id_header,))


def _tenant(state: GatewayState) -> Any:
    return check_auth(
        state.settings, request.path, lambda name: request.headers.get(name), state.client.tenants
    )


def _refusal(err: SessionError) -> Response:
    return Response(_error(err), status=err.status, content_type="application/json")


def install_session_routes(app: QuartTrio) -> None:
    """Registers the session views on ``app`` (module docstring)."""

    @app.get("/v1/sessions/<session_id>")
    async def get_session(session_id: str) -> Response:
        state = get_state()
        try:
            return json_response(await sessions_of(state).fetch(session_id, _tenant(state)))
        except SessionError as err:
            return _refusal(err)

    @app.delete("/v1/sessions/<session_id>")
    async def end_session(session_id: str) -> Response:
        state = get_state()
        try:
            return json_response(await sessions_of(state).close(session_id, _tenant(state)))
        except SessionError as err:
            return _refusal(err)

    @app.post("/v1/sessions/<session_id>/reward")
    async def reward_session(session_id: str) -> Response:
        state = get_state()
        try:
            try:
                body = orjson.loads(await request.get_data())
            except orjson.JSONDecodeError:
                raise SessionError(
                    400,
                    'the body must be JSON: {"reward": number, "turn"?: int, "name"?: str}',
                    "invalid_json",
                ) from None
            if not isinstance(body, dict) or set(body) - {"reward", "turn", "name"}:
                raise SessionError(
                    400, "the body takes reward, turn and name only", "invalid_reward"
                )
            reward, turn, name = body.get("reward"), body.get("turn"), body.get("name", "reward")
            if not isinstance(reward, int | float) or isinstance(reward, bool):
                raise SessionError(
                    400, f"reward must be a number (got {reward!r})", "invalid_reward"
                )
            if not isinstance(name, str) or not name:
                raise SessionError(
                    400, f"name must be a non-empty string (got {name!r})", "invalid_reward"
                )
            sessions = sessions_of(state)
            session = await sessions.add_reward(
                session_id, reward, turn=turn, name=name, tenant=_tenant(state)
            )
            return json_response(
                {
                    "id": session.id,
                    "rewards": session.rewards,
                    "turn_rewards": [t.reward for t in session.turns],
                }
            )
        except SessionError as err:
            return _refusal(err)

    @app.get("/v1/sessions")
    async def export_sessions() -> Response:
        state = get_state()
        try:
            body = await sessions_of(state).export(_tenant(state))
        except SessionError as err:
            return _refusal(err)
        return Response(body, content_type="application/jsonl")
