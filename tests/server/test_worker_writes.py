"""Response writes of the gateway's Hypercorn worker (``_tcpserver.KeepAliveTCPServer``):
direct socket writes when the kernel takes everything, Hypercorn's path for the
rest — bytes arrive whole and in order, and a client that hangs up is handled; a
fixed-length response is one write, a streamed head is not held back."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing
from asgi_harness import answer_lifespan, serve_asgi

from trioforward._settings import Settings
from trioforward.server.front import _tcpserver

CHUNK = 1 << 20  # 1 MiB per body message: far more than a socket buffer takes at once
CHUNKS = 8


def _body(i: int) -> bytes:
    return hashlib.sha256(b"%d" % i).digest() * (CHUNK // 32)


def _http_app(respond: Callable[[Any], Awaitable[None]]) -> Any:
    """An ASGI app: answers the lifespan; per request reads it, then ``respond(send)``."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        await receive()
        await respond(send)

    return app


async def _large(send: Any) -> None:
    length = b"%d" % (CHUNK * CHUNKS)
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", length)]}
    )
    for i in range(CHUNKS):
        await send({"type": "http.response.body", "body": _body(i), "more_body": i < CHUNKS - 1})


@asynccontextmanager
async def _server() -> AsyncIterator[int]:
    async with serve_asgi(_http_app(_large), Settings()) as (port, _):
        yield port


async def test_large_response_to_a_slow_reader_arrives_whole_and_in_order(fd_baseline: int) -> None:
    async with _server() as port:
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            for _ in range(2):  # twice on one connection: the second request reuses it
                await stream.send_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                await trio.testing.wait_all_tasks_blocked()  # the server fills the socket buffers
                data = b""
                with trio.fail_after(30):
                    while b"\r\n\r\n" not in data:
                        data += await stream.receive_some(4096)
                    head, _, body = data.partition(b"\r\n\r\n")
                    assert head.startswith(b"HTTP/1.1 200")
                    body = bytearray(body)
                    while len(body) < CHUNK * CHUNKS:
                        body += await stream.receive_some(65536)
                assert len(body) == CHUNK * CHUNKS
                assert bytes(body) == b"".join(_body(i) for i in range(CHUNKS))


async def test_client_hanging_up_mid_response(fd_baseline: int) -> None:
    async with _server() as port:
        for _ in range(3):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            await stream.receive_some(4096)
            await stream.aclose()  # with megabytes unsent
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:  # still serving
            await stream.send_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            with trio.fail_after(30):
                assert (await stream.receive_some(4096)).startswith(b"HTTP/1.1 200")


class _CountingOS:
    """Stands in for ``os`` in the worker module: records each ``write``."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, fd: int, data: bytes) -> int:
        self.writes.append(bytes(data))
        return os.write(fd, data)

    def read(self, fd: int, size: int) -> bytes:
        return os.read(fd, size)


async def _read_response(stream: trio.SocketStream, length: int) -> bytes:
    data = b""
    with trio.fail_after(10):
        while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < length:
            chunk = await stream.receive_some(65536)
            assert chunk, "connection closed early"
            data += chunk
    return data


async def test_a_fixed_length_response_is_one_write(fd_baseline: int, monkeypatch: Any) -> None:
    # Hypercorn writes the head at http.response.start and the body with the
    # next message; the worker holds the head and writes both at once.
    async def hello(send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
        await send({"type": "http.response.body", "body": b"hello", "more_body": False})

    counting = _CountingOS()
    monkeypatch.setattr(_tcpserver, "os", counting)
    async with serve_asgi(_http_app(hello), Settings()) as (port, _):
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            for _ in range(3):
                counting.writes.clear()
                await stream.send_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                data = await _read_response(stream, 5)
                assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"\r\n\r\nhello")
                assert counting.writes == [data]


async def test_fixed_length_is_read_from_the_app_message_not_the_bytes(
    fd_baseline: int, monkeypatch: Any
) -> None:
    # The app names the header in mixed case; Hypercorn serializes it its own
    # way. The decision to hold the head comes from the ASGI message.
    async def hello(send: Any) -> None:
        headers = [(b"Content-Length", b"5"), (b"content-type", b"text/plain")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"hello", "more_body": False})

    counting = _CountingOS()
    monkeypatch.setattr(_tcpserver, "os", counting)
    async with serve_asgi(_http_app(hello), Settings()) as (port, _):
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            data = await _read_response(stream, 5)
            assert counting.writes == [data]


async def test_a_write_after_the_whole_request_was_read_takes_no_scheduler_pass(
    fd_baseline: int, monkeypatch: Any
) -> None:
    # KeepAliveTCPServer._request_read reads Hypercorn's own h11 connection: if
    # that stops matching, every write pays a scheduler pass again.
    passes: list[None] = []
    real = _tcpserver._yield_to_reader

    async def counting_pass() -> None:
        passes.append(None)
        await real()

    async def hello(send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
        await send({"type": "http.response.body", "body": b"hello", "more_body": False})

    monkeypatch.setattr(_tcpserver, "_yield_to_reader", counting_pass)
    async with serve_asgi(_http_app(hello), Settings()) as (port, _):
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            for _ in range(3):
                await stream.send_all(b"POST / HTTP/1.1\r\nHost: t\r\ncontent-length: 2\r\n\r\nhi")
                await _read_response(stream, 5)
    assert passes == []


async def test_a_streamed_head_is_written_before_its_body(fd_baseline: int) -> None:
    # A chunked (streamed) response's head is not held: the client sees it while
    # the app still waits for its first body chunk.
    first_chunk = trio.Event()

    async def stream_later(send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await first_chunk.wait()
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": False})

    async with serve_asgi(_http_app(stream_later), Settings()) as (port, _):
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            with trio.fail_after(10):
                head = await stream.receive_some(65536)
            assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower()
            assert head.endswith(b"\r\n\r\n")  # nothing of the body yet
            first_chunk.set()
            with trio.fail_after(10):
                rest = await stream.receive_some(65536)
            assert b"data: 1" in rest


async def test_a_held_head_is_written_when_the_app_ends_without_its_body(fd_baseline: int) -> None:
    # The app promised 5 bytes and sent none: the client gets the head, then
    # the connection closes (as under Hypercorn's own writes).
    async def head_only(send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})

    async with serve_asgi(_http_app(head_only), Settings()) as (port, _):
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            data = b""
            with trio.fail_after(10):
                while chunk := await stream.receive_some(65536):
                    data += chunk
            assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"\r\n\r\n")
