"""The gateway's worker (``server/front/_worker.py``, ``_tcpserver.py``, ``_appchannel.py``)
serves HTTP/1.1 exactly as stock Hypercorn does.

Each test runs the same bare ASGI app and the same bytes under the gateway's
worker and under stock ``hypercorn.trio.serve``, and asserts both give the app
the same scope and messages and the client the same bytes (the ``date`` header
aside): request bodies with a length or chunked, ``Expect: 100-continue``,
fixed-length, streamed, empty and HEAD responses, HTTP/1.0, an app that fails
before or after its response starts, a client that hangs up, keep-alive, a
WebSocket upgrade.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pytest
import trio
from asgi_harness import answer_lifespan, serve_asgi

from trioforward._settings import Settings
from trioforward.server.app._serve import hypercorn_config

SERVERS = ["our-worker", "stock-hypercorn"]
App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


def _asgi(handle: App) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        await handle(scope, receive, send)

    return app


@asynccontextmanager
async def _serve(handle: App, server: str) -> AsyncIterator[int]:
    """``handle`` served on a free loopback port by ``server``; yields the port."""
    if server == "our-worker":
        async with serve_asgi(_asgi(handle), Settings()) as (port, _):
            yield port
        return
    from hypercorn.trio import serve as hypercorn_serve

    stop = trio.Event()
    config = hypercorn_config(Settings(), bind="127.0.0.1:0")
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(hypercorn_serve, _asgi(handle), config, shutdown_trigger=stop.wait))
        try:
            yield int(binds[0].rpartition(":")[2])
        finally:
            stop.set()


async def _exchange(port: int, *parts: bytes, wait_for: bytes | None = None) -> bytes:
    """Sends ``parts`` (after the first, waits until the answer so far holds
    ``wait_for``), then reads until the server closes; returns what it sent."""
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        received = b""
        with trio.fail_after(10):
            for i, part in enumerate(parts):
                if i and wait_for is not None:
                    while wait_for not in received:
                        received += await stream.receive_some(65536)
                await stream.send_all(part)
            while chunk := await stream.receive_some(65536):
                received += chunk
    return re.sub(rb"\r\ndate: [^\r]*", b"", received)


async def _both(handle: App, *parts: bytes, wait_for: bytes | None = None) -> list[bytes]:
    answers = []
    for server in SERVERS:
        async with _serve(handle, server) as port:
            answers.append(await _exchange(port, *parts, wait_for=wait_for))
    return answers


async def _answer(send: Any, body: bytes) -> None:
    headers = [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _fixed(body: bytes) -> App:
    """Reads the request, answers ``body`` with its length."""

    async def handle(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        await _answer(send, body)

    return handle


GET = b"GET /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"


async def test_the_app_gets_the_same_scope() -> None:
    scopes: list[dict[str, Any]] = []

    async def handle(scope: dict[str, Any], receive: Any, send: Any) -> None:
        scopes.append(scope)
        await _fixed(b"")(scope, receive, send)

    request = (
        b"POST /a%20b/c?q=1&r=%2F HTTP/1.1\r\nHost: t\r\nX-Mixed-Case: One\r\nx-repeat: 1\r\n"
        b"x-repeat: 2\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi"
    )
    await _both(handle, request)
    ours, stock = scopes
    for scope in scopes:
        assert scope["client"][0] == "127.0.0.1" and scope["server"][0] == "127.0.0.1"
        del scope["client"], scope["server"], scope["extensions"]
    assert ours == stock
    assert ours["path"] == "/a b/c" and ours["raw_path"] == b"/a%20b/c"
    assert ours["query_string"] == b"q=1&r=%2F" and ours["method"] == "POST"
    assert (b"x-mixed-case", b"One") in ours["headers"]


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\nConnection: close\r\n\r\nhello world",
        b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    ],
    ids=["content-length", "chunked", "empty"],
)
async def test_request_bodies_arrive_whole(request_bytes: bytes) -> None:
    bodies: list[bytes] = []

    async def handle(scope: dict[str, Any], receive: Any, send: Any) -> None:
        parts = []
        while True:
            message = await receive()
            assert message["type"] == "http.request"
            parts.append(message["body"])
            if not message["more_body"]:
                break
        bodies.append(b"".join(parts))
        await _answer(send, b"ok")

    ours, stock = await _both(handle, request_bytes)
    assert ours == stock and ours.endswith(b"\r\n\r\nok")
    expected = b"" if b"Length: 0" in request_bytes else b"hello world"
    assert bodies == [expected, expected]


async def test_expect_100_continue() -> None:
    head = b"POST / HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 2\r\nConnection: close\r\n\r\n"
    ours, stock = await _both(_fixed(b"ok"), head, b"hi", wait_for=b"HTTP/1.1 100 ")
    assert ours == stock
    assert ours.startswith(b"HTTP/1.1 100 ") and b"HTTP/1.1 200 " in ours and ours.endswith(b"ok")


async def _streamed(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    for i in range(3):
        await send({"type": "http.response.body", "body": b"data: %d\n\n" % i, "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


async def _empty_end(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"part", "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _no_content(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 204, "headers": [(b"x-a", b" padded ")]})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _two_fixed_chunks(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 201, "headers": [(b"Content-Length", b"6")]})
    await send({"type": "http.response.body", "body": b"abc", "more_body": True})
    await send({"type": "http.response.body", "body": b"def", "more_body": False})


@pytest.mark.parametrize(
    "handle",
    [_fixed(b'{"ok":true}'), _streamed, _empty_end, _no_content, _two_fixed_chunks],
    ids=["fixed-length", "streamed", "streamed-empty-end", "204", "fixed-in-two-chunks"],
)
async def test_responses_are_the_same_bytes(handle: App) -> None:
    ours, stock = await _both(handle, GET)
    assert ours == stock
    assert ours.startswith(b"HTTP/1.1 20")


@pytest.mark.parametrize("handle", [_fixed(b"hello"), _streamed], ids=["fixed-length", "streamed"])
async def test_an_http_1_0_client_gets_the_same_bytes(handle: App) -> None:
    # HTTP/1.0: no chunked framing, the connection closes after the response.
    ours, stock = await _both(handle, b"GET /x HTTP/1.0\r\nHost: t\r\n\r\n")
    assert ours == stock
    assert ours.startswith(b"HTTP/1.1 200") and b"chunked" not in ours


async def test_head_gets_the_headers_without_the_body() -> None:
    # Then a GET on the same connection: a HEAD answer must not break keep-alive.
    head = b"HEAD /x HTTP/1.1\r\nHost: t\r\n\r\n"
    ours, stock = await _both(_fixed(b"hello"), head, GET, wait_for=b"\r\n\r\n")
    assert ours == stock
    first, _, second = ours.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200") and b"content-length: 5" in first
    assert second.startswith(b"HTTP/1.1 200") and second.endswith(b"\r\n\r\nhello")


async def test_an_app_failing_before_its_response_gets_a_500_and_a_close(caplog: Any) -> None:
    async def fail(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    # Keep-alive request: the 500 closes the connection anyway.
    ours, stock = await _both(fail, b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    assert ours == stock
    assert ours.startswith(b"HTTP/1.1 500") and b"connection: close" in ours
    assert sum("Error in ASGI Framework" in r.getMessage() for r in caplog.records) == 2


async def test_an_app_failing_after_a_fixed_length_head_closes_the_connection() -> None:
    async def fail(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
        raise RuntimeError("boom")

    ours, stock = await _both(fail, b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    assert ours == stock
    assert ours.startswith(b"HTTP/1.1 200") and ours.endswith(b"\r\n\r\n")


@pytest.mark.parametrize("server", SERVERS)
async def test_keep_alive_serves_requests_in_turn(server: str) -> None:
    paths: list[str] = []

    async def handle(scope: dict[str, Any], receive: Any, send: Any) -> None:
        paths.append(scope["path"])
        await _fixed(scope["path"].encode())(scope, receive, send)

    async with _serve(handle, server) as port:
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            for i in range(3):
                await stream.send_all(b"POST /%d HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\nx" % i)
                data = b""
                with trio.fail_after(10):
                    while not data.endswith(b"/%d" % i):
                        data += await stream.receive_some(65536)
                assert data.startswith(b"HTTP/1.1 200") and b"connection: close" not in data
    assert paths == ["/0", "/1", "/2"]


@pytest.mark.parametrize("server", SERVERS)
async def test_a_client_hanging_up_is_an_http_disconnect(server: str) -> None:
    received: list[str] = []
    done = trio.Event()

    async def handle(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (message := await receive())["more_body"]:
            pass
        received.append(message["type"])
        received.append((await receive())["type"])  # waits: the client hangs up
        done.set()

    async with _serve(handle, server) as port:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\nx")
        await trio.testing.wait_all_tasks_blocked()
        await stream.aclose()
        with trio.fail_after(10):
            await done.wait()
    assert received == ["http.request", "http.disconnect"]


async def test_a_websocket_upgrade_is_served() -> None:
    kinds: list[str] = []

    async def handle(scope: dict[str, Any], receive: Any, send: Any) -> None:
        kinds.append(scope["type"])
        if scope["type"] == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": 1000})

    request = (
        b"GET /ws HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    async with _serve(handle, "our-worker") as port:
        answer = await _exchange(port, request)
    assert answer.startswith(b"HTTP/1.1 101") and kinds == ["websocket"]


async def _two_starts(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.start", "status": 200, "headers": []})


async def _trailers(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [], "trailers": True})
    await send({"type": "http.response.body", "body": b"abc", "more_body": False})


async def _pseudo_header(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b":status", b"200")]})


async def _mixed_case_padded(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await receive()
    headers = [(b" Content-Length ", b" 2 "), (b"X-Tag", b"\tv\t"), (b"x-tag", b"w")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok", "more_body": False})


@pytest.mark.parametrize(
    "handle",
    [_two_starts, _trailers, _pseudo_header, _mixed_case_padded],
    ids=["two-heads", "trailers-on-http-1", "pseudo-header", "mixed-case-padded-headers"],
)
async def test_odd_app_messages_give_the_same_bytes(handle: App) -> None:
    ours, stock = await _both(handle, GET)
    assert ours == stock
    assert ours.startswith(b"HTTP/1.1 ")


@pytest.mark.parametrize(
    "request_bytes",
    [
        # Two requests in one write, then the connection closes.
        b"GET /a HTTP/1.1\r\nHost: t\r\n\r\nGET /b HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        # An h2c upgrade with a body: Hypercorn ignores the upgrade and answers in HTTP/1.1.
        b"POST / HTTP/1.1\r\nHost: t\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
    ],
    ids=["pipelined", "h2c-upgrade-with-body"],
)
async def test_requests_through_hypercorns_parsing_give_the_same_bytes(request_bytes: bytes) -> None:
    ours, stock = await _both(_fixed(b"ok"), request_bytes)
    assert ours == stock
    assert ours.startswith(b"HTTP/1.1 ")


async def test_plain_requests_take_the_lean_stream_and_upgrades_hypercorns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The bytes above are the same either way; this is which path served them.
    from hypercorn.protocol.http_stream import HTTPStream
    from hypercorn.protocol.ws_stream import WSStream

    from trioforward.server.front._leanstream import LeanStream

    served: list[str] = []
    for cls in (LeanStream, HTTPStream, WSStream):
        original = cls.__init__

        def counted(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> None:
            served.append(type(self).__name__)
            _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", counted)

    async def handle(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            await receive()
            await send({"type": "websocket.close", "code": 1000})
            return
        await _fixed(b"ok")(scope, receive, send)

    ws = (
        b"GET /ws HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    async with _serve(handle, "our-worker") as port:
        await _exchange(port, GET)
        await _exchange(port, b"POST / HTTP/1.1\r\nHost: t\r\nUpgrade: foo\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await _exchange(port, ws)
    assert served == ["LeanStream", "HTTPStream", "WSStream"]
