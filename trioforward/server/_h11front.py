"""The HTTP/1.1 framings the front refuses, answered as JSON: a private hook into
Hypercorn 0.18's ``H11Protocol`` (used by our worker, ``_tcpserver``).

h11 frames a request that carries both ``Content-Length`` and
``Transfer-Encoding: chunked`` by the chunked coding alone (RFC 9112 §6.3), and
Hypercorn then reads the next request from what follows the chunked body on the
same connection. Behind a proxy that frames by ``Content-Length`` the two disagree
on where the request ends, so a client can smuggle a request (an admin call) past
the proxy. RFC 9112 §6.1 lets a server process such a request by
Transfer-Encoding only if it closes the connection after answering; the front
refuses it instead, as most servers now do: a 400 JSON answer with
``Connection: close``, nothing of the request or what follows it handed to the app,
the connection closed (:meth:`FrontH11Protocol._create_stream`).

h11's own refusals (a malformed request line or header, two different
Content-Length values, a Transfer-Encoding other than ``chunked``, a bad chunk, a
head over ``h11_max_incomplete_size``) are answered by Hypercorn with an empty
body; here they carry the JSON error body of every other refusal, with h11's
reason as the message (:meth:`FrontH11Protocol._send_error_response`). The list is
in docs/server.md, "Framings the front refuses".

What it relies on, checked by ``tests/server/test_private_hooks.py`` (fails when
the pinned Hypercorn changes any of it):

- ``H11Protocol.__init__``'s arguments (the same as ``ProtocolWrapper``'s, minus
  the ALPN protocol) and its ``connection``, ``send`` and ``client`` attributes;
- ``H11Protocol._handle_events`` calling ``_create_stream(request)`` for each
  request (after sending ``Updated(idle=False)``), breaking out of its loop on
  the body's events while ``stream`` is ``None``, and calling
  ``_send_error_response(status)`` inside its ``except h11.RemoteProtocolError``
  block (the reason is read from the exception being handled);
- ``_send_h11_event(event)`` turning an h11 event into ``RawData`` for ``send``.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

import orjson
from hypercorn.events import Closed
from hypercorn.protocol.h11 import H11Protocol

from trioforward._h11 import front_h11

if TYPE_CHECKING:
    import h11
else:
    h11 = front_h11()  # the h11 Hypercorn's H11Protocol uses (trioforward._h11)

__all__ = ["FrontH11Protocol", "ambiguous_framing", "refuse_ambiguous"]

log = logging.getLogger("trioforward.server")

FRAMING_MESSAGE = (
    "a request may not carry both Content-Length and Transfer-Encoding "
    "(RFC 9112 section 6.1); the connection is closed"
)
_REASON_LIMIT = 200  # characters of h11's reason kept in the message
_DRAIN_LIMIT = 64 << 20  # bytes of an ambiguous request's body read before answering


def ambiguous_framing(headers: object) -> bool:
    """Whether ``headers`` (``(name, value)`` byte pairs, names lower-case as h11
    and Hypercorn give them) carry both ``content-length`` and ``transfer-encoding``."""
    length = coding = False
    for name, _ in headers:  # type: ignore[attr-defined]
        if name == b"content-length":
            length = True
        elif name == b"transfer-encoding":
            coding = True
    return length and coding


def refusal_body(message: str, code: str) -> bytes:
    """The JSON error body of a refusal (docs/server.md, "Errors")."""
    return orjson.dumps(
        {"error": {"message": message, "type": "invalid_request_error", "code": code, "param": None}}
    )


async def refuse_ambiguous(receive: Any, send: Any) -> None:
    """The ASGI app's refusal of an ambiguous framing, under another server than
    ours (whose protocol refuses it before any app runs): a 400 JSON answer with
    ``Connection: close`` on every route, so the server reads nothing after it.
    The body is read first (up to 64 MiB): Hypercorn, meeting the bytes after a
    body it is still reading once a must-close answer has started, closes the
    connection in the middle of that answer."""
    size = 0
    while size <= _DRAIN_LIMIT:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            break
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(_AMBIGUOUS)),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": _AMBIGUOUS, "more_body": False})


_AMBIGUOUS = refusal_body(FRAMING_MESSAGE, "ambiguous_framing")


class FrontH11Protocol(H11Protocol):
    """Hypercorn's ``H11Protocol`` refusing ambiguous framings with a JSON 400 and
    giving h11's own refusals a JSON body (module docstring)."""

    async def _create_stream(self, request: h11.Request) -> None:
        if ambiguous_framing(request.headers):
            log.warning(
                "refused %s %s from %s: Content-Length and Transfer-Encoding together (400, closed)",
                request.method.decode("latin-1"),
                request.target.decode("latin-1")[:200],
                _client(self.client),
            )
            # No stream: the body and anything after it are never handed on (h11
            # keeps them in its buffer; _handle_events stops at the first body
            # event while there is no stream), and the connection closes.
            await self._refuse(400, _AMBIGUOUS)
            await self.send(Closed())
            return
        await super()._create_stream(request)

    async def _send_error_response(self, status_code: int) -> None:
        # Called by _handle_events inside its ``except h11.RemoteProtocolError``.
        error = sys.exc_info()[1]
        reason = str(error)[:_REASON_LIMIT] if isinstance(error, h11.RemoteProtocolError) else ""
        message = "malformed HTTP/1.1 request" + (f": {reason}" if reason else "")
        await self._refuse(status_code, refusal_body(message, "malformed_request"))

    async def _refuse(self, status: int, body: bytes) -> None:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
            (b"connection", b"close"),
            *self.config.response_headers("h11"),
        ]
        await self._send_h11_event(h11.Response(status_code=status, headers=headers))
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())


def _client(client: tuple[str, int] | None) -> str:
    return "an unknown peer" if client is None else f"{client[0]}:{client[1]}"
