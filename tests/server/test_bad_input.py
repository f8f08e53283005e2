"""Bad input a newcomer sends gets a clear 4xx JSON error (or exit 2), never a 500 or a crash."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio
import trio.lowlevel
import trio.testing
from click.testing import CliRunner
from gateway_harness import Gateway

from trioforward._settings import Settings, SettingsError
from trioforward.cli import main
from trioforward.server.tinker._requests import BadRequest, make_sampling_session

BAD_ENGINE_URLS = [
    "http://127.0.0.1:99999",  # port out of range
    "http://127.0.0.1:abc",  # port not a number
    "http://127.0.0.1:0",
    "http://user:pw@127.0.0.1:8001",  # credentials
    "http://[::1",  # unclosed IPv6 bracket
    "http://127.0.0.1:8001/v1",  # the OpenAI base URL, not the engine's root
    "http://127.0.0.1:8001/?x=1",
]


@pytest.mark.parametrize("url", BAD_ENGINE_URLS)
def test_serve_rejects_a_bad_engine_url_with_exit_2(url: str) -> None:
    result = CliRunner().invoke(main, ["serve", "--engine", url])
    assert result.exit_code == 2, result.output
    assert "setting 'engines': " in result.output and url in result.output
    assert "(--engine / --engines / TRIOFORWARD_ENGINES)" in result.output, result.output


def test_a_zero_body_limit_is_rejected() -> None:
    # Elsewhere 0 means unlimited; here it made every POST a 413.
    with pytest.raises(SettingsError, match="'max_body_size': must be >= 1"):
        Settings(max_body_size=0)


async def test_admin_add_engine_rejects_bad_urls_with_400(engine: Any, gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        for url in BAD_ENGINE_URLS:
            response = await client.post("/admin/engines", json={"url": url})
            assert response.status_code == 400, (url, response.text)
            assert response.json()["error"]["param"] == "url"
        listed = await client.get("/admin/engines")
    assert [e["url"] for e in listed.json()["engines"]] == [engine.url]


async def test_pause_and_resume_of_an_unknown_engine_are_404(engine: Any, gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        for path in ("/admin/pause", "/admin/resume"):
            response = await client.post(path, json={"engines": ["http://127.0.0.1:9"]})
            assert response.status_code == 404, (path, response.text)
            assert response.json()["error"]["code"] == "engine_not_found"
        listed = await client.get("/admin/engines")
    assert listed.json()["engines"][0]["paused"] is False


@pytest.mark.parametrize(("field", "value"), [("base_model", 5), ("model_path", 5), ("model_path", ["x"])])
def test_make_sampling_session_rejects_non_string_models(field: str, value: object) -> None:
    kwargs: dict[str, Any] = {"base_model": None, "model_path": None}
    kwargs[field] = value
    with pytest.raises(BadRequest, match=f"{field} must be a string"):
        make_sampling_session("", 0, adapter_root="/tmp", registered=set(), **kwargs)


async def test_tinker_non_string_model_is_a_400_json_error(engine: Any, gateway: Gateway) -> None:
    sample = {
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]},
        "num_samples": 1,
        "sampling_params": {"max_tokens": 2},
    }
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        for field in ("base_model", "model_path"):
            response = await client.post("/api/v1/asample", json={field: 5, **sample})
            assert response.status_code == 400, (field, response.text)
            assert response.json()["error"]["message"] == f"{field} must be a string"
            response = await client.post("/api/v1/create_sampling_session", json={field: 5})
            assert response.status_code == 400, (field, response.text)


async def test_access_log_names_the_method_of_a_405(
    engine: Any, gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="trioforward.access")
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        response = await client.get("/v1/completions")
    assert response.status_code == 405
    with trio.fail_after(5):  # the line is written once the response has gone out
        while not (lines := [r.getMessage() for r in caplog.records if r.name == "trioforward.access"]):
            await trio.testing.wait_all_tasks_blocked()
            await trio.lowlevel.checkpoint()
    assert lines[0].startswith("GET /v1/completions 405 "), lines


@pytest.mark.parametrize(
    "case",
    ["405-unread-body", "401-unread-body"],
)
async def test_an_answer_before_a_many_chunked_body_closes_the_connection(
    engine: Any, case: str
) -> None:
    # The gateway answers without reading the body (wrong method; missing key);
    # the body's many small chunks arrive in one segment. The connection must
    # end (h11 cannot reuse it mid-body), not stay open forever: found when the
    # worker's app channel filled up and Hypercorn's disconnect message waited
    # on it from the app's own task.
    from gateway_harness import open_gateway

    knobs: dict[str, Any] = {"api_keys": ("sekret",)} if case.startswith("401") else {}
    method = b"GET" if case.startswith("405") else b"POST"
    async with open_gateway(engine.url, **knobs) as gw:
        port = int(gw.url.rpartition(":")[2])
        for _ in range(3):
            async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
                head = b"%s /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" % method
                await stream.send_all(head + b"1\r\na\r\n" * 30 + b"0\r\n\r\n")
                data = b""
                with trio.fail_after(5):
                    while chunk := await stream.receive_some(65536):
                        data += chunk
                assert data.startswith(b"HTTP/1.1 " + case[:3].encode()), data[:40]
        assert await gw.pool_active() == 0
    assert engine.stats.by_path["/v1/completions"] == 0


async def test_admin_calls_missing_their_key_say_so_with_400(engine: Any, gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        for method, path in (("POST", "/admin/engines"), ("DELETE", "/admin/engines")):
            for body in (b"", b"{}"):
                response = await client.request(method, path, content=body)
                assert response.status_code == 400, (method, path, body, response.text)
                error = response.json()["error"]
                assert (error["code"], error["param"]) == ("invalid_engine_url", "url")
                assert "missing 'url'" in error["message"], error["message"]
        for body in (b"", b"{}", b'{"name": 5}', b'{"name": ""}'):
            response = await client.request("DELETE", "/admin/adapters", content=body)
            assert response.status_code == 400, (body, response.text)
            assert response.json()["error"]["param"] == "name"
        listed = await client.get("/admin/engines")
    assert [e["url"] for e in listed.json()["engines"]] == [engine.url]


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("POST", "/admin/pause", {"engine-mode": "abort"}, "engine-mode"),
        ("POST", "/admin/pause", {"modee": "abort"}, "modee"),
        ("POST", "/admin/resume", {"version": "step-1"}, "version"),
        ("POST", "/admin/engines", {"url": "http://127.0.0.1:9", "capacity": 4}, "capacity"),
        ("DELETE", "/admin/engines", {"url": "http://127.0.0.1:9", "force": True}, "force"),
        ("POST", "/admin/adapters", {"name": "a", "path": "/a", "base_model": "b"}, "base_model"),
        ("DELETE", "/admin/adapters", {"name": "a", "path": "/a"}, "path"),
    ],
)
async def test_admin_calls_refuse_a_field_they_do_not_take(
    method: str, path: str, body: dict[str, Any], field: str, engine: Any, gateway: Gateway
) -> None:
    """A misspelt field was ignored: ``{"engine-mode": "abort"}`` paused the gateway
    only, and the trainer pushed weights to engines that were still running."""
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        response = await client.request(method, path, json=body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == field and f"unknown field {field!r}" in error["message"], error
        engines = (await client.get("/admin/engines")).json()["engines"]
        adapters = (await client.get("/admin/adapters")).json()["adapters"]
        body = {"model": "sim-base", "prompt": "x", "max_tokens": 1}
        answer = await client.post("/v1/completions", json=body)
    assert [(e["url"], e["paused"]) for e in engines] == [(engine.url, False)]
    assert adapters == [] and engine.stats.by_path.get("/pause", 0) == 0
    assert answer.status_code == 200 and "x-weight-version" not in answer.headers


async def test_resume_with_a_weight_version_that_is_not_a_string_says_so(
    engine: Any, gateway: Gateway
) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        response = await client.post("/admin/resume", json={"weight_version": 5})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "'weight_version' must be a string or null"


async def test_re_registering_an_adapter_without_a_parent_clears_it(
    engine: Any, gateway: Gateway
) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        first = {"name": "a", "path": "/adapters/a", "parent": "sim-base"}
        assert (await client.post("/admin/adapters", json=first)).status_code == 201
        again = await client.post("/admin/adapters", json={"name": "a", "path": "/adapters/a2"})
        assert again.json() == {"name": "a", "path": "/adapters/a2", "parent": None}
        listed = (await client.get("/admin/adapters")).json()["adapters"]
    assert listed == [{"name": "a", "path": "/adapters/a2", "parent": None}]


async def test_tinker_asample_naming_no_sampler_says_what_it_needs(
    engine: Any, gateway: Gateway
) -> None:
    sample = {
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]},
        "num_samples": 1,
        "sampling_params": {"max_tokens": 2},
    }
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        for body in ({}, sample, {"base_model": "", **sample}):
            response = await client.post("/api/v1/asample", json=body)
            assert response.status_code == 400, (body, response.text)
            message = response.json()["error"]["message"]
            assert message.startswith("asample needs sampling_session_id"), message
    assert engine.stats.by_path["/v1/completions"] == 0
