"""vLLM's error answers, as the simulated engine gives them (no I/O).

Every error body is ``{"error": {"message", "type", "param", "code"}}``, as
vLLM 0.32 answers (``vllm/entrypoints/openai/protocol.py``, ``ErrorResponse``;
recorded answers in ``tests/sim/vllm_0_32_fixtures/``, docs/compatibility.md):

- a request that fails schema validation (not JSON, a field of the wrong type,
  a required field missing) is 400 with ``type: "Bad Request"`` and
  ``param: "body.FIELD"`` (FastAPI's ``RequestValidationError`` rendered by vLLM);
- a value out of range is 400 ``BadRequestError`` with ``param: "FIELD"`` and
  the message ending ``(parameter=FIELD, value=VALUE)``;
- an unknown model is 404 ``NotFoundError`` with ``param: "model"``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

__all__ = [
    "ApiError",
    "error_body",
    "invalid_json",
    "invalid_field",
    "missing_field",
    "out_of_range",
    "unknown_model",
    "sanitize_message",
]

# vLLM 0.32 rewrites every error message it sends: paths under these roots, and
# any path ending in a file name, become "<path>" (vllm/entrypoints/serve/
# exception_handling/utils.py, sanitize_message).
_SYSTEM_PATH = re.compile(r"/(?:home|usr|opt|var|tmp|root|lib|mnt|srv)(?:/[\w.\-]+)+")
_FILE_PATH = re.compile(r"(?:/[\w\-]+)+/[\w\-]+\.\w+")


def sanitize_message(message: str) -> str:
    """``message`` with file-system paths replaced by ``<path>``, as vLLM answers it."""
    return _FILE_PATH.sub("<path>", _SYSTEM_PATH.sub("<path>", message)).strip()


def error_body(message: str, type: str, code: int, param: str | None = None) -> bytes:
    """``{"error": {"message", "type", "param", "code"}}`` as vLLM answers errors."""
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


class ApiError(Exception):
    """A request the engine answers with ``status`` and an OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "BadRequestError",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.status, self.param)


def _validation(kind: str, loc: str, msg: str, value: Any, **ctx: str) -> ApiError:
    # pydantic's error list as vLLM prints it: one dict per error, Python repr.
    detail: dict[str, Any] = {"type": kind, "loc": loc, "msg": msg, "input": value}
    if ctx:
        detail["ctx"] = ctx
    return ApiError(400, f"1 validation error:\n  {detail!r}", "Bad Request", loc)


def invalid_json(data: bytes) -> ApiError:
    """The 400 for a body that is not JSON: ``param`` is ``body.OFFSET`` and the
    message quotes Python's json error, as FastAPI (which parses with it) in vLLM."""
    pos, why = 0, "Invalid JSON"  # also when orjson refused what json accepts (NaN, huge ints)
    try:
        json.loads(data)
    except json.JSONDecodeError as exc:
        pos, why = exc.pos, exc.msg
    except UnicodeDecodeError as exc:
        pos, why = exc.start, exc.reason
    return _validation(
        "json_invalid", f"body.{pos}", "JSON decode error", "<dict of 0 items>", error=why
    )


# pydantic v2's type errors: (error type, message) for a string input, then for any other.
_TYPE_ERRORS = {
    "integer": (
        ("int_parsing", "Input should be a valid integer, unable to parse string as an integer"),
        ("int_type", "Input should be a valid integer"),
    ),
    "number": (
        ("float_parsing", "Input should be a valid number, unable to parse string as a number"),
        ("float_type", "Input should be a valid number"),
    ),
}


def invalid_field(field: str, expected: str, value: Any) -> ApiError:
    """The 400 for a field of the wrong type (``expected``: "integer", "number", "string", ...)."""
    generic = (f"{expected}_type", f"Input should be a valid {expected}")
    parsing, other = _TYPE_ERRORS.get(expected, (generic, generic))
    kind, msg = parsing if isinstance(value, str) else other
    return _validation(kind, f"body.{field}" if field else "body", msg, value)


def missing_field(field: str, body: dict[str, Any]) -> ApiError:
    """The 400 for a required field that is absent."""
    return _validation("missing", f"body.{field}", "Field required", f"<dict of {len(body)} items>")


def out_of_range(field: str, message: str, value: Any) -> ApiError:
    """The 400 ``BadRequestError`` for a value vLLM's sampling parameters refuse."""
    return ApiError(400, f"{message} (parameter={field}, value={value})", param=field)


def unknown_model(name: str, base: tuple[str, ...], status: int = 404) -> ApiError:
    """The answer to a request naming a model the engine does not serve.

    vLLM 0.32 lists the base models' names (not the adapters) as "Valid aliases".
    ``status`` 400 reproduces engines that answer 400 for it (docs/compatibility.md).
    """
    aliases = ", ".join(base)
    kind = "NotFoundError" if status == 404 else "BadRequestError"
    return ApiError(
        status, f"The model `{name}` does not exist. Valid aliases: {aliases}.", kind, "model"
    )
