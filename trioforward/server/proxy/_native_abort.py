"""The engines' own abort routes, by the caller's ids: ``POST /abort_request``
(SGLang) and ``POST /inference/v1/abort_requests`` (vLLM 0.32 with
``--enable-scale-out``), docs/server.md, "Token routes".

A trainer written for the engine (slime, miles: SGLang; vLLM's scale-out
clients) aborts the generations it started on the token routes by the ids it
gave them: SGLang ``{"rid": R}`` or ``{"abort_all": true}``, vLLM
``{"request_ids": [...]}``. The gateway gave each attempt an engine-side id of
its own (:mod:`._native`), so the caller's ids mean nothing to an engine; this
module keeps, per process, which of the gateway's requests each caller id
names (:mod:`._callers`, filled by :mod:`._native` for the life of each
request) and hands them to the gateway's abort (the one ``POST /admin/abort``
uses: dispatch/rollout/_abort.py), which aborts them on the engines that run them by
their engine-side ids, cancels the queued ones, and answers each caller with
what was decoded so far and an abort finish reason.

- Ids are the caller's as it sent them: SGLang's ``rid`` (a string, each item
  of a list, and ``<rid>_<i>``, the item ids SGLang gives a batch with one
  string ``rid``; an item's id aborts its whole batch request), vLLM's
  ``X-Request-Id`` or ``request_id`` (also as the answer names it,
  ``generate-tokens-<id>``); a request that came without one is known by the id
  its answer carries (the gateway's request id).
- A caller reaches only its own tenant's requests (the API key's, docs/dispatch.md,
  "Tenants and fair queueing"); ``abort_all`` aborts every request its tenant has on the token
  routes (not its ``/v1`` ones).
- Unknown ids are not an error. The answer is the engine's: 200 with an empty
  body, once the aborted requests have answered (or the abort grace passed).
- In fleet mode (and under ``--workers``) the abort goes to every member, as
  ``POST /admin/abort`` does; each member resolves the ids among its own requests.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from trioforward.server.admin._abort import abort_here
from trioforward.server.base._callers import ALL, ID
from trioforward.server.base._errors import RequestError, bad_request
from trioforward.server.front._asgi import Call, Route, respond

__all__ = ["ROUTES"]

_VLLM_PREFIX = "generate-tokens-"


def _sglang_ids(data: dict[str, Any]) -> tuple[list[str], bool]:
    if data.get("abort_all") is not None and not isinstance(data.get("abort_all"), bool):
        raise bad_request("'abort_all' must be true or false", "abort_all")
    rid = data.get("rid", "")
    if not isinstance(rid, str):
        raise bad_request("'rid' must be a string", "rid")
    return ([rid] if rid else []), bool(data.get("abort_all"))


def _vllm_ids(data: dict[str, Any]) -> tuple[list[str], bool]:
    ids = data.get("request_ids")
    if ids is None:
        raise bad_request("Missing 'request_ids' in request body", "request_ids")
    if isinstance(ids, str):
        ids = [ids]
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise bad_request("'request_ids' must be a list of request ids (strings)", "request_ids")
    if len(ids) > 65536:
        raise bad_request("'request_ids' holds more than 65536 ids", "request_ids")
    out = []
    for rid in ids:
        out.append(rid)
        if rid.startswith(_VLLM_PREFIX):  # the id as the answer names it
            out.append(rid[len(_VLLM_PREFIX) :])
    return out, False


_PARSE = {"/abort_request": _sglang_ids, "/inference/v1/abort_requests": _vllm_ids}


def _start(call: Call) -> Awaitable[None]:
    ids, every = _PARSE[call.path](call.data)
    tenant = (call.tenant or call.state.client.tenants.default).name
    wanted = [f"{ALL}{tenant}"] if every else [f"{ID}{tenant} {rid}" for rid in ids]
    return _abort(call, wanted)


async def _abort(call: Call, wanted: list[str]) -> None:
    state = call.state
    if wanted:
        if state.fleet is None:
            await abort_here(state, wanted, None, False)
        else:
            from trioforward.fleet import FleetLagging, StateUnavailable

            try:
                await state.fleet.control.abort(wanted, None, False)
            except (FleetLagging, StateUnavailable) as err:
                code = "fleet_lagging" if isinstance(err, FleetLagging) else "state_unavailable"
                failed = RequestError(503, str(err), type="server_error", code=code)
                await respond(call.send, 503, failed.body())
                return
    # Both engines answer 200 with an empty body and no content type, known ids or
    # not (recorded: tokens_abort_unknown_id).
    await call.send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
    await call.send({"type": "http.response.body", "body": b"", "more_body": False})


ROUTES = {path: Route(_start, empty_body=True) for path in _PARSE}
