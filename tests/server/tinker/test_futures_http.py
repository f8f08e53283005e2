"""Tinker futures over HTTP: abandoned polls, re-polls, resubmits, 404/408/410/429, error objects."""

from __future__ import annotations

import httpx
import orjson
import trio
import trio.testing
from _tinker_harness import scripted_gateway
from tinker.proto.response_conv import deserialize_sample_response

from trioforward.server.tinker import tinker_state  # noqa: F401  (public surface)
from trioforward.sim.model._generate import expected_completion

PROMPT = [11, 12, 13]


def asample_body(session: str, seq: int, **over: object) -> dict[str, object]:
    body: dict[str, object] = {
        "type": "sample",
        "num_samples": 2,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": PROMPT}]},
        "sampling_params": {
            "max_tokens": 6,
            "seed": 3,
            "temperature": 1.0,
            "top_k": -1,
            "top_p": 1.0,
        },
        "sampling_session_id": session,
        "seq_id": seq,
    }
    body.update(over)
    return body


async def open_session(http: httpx.AsyncClient, model: str = "sim-base") -> str:
    r = await http.post(
        "/api/v1/create_session", json={"tags": [], "user_metadata": {}, "sdk_version": "x"}
    )
    session_id = r.json()["session_id"]
    r = await http.post(
        "/api/v1/create_sampling_session",
        json={"session_id": session_id, "sampling_session_seq_id": 0, "base_model": model},
    )
    assert r.status_code == 200
    return str(r.json()["sampling_session_id"])


async def test_abandoned_poll_then_repoll_gets_same_bytes(fd_baseline: int) -> None:
    async with scripted_gateway(future_hold=30.0) as (url, engine, state):
        engine.gate = trio.Event()
        async with httpx.AsyncClient(base_url=url) as http:
            sampling_session = await open_session(http)
            r = await http.post("/api/v1/asample", json=asample_body(sampling_session, 0))
            future = r.json()
            assert len(future["sample_sequence_ids"]) == 2
            rid = future["request_id"]
            # A poll that the client abandons while the sample runs.
            with trio.move_on_after(0.2):
                await http.post("/api/v1/retrieve_future", json={"request_id": rid})
            # The result lands while nobody polls; the generation was not cancelled.
            engine.gate.set()
            await trio.testing.wait_all_tasks_blocked()
            assert engine.finished == 1
            first = await http.post(
                "/api/v1/retrieve_future", json={"request_id": rid, "allow_metadata_only": True}
            )
            assert first.status_code == 200
            assert first.headers["content-type"] == "application/x-protobuf"
            again = await http.post("/api/v1/retrieve_future", json={"request_id": rid})
            assert again.content == first.content
            response = deserialize_sample_response(first.content)
            for i, seq in enumerate(response.sequences):
                tokens, logprobs, finish = expected_completion("sim-base", PROMPT, 3, i, 6)
                assert seq.tokens == tokens
                assert seq.logprobs == logprobs
                assert seq.stop_reason == finish
        assert state.extras["tinker"].store.statistics().delivered == 1
        assert len(engine.requests) == 1


async def test_resubmit_is_deduplicated(fd_baseline: int) -> None:
    async with scripted_gateway() as (url, engine, _):
        engine.gate = trio.Event()
        async with httpx.AsyncClient(base_url=url) as http:
            sampling_session = await open_session(http)
            ids = set()
            for _ in range(3):  # the SDK retries asample with the same seq_id
                r = await http.post("/api/v1/asample", json=asample_body(sampling_session, 7))
                ids.add(r.json()["request_id"])
            assert len(ids) == 1
            rid = ids.pop()
            engine.gate.set()
            r = await http.post("/api/v1/retrieve_future", json={"request_id": rid})
            assert r.status_code == 200
            # done and retained: a resubmit still maps to the same future
            r2 = await http.post("/api/v1/asample", json=asample_body(sampling_session, 7))
            assert r2.json()["request_id"] == rid
        assert len(engine.requests) == 1
        assert engine.headers[0][0] == ("X-Session-ID", f"{sampling_session}:7")


async def test_hold_limit_answers_408(fd_baseline: int) -> None:
    async with scripted_gateway(future_hold=0.05) as (url, engine, _):
        engine.gate = trio.Event()
        async with httpx.AsyncClient(base_url=url) as http:
            sampling_session = await open_session(http)
            rid = (await http.post("/api/v1/asample", json=asample_body(sampling_session, 0))).json()[
                "request_id"
            ]
            r = await http.post("/api/v1/retrieve_future", json={"request_id": rid})
            assert r.status_code == 408
            assert r.json()["queue_state"] == "active"
            engine.gate.set()
            r = await http.post("/api/v1/retrieve_future", json={"request_id": rid})
            assert r.status_code == 200


async def test_evicted_is_410_and_never_issued_is_404(fd_baseline: int) -> None:
    async with scripted_gateway(max_retained_futures=1) as (url, engine, _):
        async with httpx.AsyncClient(base_url=url) as http:
            sampling_session = await open_session(http)
            first = (await http.post("/api/v1/asample", json=asample_body(sampling_session, 0))).json()[
                "request_id"
            ]
            assert (
                await http.post("/api/v1/retrieve_future", json={"request_id": first})
            ).status_code == 200
            second = (await http.post("/api/v1/asample", json=asample_body(sampling_session, 1))).json()[
                "request_id"
            ]
            assert (
                await http.post("/api/v1/retrieve_future", json={"request_id": second})
            ).status_code == 200
            gone = await http.post("/api/v1/retrieve_future", json={"request_id": first})
            assert gone.status_code == 410
            unknown = await http.post(
                "/api/v1/retrieve_future", json={"request_id": "never-issued"}
            )
            assert unknown.status_code == 404


async def test_admission_control_429(fd_baseline: int) -> None:
    async with scripted_gateway(max_outstanding=1) as (url, engine, _):
        engine.gate = trio.Event()
        async with httpx.AsyncClient(base_url=url) as http:
            sampling_session = await open_session(http)
            assert (
                await http.post("/api/v1/asample", json=asample_body(sampling_session, 0))
            ).status_code == 200
            r = await http.post("/api/v1/asample", json=asample_body(sampling_session, 1))
            assert r.status_code == 429
            assert r.headers["retry-after"] == "1"  # the SDK's backoff reads it
            engine.gate.set()
        assert len(engine.requests) == 1


async def test_engine_4xx_is_a_user_error_5xx_a_server_error(fd_baseline: int) -> None:
    async with scripted_gateway() as (url, engine, _):
        async with httpx.AsyncClient(base_url=url) as http:
            sampling_session = await open_session(http)
            for seq, (status, category) in enumerate(
                [(400, "user"), (500, "server"), (429, "server")]
            ):
                engine.status = status
                rid = (await http.post("/api/v1/asample", json=asample_body(sampling_session, seq))).json()[
                    "request_id"
                ]
                r = await http.post("/api/v1/retrieve_future", json={"request_id": rid})
                assert r.status_code == 200
                doc = orjson.loads(r.content)
                assert doc["category"] == category and "scripted failure" in doc["error"]


async def test_bad_request_and_unknown_sampler(fd_baseline: int) -> None:
    async with scripted_gateway() as (url, engine, _):
        async with httpx.AsyncClient(base_url=url) as http:
            sampling_session = await open_session(http)
            r = await http.post(
                "/api/v1/asample", json=asample_body(sampling_session, 0, topk_prompt_logprobs=3)
            )
            assert r.status_code == 400
            r = await http.post("/api/v1/asample", json=asample_body("nope", 0))
            assert r.status_code == 404
            r = await http.get(f"/api/v1/samplers/{sampling_session}")
            assert r.json() == {
                "sampler_id": sampling_session,
                "base_model": "sim-base",
                "model_path": None,
                "weight_version": None,
            }
        assert engine.requests == []


async def test_fast_path_checks_api_keys_and_body_size(sdk_loop: None, fd_baseline: int) -> None:
    import functools

    import trio as _trio
    from _tinker_harness import real_gateway, sdk_sample

    from trioforward.sim import open_engine

    async with (
        open_engine(port=0) as engine,
        real_gateway(engine.url, api_keys=("tml-good",), max_body_size=4096) as (url, _),
    ):
        async with httpx.AsyncClient(base_url=url) as http:
            body = asample_body("s-x", 0)
            for path in ("/api/v1/asample", "/api/v1/retrieve_future", "/api/v1/create_session"):
                assert (await http.post(path, json=body)).status_code == 401
                assert (
                    await http.post(path, json=body, headers={"X-API-Key": "tml-bad"})
                ).status_code == 401
            big = asample_body(
                "s-x", 0, prompt={"chunks": [{"type": "encoded_text", "tokens": list(range(5000))}]}
            )
            r = await http.post("/api/v1/asample", json=big, headers={"X-API-Key": "tml-good"})
            assert r.status_code == 413
            r = await http.post(
                "/api/v1/retrieve_future", content=b"[1]", headers={"X-API-Key": "tml-good"}
            )
            assert r.status_code == 400
        result = await _trio.to_thread.run_sync(
            functools.partial(
                sdk_sample,
                url,
                base_model="sim-base",
                prompt=PROMPT,
                num_samples=2,
                max_tokens=4,
                seed=1,
                api_key="tml-good",
            )
        )
        assert len(result.sequences) == 2
