"""Error paths: 400 naming the field (nothing forwarded), 404/405/413, engine errors
verbatim, dispatch errors as JSON (docs/server.md, "Errors"), and a mid-stream failure."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import orjson
import pytest
from gateway_harness import Gateway, generation_requests, open_gateway, open_sim

BAD_BODIES = [
    ("/v1/completions", b"{not json", None),
    ("/v1/completions", b"[1, 2]", None),
    ("/v1/completions", b"", None),
    ("/v1/completions", {"prompt": "x"}, "model"),
    ("/v1/completions", {"model": 3, "prompt": "x"}, "model"),
    ("/v1/completions", {"model": "sim-base"}, "prompt"),
    ("/v1/completions", {"model": "sim-base", "prompt": {"a": 1}}, "prompt"),
    ("/v1/completions", {"model": "sim-base", "prompt": "x", "max_tokens": "8"}, "max_tokens"),
    ("/v1/completions", {"model": "sim-base", "prompt": "x", "max_tokens": True}, "max_tokens"),
    ("/v1/completions", {"model": "sim-base", "prompt": "x", "n": 0}, "n"),
    ("/v1/completions", {"model": "sim-base", "prompt": "x", "stream": "yes"}, "stream"),
    ("/v1/completions", {"model": "sim-base", "prompt": "x", "temperature": "hot"}, "temperature"),
    ("/v1/chat/completions", {"model": "sim-base"}, "messages"),
    ("/v1/chat/completions", {"model": "sim-base", "messages": "hi"}, "messages"),
    ("/v1/chat/completions", {"model": "sim-base", "messages": [{"content": "x"}]}, "messages[0].role"),
    ("/v1/chat/completions", {"model": "sim-base", "messages": [{"role": "user"}], "n": 1.5}, "n"),
]


@pytest.mark.parametrize(("path", "body", "field"), BAD_BODIES)
async def test_invalid_request_is_400_naming_the_field(
    engine: Any, gateway: Gateway, path: str, body: Any, field: str | None
) -> None:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    async with httpx.AsyncClient() as client:
        response = await client.post(gateway.url + path, content=content)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    if field is not None:
        assert error["param"] == field
        assert field.split("[")[0] in error["message"]
    assert generation_requests(engine) == 0


@pytest.mark.parametrize(
    ("path", "body", "where"),
    [
        ("/v1/completions", b'{"model": "sim-base",\n "prompt": nul}', "line 2, column 12"),
        ("/v1/chat/completions", b"{not json", "line 1, column 2"),
        ("/generate", b'{"text": "x",}', "line 1, column 13"),
        ("/api/v1/asample", b"{", "line 1, column 2"),
        ("/admin/pause", b"[1,", "line 1, column 4"),
    ],
)
async def test_a_body_that_is_not_json_is_refused_saying_where(
    engine: Any, gateway: Gateway, path: str, body: bytes, where: str
) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(gateway.url + path, content=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"] == f"request body is not valid JSON ({where})"  # not orjson's words
    assert generation_requests(engine) == 0


async def test_body_over_the_limit_is_413(engine: Any, fd_baseline: int) -> None:
    async with open_gateway(engine.url, max_body_size=1024) as gw:
        async with httpx.AsyncClient() as client:
            body = {"model": "sim-base", "prompt": "x" * 2000}
            response = await client.post(gw.url + "/v1/completions", json=body)
            assert response.status_code == 413
            assert response.json()["error"]["code"] == "request_too_large"
            response = await client.post(gw.url + "/admin/adapters", content=b"x" * 2000)
            assert response.status_code == 413
            assert response.json()["error"]["code"] == "request_too_large"
    assert generation_requests(engine) == 0


async def test_unknown_route_and_wrong_method_are_json(engine: Any, gateway: Gateway) -> None:
    async with httpx.AsyncClient() as client:
        missing = await client.get(gateway.url + "/v1/nothing")
        wrong = await client.get(gateway.url + "/v1/completions")
    assert missing.status_code == 404 and "error" in missing.json()
    assert wrong.status_code == 405 and "error" in wrong.json()
    assert wrong.headers["allow"] == "POST"


async def test_repeated_slashes_mean_the_single_slash_route(engine: Any, gateway: Gateway) -> None:
    # A client base URL ending in "/" joined with "/v1/...": served, not a 404.
    body = {"model": "sim-base", "prompt": "x", "max_tokens": 2}
    async with httpx.AsyncClient() as client:
        completion = await client.post(gateway.url + "//v1/completions", json=body)
        health = await client.get(gateway.url + "//health")
    assert completion.status_code == 200 and completion.json()["choices"]
    assert health.status_code == 200


async def test_405_lists_the_allowed_methods(engine: Any, gateway: Gateway) -> None:
    async with httpx.AsyncClient() as client:
        pause = await client.get(gateway.url + "/admin/pause")
        health = await client.post(gateway.url + "/health")
    assert pause.status_code == 405 and pause.json()["error"]["code"] == "method_not_allowed"
    assert "POST" in pause.headers["allow"].split(", ")
    assert health.status_code == 405 and "GET" in health.headers["allow"].split(", ")


async def test_engine_error_comes_back_verbatim(engine: Any, gateway: Gateway) -> None:
    body = {"model": "no-such-model", "prompt": "x", "max_tokens": 2}
    async with httpx.AsyncClient() as client:
        via_gateway = await client.post(gateway.url + "/v1/completions", json=body)
        straight = await client.post(engine.url + "/v1/completions", json=body)
    assert via_gateway.status_code == straight.status_code
    assert via_gateway.status_code in (400, 404)
    assert via_gateway.content == straight.content


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_unreachable_engine_is_502_with_phase_and_attempts(fd_baseline: int) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    async with open_gateway(url, connect_retries=1, backoff_initial=0.0, health_interval=3600.0) as gw:
        async with httpx.AsyncClient() as client:
            response = await client.post(
                gw.url + "/v1/completions", json={"model": "sim-base", "prompt": "x"}
            )
        assert await gw.pool_active() == 0
    assert response.status_code in (502, 503)
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code", "phase", "attempts", "engine"}
    if response.status_code == 502:
        assert error["phase"] == "connect"
        assert error["attempts"] == 2
        assert error["engine"] == url


async def test_mid_stream_failure_ends_with_error_event_not_done(fd_baseline: int) -> None:
    async with open_sim() as engine:
        engine.faults.stall_body = 1
        engine.faults.stall_seconds = 30.0
        async with open_gateway(engine.url, read_timeout=0.2) as gw:
            body = {"model": "sim-base", "prompt": "x", "max_tokens": 16, "stream": True}
            async with httpx.AsyncClient() as client:
                async with client.stream("POST", gw.url + "/v1/completions", json=body) as response:
                    assert response.status_code == 200
                    raw = b"".join([chunk async for chunk in response.aiter_bytes()])
            assert await gw.pool_active() == 0
    assert b"[DONE]" not in raw
    last = [e for e in raw.split(b"\n\n") if e.strip()][-1]
    assert last.startswith(b"data: ")
    error = orjson.loads(last[len(b"data: "):])["error"]
    assert error["phase"] == "read_body"
    assert error["attempts"] == 1
    assert generation_requests(engine) == 1  # never retried


async def test_the_front_answers_openai_and_tinker_routes_alike(engine: Any, gateway: Gateway) -> None:
    # One ASGI front: the same 405, 400 and 413 answers (OpenAI-style JSON with
    # "param") on both APIs' hot routes.
    routes = ("/v1/completions", "/api/v1/asample", "/api/v1/retrieve_future")
    limit = gateway.app.config["TRIOFORWARD_SETTINGS"].max_body_size
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        for path in routes:
            wrong = await client.get(path)
            assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
            assert wrong.json()["error"]["code"] == "method_not_allowed"
            bad = await client.post(path, content=b"[1]")
            assert bad.status_code == 400
            assert set(bad.json()["error"]) == {"message", "type", "code", "param"}
            big = await client.post(path, content=b" " * (limit + 1))
            assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
        unknown = await client.post("/api/v1/retrieve_future", json={"request_id": "nope"})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"
        not_a_string = await client.post("/api/v1/retrieve_future", json={"request_id": 3})
        assert not_a_string.status_code == 400
        assert not_a_string.json()["error"]["param"] == "request_id"
