"""An HTTP/1.1 protocol error on one connection ends that connection, never the worker.

When h11 has refused something sent on a connection (its state is then ERROR)
and the app fails before its response starts, Hypercorn answers 500 when the
app ends (``HTTPStream.app_send(None)``), h11 refuses that too, and the
``LocalProtocolError`` escapes the connection's task. Under stock Hypercorn it
ends ``serve`` and every other connection with it (seen once in the real-engine
demo under a weight update). The test makes that last step fail as h11 does and
checks the worker closes the one connection, logs it, and serves on.
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
    async def refused(self: HTTPStream, status_code: int) -> None:
        raise h11.LocalProtocolError("Can't send data when our state is ERROR")

    monkeypatch.setattr(HTTPStream, "_send_error_response", refused)
    caplog.set_level(logging.ERROR)
    async with serve_asgi(_app, Settings()) as (port, _):
        assert await _get(port, "/fails") == b""  # closed without an answer
        for _ in range(2):
            answer = await _get(port, "/")
            assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\nok")
    logged = [r.getMessage() for r in caplog.records if r.name == "trioforward.server"]
    assert any("protocol error" in m for m in logged), logged
