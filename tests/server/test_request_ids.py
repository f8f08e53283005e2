"""Request ids end to end: echoed, logged, seen by the engine (fresh per attempt), refused when bad."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from gateway_harness import Gateway, generation_requests, open_gateway, open_sim

BODY = {"model": "sim-base", "prompt": [1, 2, 3], "max_tokens": 4}


async def test_caller_id_is_echoed_logged_and_reaches_the_engine_as_an_engine_side_id(
    engine: Any, gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="trioforward.access")
    async with httpx.AsyncClient() as client:
        response = await client.post(
            gateway.url + "/v1/completions", json=BODY, headers={"X-Request-Id": "rollout-7"}
        )
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "rollout-7"
    (seen,) = engine.stats.request_ids
    # One attempt: the engine got a fresh id derived from the caller's.
    assert seen.startswith("rollout-7.") and seen != "rollout-7"
    assert response.json()["id"] == f"cmpl-{seen}"  # vLLM's id for it, from the header
    lines = [r.getMessage() for r in caplog.records if r.name == "trioforward.access"]
    assert any(line.endswith(" id=rollout-7") for line in lines), lines


async def test_a_request_without_an_id_gets_one_from_the_gateway(
    engine: Any, gateway: Gateway
) -> None:
    async with httpx.AsyncClient() as client:
        first = await client.post(gateway.url + "/v1/completions", json=BODY)
        second = await client.post(gateway.url + "/v1/completions", json={**BODY, "stream": True})
    ids = [first.headers["x-request-id"], second.headers["x-request-id"]]
    assert all(ids) and ids[0] != ids[1]
    assert [s.rpartition(".")[0] for s in engine.stats.request_ids] == ids


@pytest.mark.parametrize(
    "value",
    ["has space", "x" * 129, "caf\u00e9", "tab\there"],
)
async def test_a_bad_request_id_is_refused_naming_the_header(
    engine: Any, gateway: Gateway, value: str
) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(
            gateway.url + "/v1/completions",
            json=BODY,
            headers=[(b"X-Request-Id", value.encode("latin-1"))],
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "X-Request-Id" and "X-Request-Id" in error["message"]
    assert generation_requests(engine) == 0


async def test_every_attempt_sends_the_engine_a_fresh_id(fd_baseline: int) -> None:
    # The first attempt is refused with 503 (retried once by the rules): two
    # attempts, two engine-side ids, one request id in the answer.
    async with open_sim() as engine, open_gateway(engine.url, backoff_initial=0.0) as gw:
        engine.faults.update({"reject": 1})
        async with httpx.AsyncClient() as client:
            response = await client.post(
                gw.url + "/v1/completions", json=BODY, headers={"X-Request-Id": "r1"}
            )
        assert response.status_code == 200
        assert response.headers["x-request-id"] == "r1"
        assert generation_requests(engine) == 2
        answered = response.json()["id"].removeprefix("cmpl-")
        assert answered.startswith("r1.")
        assert await gw.pool_active() == 0


async def test_an_error_answer_carries_the_id_too(fd_baseline: int) -> None:
    async with open_gateway("http://127.0.0.1:9", connect_retries=0) as gw:
        async with httpx.AsyncClient() as client:
            response = await client.post(
                gw.url + "/v1/completions", json=BODY, headers={"X-Request-Id": "r-err"}
            )
    assert response.status_code >= 500
    assert response.headers["x-request-id"] == "r-err"


def _asample(session: str, seq: int) -> dict[str, object]:
    return {
        "type": "sample",
        "num_samples": 1,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [5, 6, 7]}]},
        "sampling_params": {"max_tokens": 3, "seed": 1, "temperature": 1.0},
        "sampling_session_id": session,
        "seq_id": seq,
    }


async def _sampling_session(http: httpx.AsyncClient) -> str:
    r = await http.post("/api/v1/create_session", json={"tags": [], "sdk_version": "x"})
    r = await http.post(
        "/api/v1/create_sampling_session",
        json={"session_id": r.json()["session_id"], "sampling_session_seq_id": 0, "base_model": "sim-base"},
    )
    return str(r.json()["sampling_session_id"])


async def test_a_tinker_sample_takes_its_future_id_or_the_callers(
    engine: Any, gateway: Gateway
) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        session = await _sampling_session(http)
        plain = await http.post("/api/v1/asample", json=_asample(session, 0))
        named = await http.post(
            "/api/v1/asample", json=_asample(session, 1), headers={"X-Request-Id": "tk-1"}
        )
        future_id = plain.json()["request_id"]
        assert plain.headers["x-request-id"] == future_id
        assert named.headers["x-request-id"] == "tk-1"
        for r in (plain, named):
            done = await http.post("/api/v1/retrieve_future", json={"request_id": r.json()["request_id"]})
            assert done.status_code == 200
    assert sorted(s.rpartition(".")[0] for s in engine.stats.request_ids) == sorted([future_id, "tk-1"])


@pytest.mark.parametrize(
    "method,path,auth,status",
    [
        ("POST", "/v1/completions", False, 401),
        ("POST", "/generate", False, 401),
        ("POST", "/api/v1/asample", False, 401),
        ("GET", "/v1/completions", True, 405),
        ("GET", "/no/such/route", True, 404),
        ("GET", "/no/such/route", False, 404),
        ("POST", "/health", True, 405),
        ("GET", "/health", False, 200),
    ],
)
async def test_every_answer_carries_the_callers_id_refusals_included(
    engine: Any, caplog: pytest.LogCaptureFixture, method: str, path: str, auth: bool, status: int
) -> None:
    caplog.set_level("INFO", logger="trioforward.access")
    headers = {"X-Request-Id": "probe-9", **({"Authorization": "Bearer sekret"} if auth else {})}
    async with open_gateway(engine.url, api_keys=("sekret",)) as gw:
        async with httpx.AsyncClient(base_url=gw.url) as client:
            response = await client.request(method, path, headers=headers)
            fresh = await client.request(method, path, headers={k: v for k, v in headers.items() if k != "X-Request-Id"})
    assert response.status_code == status
    assert response.headers["x-request-id"] == "probe-9"
    assert fresh.headers["x-request-id"] not in ("", "probe-9")  # none sent: a fresh one
    lines = [r.getMessage() for r in caplog.records if r.name == "trioforward.access"]
    assert not any(line.endswith(" id=-") for line in lines), lines
    assert generation_requests(engine) == 0


async def test_a_bad_id_from_an_unknown_caller_is_a_401(engine: Any) -> None:
    async with open_gateway(engine.url, api_keys=("sekret",)) as gw:
        async with httpx.AsyncClient(base_url=gw.url) as client:
            response = await client.post("/v1/completions", json=BODY, headers={"X-Request-Id": "has space"})
    assert response.status_code == 401  # the key first: nothing about the request to an unknown caller
    assert "x-request-id" not in response.headers
