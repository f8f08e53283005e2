"""JSON error bodies of the gateway (DESIGN §5), encoded once with orjson.

Gateway-made errors use the OpenAI shape ``{"error": {"message", "type", "code",
...}}``; dispatch failures use :meth:`TrioforwardError.to_json` (which adds
``phase``, ``attempts`` and ``engine``). An engine's own error answer is never
rewritten: the server returns it verbatim.
"""

from __future__ import annotations

from typing import Any

import orjson

from trioforward.errors import TrioforwardError

__all__ = ["RequestError", "error_body", "dispatch_error_body", "JSON_CONTENT_TYPE"]

JSON_CONTENT_TYPE = "application/json"


class RequestError(Exception):
    """The client's request is unusable. ``.status`` (400, 401, 404, 405, 413) and the
    error body are what the client gets; ``.param`` names the offending field."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param

    def body(self) -> bytes:
        """The encoded JSON body."""
        return error_body(self.message, type=self.type, code=self.code, param=self.param)


def error_body(
    message: str,
    *,
    type: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
) -> bytes:
    """``{"error": {"message", "type", "code", "param"}}`` as bytes."""
    error: dict[str, Any] = {"message": message, "type": type, "code": code, "param": param}
    return orjson.dumps({"error": error})


def dispatch_error_body(error: TrioforwardError) -> bytes:
    """DESIGN §5 body of a dispatch failure (with phase, attempts and engine)."""
    return orjson.dumps(error.to_json())


def bad_request(message: str, param: str | None = None) -> RequestError:
    """A 400 naming ``param``."""
    return RequestError(400, message, param=param, code="invalid_request")
