"""JSON error bodies of the gateway (docs/server.md, "Errors"), encoded once with orjson.

Gateway-made errors use the OpenAI shape ``{"error": {"message", "type", "code",
...}}``; dispatch failures use :meth:`TrioforwardError.to_json` (which adds
``phase``, ``attempts`` and ``engine``). An engine's own error answer is never
rewritten: the server returns it verbatim.
"""

from __future__ import annotations

from typing import Any

import orjson

from trioforward.errors import TrioforwardError

__all__ = [
    "RequestError",
    "error_body",
    "dispatch_error_body",
    "dispatch_error_headers",
    "passed_on",
    "PASSED_ON",
    "JSON_CONTENT_TYPE",
]

# The engine's response headers that come with its status and body to the client
# (docs/server.md, "Headers passed on"): end-to-end fields a client acts on.
# Retry-After: when to retry a 429/503/3xx (RFC 9110 §10.2.3; the openai SDK's
# backoff reads it). Content-Encoding: the body is passed on as is, so its
# coding must be too (§8.4). Never hop-by-hop fields (§7.6.1), never Set-Cookie
# or authentication challenges: the engine's client is the gateway, not the
# trainer. Content-Type goes separately. Not the engine's X-Request-Id (vLLM's
# --enable-request-id-headers echoes the engine-side id): the answer carries the
# request's own id (docs/server.md, "Request ids and rollout groups").
PASSED_ON = frozenset((b"retry-after", b"content-encoding"))
_NONE: tuple[tuple[bytes, bytes], ...] = ()

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
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # s: sent as Retry-After (a 429/503)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param

    def body(self) -> bytes:
        """The encoded JSON body."""
        return error_body(self.message, type=self.type, code=self.code, param=self.param)

    def headers(self) -> tuple[tuple[bytes, bytes], ...]:
        """Extra response headers: ``Retry-After`` when set."""
        if self.retry_after is None:
            return _NONE
        return ((b"retry-after", b"%d" % self.retry_after),)


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
    """The JSON body of a dispatch failure (docs/server.md, "Errors") (with phase, attempts and engine)."""
    return orjson.dumps(error.to_json())


def dispatch_error_headers(error: TrioforwardError) -> tuple[tuple[bytes, bytes], ...]:
    """``Retry-After`` of a gateway-made 429/503 (computed by the dispatch core)."""
    if error.retry_after is None:
        return _NONE
    return ((b"retry-after", b"%d" % error.retry_after),)


def passed_on(headers: list[tuple[bytes, bytes]]) -> tuple[tuple[bytes, bytes], ...]:
    """The :data:`PASSED_ON` fields of an engine answer's ``headers`` (lower-case names)."""
    return tuple([h for h in headers if h[0] in PASSED_ON])


def bad_request(message: str, param: str | None = None) -> RequestError:
    """A 400 naming ``param``."""
    return RequestError(400, message, param=param, code="invalid_request")
