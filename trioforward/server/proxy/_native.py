"""The engines' own token routes: ``POST /generate`` (SGLang) and ``POST
/inference/v1/generate`` (vLLM 0.32 with ``--enable-scale-out``), docs/server.md,
"Token routes".

Each goes only to engines of its kind that serve it (``only``: kind and token
route, docs/operations.md, "Engine kinds"); with none registered it is a 404
naming the route. Otherwise it is forwarded as ``/v1/completions`` is — capacity
(one request is one slot, whatever its batch or ``n``), the dispatch deadline,
phase-keyed retries, routing (prefix routing reads ``input_ids`` /
``token_ids``), lazy adapter loading (SGLang names the adapter in
``lora_path``, vLLM in ``model``), auth, admission, metrics, the access log and
the weight-update gate — by the same relay (:mod:`._forward`): the body goes
byte for byte, with one exception routing needs: every attempt gets a fresh
engine-side id (SGLang: ``"rid"`` appended to the body, which a JSON parser
reads last-wins; vLLM: the ``X-Request-Id`` header it prefers over
``request_id``), and the caller's id is put back in the answer in its place.

Only what the gateway relies on is checked (400 naming the field): the prompt
ids a non-empty list of ints (SGLang: or a list of such lists, or ``text``),
``sampling_params`` an object, the budget (``max_new_tokens`` /
``max_tokens``) an int >= 0, ``stream`` a bool. Gateway-made errors keep the
``{"error": {"message", "type", "param", "code", "phase", "attempts"}}`` body
of the OpenAI routes: SGLang's clients read ``error.message``, vLLM's read its
``ErrorResponse`` fields. Engine errors come back verbatim.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import orjson
import trio

from trioforward.dispatch import with_rid
from trioforward.server.base._callers import callers
from trioforward.server.base._errors import RequestError, bad_request
from trioforward.server.front._asgi import Call, Route, respond
from trioforward.server.proxy._forward import FORWARDED, forward, relay_stream

__all__ = ["ROUTES"]

_KIND = {"/generate": "sglang", "/inference/v1/generate": "vllm"}


def _ids(value: Any, batch: bool) -> bool:
    if isinstance(value, list) and value and all(type(t) is int for t in value):
        return True
    return batch and isinstance(value, list) and bool(value) and all(_ids(v, False) for v in value)


def _validate(path: str, data: dict[str, Any]) -> None:
    sglang = path == "/generate"
    key = "input_ids" if sglang else "token_ids"
    if not (sglang and "input_ids" not in data and isinstance(data.get("text"), str | list)):
        if not _ids(data.get(key), sglang):
            raise bad_request(f"{key!r} must be a non-empty list of token ids (ints)", key)
    params = data.get("sampling_params")
    if params is None and sglang:
        params = {}
    if not isinstance(params, dict):
        raise bad_request("'sampling_params' must be an object", "sampling_params")
    budget = "max_new_tokens" if sglang else "max_tokens"
    value = params.get(budget)
    if value is not None and (type(value) is not int or value < 0):
        raise bad_request(f"'sampling_params.{budget}' must be an integer >= 0", f"sampling_params.{budget}")
    stream = data.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("'stream' must be true or false", "stream")
    if sglang:
        _validate_rid(data)


def _validate_rid(data: dict[str, Any]) -> None:
    """SGLang's own ``rid`` rules (``io_struct.py``, ``_normalize_rid``): a string, or
    for a batch a list of strings, one per prompt; a single prompt's list ``rid``
    is refused too (SGLang answers 400 since its fix, 500 before). Checked here
    because the gateway sends its own ids in their place and would otherwise
    hide the mismatch (and hand back its internal id)."""
    rid = data.get("rid")
    if rid is None or isinstance(rid, str):
        return
    if not isinstance(rid, list) or not all(isinstance(r, str) for r in rid):
        raise bad_request("The rid should be a string or a list of strings.", "rid")
    prompts = _prompt_count(data)
    if prompts is None:
        raise bad_request(
            "'rid' is a list but the request has one prompt: a single request takes a string rid",
            "rid",
        )
    if len(rid) != prompts:
        raise bad_request(
            f"The specified rids length mismatch with the batch_size for batch processing"
            f" ({len(rid)} rids, {prompts} prompts).",
            "rid",
        )


def _prompt_count(data: dict[str, Any]) -> int | None:
    """The prompts of an SGLang batch (``input_ids`` a list of lists, or ``text`` a
    list), None for a single prompt."""
    ids, text = data.get("input_ids"), data.get("text")
    if ids is not None:
        return len(ids) if isinstance(ids, list) and ids and isinstance(ids[0], list) else None
    return len(text) if isinstance(text, list) else None


def _start(call: Call) -> Awaitable[None]:
    path, data, state = call.path, call.data, call.state
    _validate(path, data)
    kind = _KIND[path]
    log = call.log
    # The id the caller would see from the engine itself (vLLM prefers the header).
    caller: Any = data.get("rid") if kind == "sglang" else (call.header(b"x-request-id") or data.get("request_id"))
    caller = caller or log.request_id  # none: the request's own id (its X-Request-Id)
    model = data.get("lora_path") if kind == "sglang" else data.get("model")
    prompt = data.get("input_ids") if kind == "sglang" else data.get("token_ids")
    forward_kw: dict[str, Any] = {
        # What adapter loading and prefix routing read; the body goes as it came.
        "json": {"model": model if isinstance(model, str) else None, "prompt": prompt},
        "content": call.body,
        "headers": [(k, v) for k, v in call.headers.items() if k in FORWARDED],
        "session": call.header(b"x-session-id"),
        "on_dispatch": log.dispatching,
        "span": log.span,
        "request_id": log.request_id,
        "group": log.group,
        "only": lambda e: e.kind == kind and bool(e.token_route),
        "tenant": call.tenant,
    }
    sent: list[str] = []  # each attempt's engine-side id
    batch_size = _prompt_count(data) if kind == "sglang" else None
    count = batch_size if batch_size is not None and isinstance(caller, list) else 0

    def render(engine: Any, engine_id: str) -> tuple[str, bytes]:
        sent.append(engine_id)
        if kind != "sglang":
            return path, call.body  # the id goes as X-Request-Id
        rid: str | list[str] = [f"{engine_id}-{i}" for i in range(count)] if count else engine_id
        return path, with_rid(call.body, rid)

    forward_kw["render"] = render
    transform = _restore(caller, sent, log.request_id or "")
    relay = relay_stream if data.get("stream") else forward
    work = relay(state, path, forward_kw, call.send, log, transform)
    return _served(call, kind, work, _caller_ids(caller, batch_size))


def _caller_ids(caller: Any, batch_size: int | None) -> list[str]:
    """The ids the engines' abort routes may name this request by (:mod:`._native_abort`):
    the caller's, and for an SGLang batch with one string ``rid`` its items' ``<rid>_<i>``."""
    if isinstance(caller, list):
        return [str(c) for c in caller]
    ids = [str(caller)]
    if batch_size is not None:
        ids.extend(f"{caller}_{i}" for i in range(batch_size))
    return ids


async def _known_as(call: Call, ids: list[str], work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` known by the caller's ``ids`` in its tenant meanwhile."""
    table = callers(call.state)
    tenant = (call.tenant or call.state.client.tenants.default).name
    request_id = call.log.request_id or ""
    keys = table.register(tenant, ids, request_id)
    try:
        await work
    finally:
        table.drop(tenant, keys, request_id)


async def _served(call: Call, kind: str, work: Coroutine[Any, Any, None], ids: list[str]) -> None:
    """Run ``work`` (known by the caller's ``ids``) if an engine of ``kind`` serves the
    route (waiting up to ``health_timeout`` for kinds still being detected), else
    answer 404 naming it."""
    engines = call.state.client.engines
    if any(e.kind == kind and e.token_route for e in engines.list()):
        return await _known_as(call, ids, work)
    with trio.move_on_after(call.state.settings.health_timeout):
        for info in engines.list():
            if info.kind is None or info.token_route is None:
                try:
                    await engines.wait_kind(info.url)
                except KeyError:
                    pass  # removed meanwhile
    if any(e.kind == kind and e.token_route for e in engines.list()):
        return await _known_as(call, ids, work)
    work.close()
    err = RequestError(
        404,
        f"no engine serves {call.path} (it goes to {kind} engines serving it only; see GET /admin/engines)",
        code="route_not_served",
    )
    log = call.log
    log.status, log.error, log.complete = 404, err.code, True
    await respond(call.send, 404, err.body())


def _restore(caller: Any, sent: list[str], request_id: str) -> Callable[[bytes], bytes] | None:
    """The answer bytes with the last attempt's engine-side id put back as the
    caller's (None: the caller gave none, the engine's stays). The id is unique
    (``<request id>.<attempt>``), so a byte replace touches nothing else; the
    relay applies it to whole events only. A request aborted before any attempt
    answers with the gateway's request id in vLLM's ``generate-tokens-<id>``
    (dispatch/dialects/_abort_answers.py): the caller's goes there."""
    if isinstance(caller, str) and caller:
        unsent = (f'"generate-tokens-{request_id}"'.encode(), f'"generate-tokens-{caller}"'.encode())

        def one(data: bytes) -> bytes:
            return data.replace(sent[-1].encode(), caller.encode()) if sent else data.replace(*unsent)

        return one
    if isinstance(caller, list):

        def per_item(data: bytes) -> bytes:
            if not sent:
                return data
            for i, rid in enumerate(caller):
                data = data.replace(f'"{sent[-1]}-{i}"'.encode(), orjson.dumps(str(rid)))
            return data

        return per_item
    return None


ROUTES = {path: Route(_start, access_log=True) for path in _KIND}
