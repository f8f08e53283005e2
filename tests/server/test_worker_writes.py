"""Response writes of the gateway's Hypercorn worker (``_worker.KeepAliveTCPServer``):
direct socket writes when the kernel takes everything, Hypercorn's path for the
rest — bytes arrive whole and in order, and a client that hangs up is handled."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing
from asgi_harness import answer_lifespan, serve_asgi

from trioforward._settings import Settings

CHUNK = 1 << 20  # 1 MiB per body message: far more than a socket buffer takes at once
CHUNKS = 8


def _body(i: int) -> bytes:
    return hashlib.sha256(b"%d" % i).digest() * (CHUNK // 32)


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await answer_lifespan(receive, send)
        return
    await receive()
    length = b"%d" % (CHUNK * CHUNKS)
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", length)]}
    )
    for i in range(CHUNKS):
        await send({"type": "http.response.body", "body": _body(i), "more_body": i < CHUNKS - 1})


@asynccontextmanager
async def _server() -> AsyncIterator[int]:
    async with serve_asgi(_app, Settings()) as (port, _):
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
