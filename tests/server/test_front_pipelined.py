"""What the front does with bytes after a request that asks to close, with
lenient chunk-size lines and with request heads over the limit (docs/server.md,
"Connections that must close" and "Framings the front refuses";
``server/front/_h11front.py``).

Found trying the front as a new client would: a ``Connection: close`` request
followed in the same write by more bytes got only a 400 "Got data when expecting
EOF" while its forward, already started, was cancelled and logged 499; a
chunk-size line ``30 \\r\\n`` was accepted, letting a pipelined request after the
body run; a 17,000-byte head sent in one write was served 200.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from gateway_harness import open_gateway

BODY = b'{"model": "sim-base", "prompt": "hi", "max_tokens": 2}'
SMUGGLED = b"POST /admin/pause HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


async def _exchange(port: int, *writes: bytes) -> bytes:
    """Everything the gateway sends back until it closes the connection; the
    writes go one after another (the later ones while the first is being answered)."""
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        for data in writes:
            await stream.send_all(data)
        received = b""
        with trio.fail_after(30):
            while chunk := await stream.receive_some(65536):
                received += chunk
        return received


def _answers(raw: bytes) -> list[tuple[int, dict[bytes, bytes], bytes]]:
    """The fixed-length answers in ``raw``, in order."""
    out = []
    while raw:
        head, _, raw = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
        size = int(headers[b"content-length"])
        out.append((int(lines[0].split()[1]), headers, raw[:size]))
        raw = raw[size:]
    return out


def _completion(version: str = "1.1", close: bool = True) -> bytes:
    connection = b"Connection: close\r\n" if close else b""
    return (
        b"POST /v1/completions HTTP/%s\r\nHost: x\r\nContent-Type: application/json\r\n" % version.encode()
        + connection
        + b"Content-Length: %d\r\n\r\n" % len(BODY)
        + BODY
    )


async def _paused(url: str) -> list[bool]:
    async with httpx.AsyncClient(base_url=url) as client:
        engines = (await client.get("/admin/engines")).json()
    return [e["paused"] for e in engines["engines"]]


@pytest.mark.parametrize("version,close", [("1.1", True), ("1.0", False)], ids=["connection-close", "http-1.0"])
@pytest.mark.parametrize("split", [False, True], ids=["one-write", "two-writes"])
async def test_a_must_close_request_is_answered_and_what_follows_is_discarded(
    engine: Any, caplog: pytest.LogCaptureFixture, version: str, close: bool, split: bool
) -> None:
    caplog.set_level("INFO", logger="trioforward.access")
    async with open_gateway(engine.url) as gw:
        port = int(gw.url.rpartition(":")[2])
        first = _completion(version, close)
        writes = (first, SMUGGLED) if split else (first + SMUGGLED,)
        answers = _answers(await _exchange(port, *writes))
        assert [status for status, _, _ in answers] == [200]  # one answer, then closed
        status, headers, body = answers[0]
        assert headers[b"connection"].lower() == b"close"
        assert json.loads(body)["choices"][0]["text"]
        assert await _paused(gw.url) == [False]  # the bytes after it never ran
        assert await gw.pool_active() == 0
    assert engine.stats.by_path["/v1/completions"] == 1
    assert engine.stats.by_path["/admin/pause"] == 0
    access = [r.getMessage() for r in caplog.records if r.name == "trioforward.access"]
    assert [line.split()[:3] for line in access if "/v1/completions" in line] == [
        ["POST", "/v1/completions", "200"]  # not 499: the client never hung up
    ], access


def _chunked_head(path: str = "/v1/completions") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()


@pytest.mark.parametrize("line_end", [b" \r\n", b"\t\r\n", b";ext \r\n"], ids=["space", "tab", "after-extension"])
@pytest.mark.parametrize("split", [False, True], ids=["one-write", "body-in-a-later-write"])
async def test_whitespace_before_a_chunk_lines_crlf_is_refused_and_nothing_is_forwarded(
    engine: Any, line_end: bytes, split: bool
) -> None:
    body = b"%x" % len(BODY) + line_end + BODY + b"\r\n0\r\n\r\n"
    async with open_gateway(engine.url) as gw:
        port = int(gw.url.rpartition(":")[2])
        writes = (_chunked_head(), body + SMUGGLED) if split else (_chunked_head() + body + SMUGGLED,)
        answers = _answers(await _exchange(port, *writes))
        assert [status for status, _, _ in answers] == [400]
        status, headers, raw = answers[0]
        assert headers[b"connection"].lower() == b"close"
        assert headers[b"content-type"] == b"application/json"
        error = json.loads(raw)["error"]
        assert error["code"] == "malformed_request"
        assert "chunk-size line" in error["message"]
        assert await _paused(gw.url) == [False]  # the pipelined pause never ran
        assert await gw.pool_active() == 0
    assert engine.stats.by_path["/v1/completions"] == 0


async def test_a_chunked_body_with_extensions_is_still_served(engine: Any) -> None:
    half = len(BODY) // 2
    body = b"%x;a=b\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, BODY[:half], len(BODY) - half, BODY[half:])
    async with open_gateway(engine.url) as gw:
        port = int(gw.url.rpartition(":")[2])
        close = _chunked_head().replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
        answers = _answers(await _exchange(port, close + body))
        assert [status for status, _, _ in answers] == [200]
    assert engine.stats.by_path["/v1/completions"] == 1


@pytest.mark.parametrize("split", [False, True], ids=["one-write", "head-in-two-writes"])
async def test_a_request_head_over_the_limit_is_refused_431_however_it_arrives(engine: Any, split: bool) -> None:
    filler = b"X-Filler: " + b"a" * 17_000 + b"\r\n"
    head = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + filler + b"\r\n"
    async with open_gateway(engine.url) as gw:
        port = int(gw.url.rpartition(":")[2])
        writes = (head[:8000], head[8000:]) if split else (head,)
        answers = _answers(await _exchange(port, *writes))
        assert [status for status, _, _ in answers] == [431]
        status, headers, raw = answers[0]
        assert headers[b"connection"].lower() == b"close"
        error = json.loads(raw)["error"]
        assert error["code"] == "malformed_request"
        assert "request head over 16384 bytes" in error["message"]
        # Just under the limit is served.
        small = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        small += b"X-Filler: " + b"a" * (16_384 - len(small) - 16) + b"\r\n\r\n"
        assert len(small) <= 16_384
        answers = _answers(await _exchange(port, small))
        assert [status for status, _, _ in answers] == [200]


@pytest.mark.parametrize(
    "bad_line,reason",
    [(b"%x \r\n", "chunk-size line"), (b"zz\r\n", "illegal chunk header")],
    ids=["whitespace", "not-hex"],
)
async def test_a_body_refused_after_its_request_started_is_logged_with_its_status_not_499(
    engine: Any, caplog: pytest.LogCaptureFixture, bad_line: bytes, reason: str
) -> None:
    # The head arrives first (the route starts reading the body), the bad chunk
    # later: the client got a 400 and never left, so 499 would be a lie.
    caplog.set_level("INFO", logger="trioforward.access")
    line = bad_line % len(BODY) if b"%x" in bad_line else bad_line
    async with open_gateway(engine.url) as gw:
        port = int(gw.url.rpartition(":")[2])
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(_chunked_head())
            await trio.testing.wait_all_tasks_blocked()  # the route waits for the body
            await stream.send_all(line + BODY + b"\r\n0\r\n\r\n")
            raw = b""
            with trio.fail_after(30):
                while chunk := await stream.receive_some(65536):
                    raw += chunk
        [(status, _, body)] = _answers(raw)
        assert status == 400 and reason in json.loads(body)["error"]["message"]
        with trio.fail_after(5):
            while not [r for r in caplog.records if r.name == "trioforward.access"]:
                await trio.testing.wait_all_tasks_blocked()
                await trio.lowlevel.checkpoint()
    lines = [r.getMessage() for r in caplog.records if r.name == "trioforward.access"]
    assert [x.split()[:3] for x in lines] == [["POST", "/v1/completions", "400"]], lines
    assert "error=malformed_request" in lines[0]
    assert engine.stats.by_path["/v1/completions"] == 0


@pytest.mark.parametrize("path", ["/health", "/v1/models", "/metrics"])
async def test_a_must_close_probe_of_a_quart_route_is_answered_whatever_follows(engine: Any, path: str) -> None:
    probe = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    async with open_gateway(engine.url) as gw:
        port = int(gw.url.rpartition(":")[2])
        answers = _answers(await _exchange(port, probe + SMUGGLED))
        assert [status for status, _, _ in answers] == [200]
        assert answers[0][1][b"connection"].lower() == b"close"
        assert await _paused(gw.url) == [False]
    assert engine.stats.by_path["/admin/pause"] == 0
