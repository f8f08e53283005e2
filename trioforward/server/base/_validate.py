"""Validation of OpenAI request bodies before anything is forwarded.

Only what the gateway itself relies on, or what would waste an engine round trip
when wrong, is checked: the JSON shape, the fields a request cannot do without
(``prompt`` for completions; ``messages`` for chat) and the types of the
fields that change how the gateway handles the request (``stream``, ``n``,
``max_tokens``) or that vLLM would reject anyway. Everything else goes to the
engine untouched: its own 400 comes back verbatim. Every failure is a
:class:`RequestError` with status 400 whose message and ``param`` name the field.
"""

from __future__ import annotations

from typing import Any

import orjson

from trioforward.dispatch import WeightPolicy, bad_id_reason, parse_policy
from trioforward.server.base._errors import bad_request

__all__ = ["parse_body", "validate_completion", "validate_chat", "request_identity", "weight_policy"]


def request_identity(headers: dict[bytes, bytes], client: Any) -> tuple[str, str | None]:
    """``(request id, rollout group)`` of a request (docs/server.md, "Request ids
    and rollout groups"): the ``X-Request-Id`` header, else a fresh id of
    ``client``; the ``X-Rollout-Group`` header or ``None``. Raises
    :class:`RequestError` (400 naming the header) for a value that is not
    printable ASCII without spaces of 1..128 characters."""
    raw = headers.get(b"x-request-id")
    if raw is None:
        request_id = client.new_request_id()
    else:
        request_id = _header_id(raw, "X-Request-Id")
    raw = headers.get(b"x-rollout-group")
    return request_id, None if raw is None else _header_id(raw, "X-Rollout-Group")


def weight_policy(headers: dict[bytes, bytes]) -> WeightPolicy | None:
    """The request's ``X-Weight-Policy`` (docs/operations.md, "Which weights a
    request accepts"), or ``None``; :class:`RequestError` (400 naming the
    header) when malformed."""
    raw = headers.get(b"x-weight-policy")
    if raw is None:
        return None
    try:
        return parse_policy(raw.decode("latin-1"))
    except ValueError as exc:
        raise bad_request(f"header X-Weight-Policy: {exc}", "X-Weight-Policy") from None


def _header_id(raw: bytes, header: str) -> str:
    value = raw.decode("latin-1")
    reason = bad_id_reason(value)
    if reason is not None:
        raise bad_request(f"header {header} {reason}", header)
    return value


def parse_body(body: bytes | str, *, allow_empty: bool = False) -> dict[str, Any]:
    """The request body as a JSON object (``{}`` for an empty body when
    ``allow_empty``); raises :class:`RequestError` (400) otherwise, for bytes that
    are not JSON with the message ``request body is not valid JSON (line L,
    column C)`` (1-based, as ``json.JSONDecodeError`` counts them)."""
    if not body:
        if allow_empty:
            return {}
        raise bad_request("request body is empty; expected a JSON object")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        # Where, not orjson's own words ("invalid literal"): the position is what
        # a caller needs to find the fault.
        raise bad_request(
            f"request body is not valid JSON (line {exc.lineno}, column {exc.colno})"
        ) from None
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object")
    return data


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_common(data: dict[str, Any]) -> None:
    model = data.get("model")
    # Absent, null or "": the one served model, as vLLM (_served_model.py).
    if model is not None and not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    stream = data.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", "stream")
    n = data.get("n")
    if n is not None and (not _is_int(n) or n < 1):
        raise bad_request("'n' must be an integer >= 1", "n")
    for name in ("max_tokens", "max_completion_tokens"):
        value = data.get(name)
        if value is not None and (not _is_int(value) or value < 0):
            raise bad_request(f"{name!r} must be an integer >= 0", name)
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        value = data.get(name)
        if value is not None and not _is_number(value):
            raise bad_request(f"{name!r} must be a number", name)
    for name in ("seed", "top_k"):
        value = data.get(name)
        if value is not None and not _is_int(value):
            raise bad_request(f"{name!r} must be an integer", name)
    stop = data.get("stop")
    if stop is not None and not isinstance(stop, str):
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise bad_request("'stop' must be a string or a list of strings", "stop")
    stream_options = data.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")


def _is_token_list(value: object) -> bool:
    return isinstance(value, list) and all(_is_int(t) for t in value)


def validate_completion(data: dict[str, Any]) -> None:
    """``POST /v1/completions``: ``prompt`` is a string, a list of token ids, or a
    non-empty list of either (vLLM's accepted shapes)."""
    _check_common(data)
    if "prompt" not in data or data["prompt"] is None:
        raise bad_request("missing required field 'prompt'", "prompt")
    prompt = data["prompt"]
    if isinstance(prompt, str) or (_is_token_list(prompt) and prompt):
        pass
    elif (
        isinstance(prompt, list)
        and prompt
        and (
            all(isinstance(p, str) for p in prompt) or all(_is_token_list(p) and p for p in prompt)
        )
    ):
        pass
    else:
        raise bad_request(
            "'prompt' must be a string, a list of token ids, or a list of either", "prompt"
        )
    logprobs = data.get("logprobs")
    if logprobs is not None and not _is_int(logprobs):
        raise bad_request("'logprobs' must be an integer", "logprobs")


def validate_chat(data: dict[str, Any]) -> None:
    """``POST /v1/chat/completions``: ``messages`` is a non-empty list of objects,
    each with a string ``role``."""
    _check_common(data)
    messages = data.get("messages")
    if messages is None:
        raise bad_request("missing required field 'messages'", "messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad_request(f"'messages[{i}]' must be an object", f"messages[{i}]")
        if not isinstance(message.get("role"), str):
            raise bad_request(f"'messages[{i}].role' must be a string", f"messages[{i}].role")
    logprobs = data.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise bad_request("'logprobs' must be a boolean", "logprobs")
