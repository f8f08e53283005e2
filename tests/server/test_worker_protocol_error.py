"""HTTP/1.1 protocol errors on one connection: where they come from, and that they
end that connection only.

A cancel landing while a response head is being sent (between h11 taking it
and Hypercorn recording it) desynchronises the two: the app, told the head did
not go out, answers again, h11 refuses (its state is then ERROR), and
Hypercorn's 500 after it raises ``LocalProtocolError`` out of the connection's
task. Under stock Hypercorn that ends ``serve`` and every other connection
with it; the real-engine demo died once that way when an abort pause met a
stream's head. The routes send heads with ``send_start`` (shielded), and the
worker closes a connection such an error escapes from, logs it, and serves on.
"""

from __future__ import annotations

import logging
from typing import Any

import h11
import pytest
import trio
from asgi_harness import answer_lifespan, serve_asgi
from hypercorn.protocol.http_stream import HTTPStream

from trioforward._settings import Settings
from trioforward.server.front._asgi import respond, send_start
from trioforward.server.front._leanstream import LeanStream


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await answer_lifespan(receive, send)
        return
    if scope["path"] == "/fails":
        raise RuntimeError("the app failed before its response")
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def _get(port: int, path: str) -> bytes:
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
        received = b""
        with trio.fail_after(10):
            while not received.endswith(b"\r\n\r\nok") and (chunk := await stream.receive_some(65536)):
                received += chunk
    return received


async def test_a_protocol_error_closes_its_connection_and_the_worker_serves_on(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, fd_baseline: int
) -> None:
    # The last step of the failure above, made to happen: the app fails before
    # its response, and Hypercorn's 500 is refused as h11 refuses it in ERROR.
    async def refused(self: object, status_code: int) -> None:
        raise h11.LocalProtocolError("Can't send data when our state is ERROR")

    monkeypatch.setattr(HTTPStream, "_send_error_response", refused)
    monkeypatch.setattr(LeanStream, "_send_error_response", refused)  # the worker's stream
    caplog.set_level(logging.ERROR)
    async with serve_asgi(_app, Settings()) as (port, _):
        assert await _get(port, "/fails") == b""  # closed without an answer
        for _ in range(2):
            answer = await _get(port, "/")
            assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\nok")
    logged = [r.getMessage() for r in caplog.records if r.name == "trioforward.server"]
    assert any("protocol error" in m for m in logged), logged


async def _stream_cancelled_at_its_head(scope: dict[str, Any], receive: Any, send: Any) -> None:
    # The streaming route's shape (server/proxy/_forward.py): the head, then the body;
    # when the work is cancelled before the head went out, a whole error answer
    # instead. Here the cancel (an abort pause, say) is already pending when the
    # head is sent.
    if scope["type"] == "lifespan":
        await answer_lifespan(receive, send)
        return
    head = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
    head_sent = False
    with trio.CancelScope() as work:
        work.cancel()
        await send_start(send, head)
        head_sent = True
        await trio.lowlevel.checkpoint()  # the cancel lands here, after the head
    if head_sent:
        await send({"type": "http.response.body", "body": b"data: ok\n\n", "more_body": False})
    else:
        await respond(send, 503, b'{"error": {}}')


async def test_a_cancel_pending_as_a_stream_head_goes_out_leaves_a_well_formed_response(
    fd_baseline: int,
) -> None:
    # Without the shield, the cancel lands between h11 taking the head and
    # Hypercorn recording it: the route answers again, h11 refuses, and the
    # connection ends with nothing sent.
    async with serve_asgi(_stream_cancelled_at_its_head, Settings()) as (port, _):
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            received = b""
            with trio.fail_after(10):
                while not received.endswith(b"0\r\n\r\n") and (chunk := await stream.receive_some(65536)):
                    received += chunk
    assert received.startswith(b"HTTP/1.1 200 "), received
    assert b"data: ok\n\n" in received and received.endswith(b"0\r\n\r\n"), received
