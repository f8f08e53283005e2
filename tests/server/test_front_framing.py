"""Framings the front refuses (docs/server.md, "Framings the front refuses").

A request carrying both Content-Length and Transfer-Encoding is refused on every
route with a 400 JSON answer and the connection closed, and nothing sent after it
on that connection is read (request smuggling: a proxy framing by Content-Length
would take the admin call that follows for part of the body). h11's own refusals
carry a JSON body too.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio
from gateway_harness import open_gateway

BODY = b'{"model": "sim-base", "prompt": "hi", "max_tokens": 2}'
CHUNKED = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
SMUGGLED = b"POST /admin/pause HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


async def _exchange(port: int, data: bytes) -> bytes:
    """Everything the gateway sends back until it closes the connection."""
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(data)
        received = b""
        with trio.fail_after(30):
            while chunk := await stream.receive_some(65536):
                received += chunk
        return received


def _answer(raw: bytes) -> tuple[int, dict[bytes, bytes], dict[str, Any]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
    assert int(headers[b"content-length"]) == len(body), raw  # one answer, nothing after it
    return status, headers, json.loads(body)


@pytest.mark.parametrize("stock_hypercorn", [False, True], ids=["worker", "hypercorn-command"])
@pytest.mark.parametrize(
    "method,path",
    [
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/api/v1/asample"),
        ("POST", "/admin/pause"),
        ("GET", "/health"),
        ("GET", "/v1/models"),
    ],
)
async def test_content_length_with_transfer_encoding_is_refused_and_what_follows_is_not_read(
    engine: Any, stock_hypercorn: bool, method: str, path: str
) -> None:
    async with open_gateway(engine.url, stock_hypercorn=stock_hypercorn) as gw:
        port = int(gw.url.rpartition(":")[2])
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
        ).encode()
        raw = await _exchange(port, head + CHUNKED + SMUGGLED)
        status, headers, body = _answer(raw)
        assert status == 400
        assert headers[b"connection"].lower() == b"close"
        assert body["error"]["code"] == "ambiguous_framing"
        assert "Content-Length and Transfer-Encoding" in body["error"]["message"]
        async with httpx.AsyncClient(base_url=gw.url) as client:
            engines = (await client.get("/admin/engines")).json()
        assert [e["paused"] for e in engines["engines"]] == [False]  # the smuggled pause never ran
        assert await gw.pool_active() == 0
    assert engine.stats.by_path["/v1/completions"] == 0
    assert engine.stats.by_path["/v1/chat/completions"] == 0


@pytest.mark.parametrize(
    "framing,status,reason",
    [
        (b"Content-Length: 3\r\nContent-Length: 4\r\n", 400, "conflicting Content-Length headers"),
        (b"Content-Length: x\r\n", 400, "bad Content-Length"),
        (b"Transfer-Encoding: gzip\r\n", 501, "Only Transfer-Encoding: chunked is supported"),
    ],
    ids=["two-lengths", "bad-length", "unknown-coding"],
)
async def test_the_fronts_own_refusals_have_json_bodies(
    engine: Any, framing: bytes, status: int, reason: str
) -> None:
    async with open_gateway(engine.url) as gw:
        port = int(gw.url.rpartition(":")[2])
        raw = await _exchange(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + framing + b"\r\nabcd" + SMUGGLED)
        got, headers, body = _answer(raw)
        assert got == status
        assert headers[b"content-type"] == b"application/json"
        assert headers[b"connection"].lower() == b"close"
        assert body["error"]["code"] == "malformed_request"
        assert body["error"]["type"] == "invalid_request_error"
        assert reason in body["error"]["message"]
        async with httpx.AsyncClient(base_url=gw.url) as client:
            engines = (await client.get("/admin/engines")).json()
        assert [e["paused"] for e in engines["engines"]] == [False]
    assert engine.stats.by_path["/v1/completions"] == 0
