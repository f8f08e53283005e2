"""An ASGI layer in front of Quart for the two calls every sample makes: ``asample`` and
``retrieve_future``.

A trainer sends two requests per sample, so these carry all of the Tinker load.
Served here directly (the way the server's OpenAI data plane is), they skip
Quart's request context, hooks, response objects and the two tasks quart-trio
runs per request; every other Tinker route stays a Quart view. The behaviour
is the routes': the same handlers (``_handlers.py``), the same API-key check
(``trioforward.server._auth.check_auth``) and body size limit.

A held poll watches for the client going away (ASGI ``http.disconnect``) and
then stops holding; the sample itself is never touched. A result counts as
delivered once Hypercorn accepted the whole response body.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import trio

from trioforward.server._state import STATE_KEY, GatewayState
from trioforward.server.tinker._futures import PENDING, Future
from trioforward.server.tinker._handlers import asample, error, lookup, parse_json
from trioforward.server.tinker._requests import BadRequest
from trioforward.server.tinker._state import TinkerState, state_of
from trioforward.server.tinker._wire import JSON, TRY_AGAIN

__all__ = ["TinkerFastPath", "ASAMPLE", "RETRIEVE"]

log = logging.getLogger("trioforward.tinker")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

ASAMPLE = "/api/v1/asample"
RETRIEVE = "/api/v1/retrieve_future"
_JSON = JSON.encode()


class _Disconnected(Exception):
    """The client went away before its request body was complete."""


class _TooLarge(Exception):
    """The request body is larger than ``max_body_size``."""


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _send(send: Send, status: int, body: bytes, content_type: bytes = _JSON) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class TinkerFastPath:
    """ASGI callable: serves :data:`ASAMPLE` and :data:`RETRIEVE`, passes the rest to ``inner``."""

    def __init__(self, app: Any, inner: Callable[..., Awaitable[None]]) -> None:
        self.app = app
        self.inner = inner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] in (ASAMPLE, RETRIEVE)
        ):
            gateway: GatewayState | None = self.app.extensions.get(STATE_KEY)
            if gateway is not None:
                await self._handle(gateway, scope, receive, send)
                return
        await self.inner(scope, receive, send)

    async def _handle(
        self, gateway: GatewayState, scope: Scope, receive: Receive, send: Send
    ) -> None:
        from trioforward.server._auth import check_auth
        from trioforward.server._errors import RequestError

        path: str = scope["path"]
        settings = gateway.settings
        try:
            if settings.api_keys:
                headers = dict(scope["headers"])
                check_auth(settings, path, lambda name: _text(headers.get(name.encode())))
            body = parse_json(await _read_body(receive, settings.max_body_size))
            state = state_of(gateway)
            if path == ASAMPLE:
                status, data = asample(state, body)
                await _send(send, status, data)
            else:
                await self._retrieve(state, body, receive, send)
        except RequestError as err:
            await _send(send, err.status, err.body())
        except BadRequest as err:
            await _send(send, *error(400, str(err), "invalid_request"))
        except _TooLarge:
            message = f"request body larger than {settings.max_body_size} bytes"
            await _send(send, *error(413, message, "request_too_large"))
        except _Disconnected:
            return

    async def _retrieve(
        self, state: TinkerState, body: dict[str, Any], receive: Receive, send: Send
    ) -> None:
        found = lookup(state, body)
        if not isinstance(found, Future):
            await _send(send, *found)
            return
        future: Future | None = found
        if found.state == PENDING:
            future, gone = await _hold(state, found, receive)
            if gone:
                return  # the client left: nothing to answer, the sample runs on
            if future is None:
                await _send(send, 408, TRY_AGAIN)
                return
        assert future is not None
        await _send(send, 200, future.body, future.content_type.encode())
        state.store.mark_delivered(future)


async def _hold(state: TinkerState, future: Future, receive: Receive) -> tuple[Future | None, bool]:
    """Wait up to the hold for ``future``; ``(finished future or None, client gone)``."""
    result: list[Future | None] = [None]
    gone = [False]

    async def watch(scope: trio.CancelScope) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                gone[0] = True
                scope.cancel()
                return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch, nursery.cancel_scope)
        result[0] = await state.store.wait(future.request_id)
        nursery.cancel_scope.cancel()
    return result[0], gone[0]


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")
