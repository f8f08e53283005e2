"""Weight updates over HTTP: POST /admin/pause engine modes, replay, X-Weight-Version,
per-version metrics and the access log (docs/operations.md)."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import orjson
import pytest
import trio
from gateway_harness import open_gateway, open_sim

from trioforward.server.telemetry._metrics import MAX_VERSION_LABELS, Metrics

BODY = {"model": "sim-base", "prompt": "x", "max_tokens": 40, "return_token_ids": True}


async def test_keep_pause_then_resume_with_a_version_over_http(
    fd_baseline: int, caplog: pytest.LogCaptureFixture
) -> None:
    async with open_sim(decode_ms_per_token=20) as engine, open_gateway(engine.url) as gw:
        replies: list[httpx.Response] = []
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:

            async def one() -> None:
                replies.append(await client.post("/v1/completions", json=BODY))

            async with trio.open_nursery() as nursery:
                for _ in range(2):
                    nursery.start_soon(one)
                with trio.fail_after(10):
                    await engine.stats.wait_for(lambda s: s.running == 2)
                paused = await client.post("/admin/pause", json={"engine_mode": "keep"})
                assert paused.status_code == 200, paused.text
                assert paused.json()["engine_pauses"] == {
                    engine.url: {"kind": "vllm", "engine_mode": "keep"}
                }
                assert engine.rl.paused and replies == []
                with caplog.at_level(logging.INFO, logger="trioforward.access"):
                    resumed = await client.post(
                        "/admin/resume", json={"weight_version": "step-120"}
                    )
                    assert resumed.status_code == 200
                    assert resumed.json()["weight_version"] == "step-120"
                    assert resumed.json()["engine_pauses"] == {}
            assert [r.status_code for r in replies] == [200, 200]
            assert {r.headers["x-weight-version"] for r in replies} == {"default, step-120"}
            after = await client.post("/v1/completions", json=BODY)
            assert after.headers["x-weight-version"] == "step-120"
            stream = await client.post("/v1/completions", json={**BODY, "stream": True})
            assert stream.headers["x-weight-version"] == "step-120"
            metrics = (await client.get("/metrics")).text
        assert 'trioforward_weight_version_requests_total{weight_version="step-120"} 2.0' in metrics
        # The two answers that spanned the update are not a version of their own.
        assert "default, step-120" not in metrics
        assert "trioforward_weight_version_mixed_requests_total 2.0" in metrics
        assert engine.rl.weight_version == "step-120" and engine.stats.completed_mixed == 2
        assert "version=step-120" in caplog.text


async def test_abort_with_replay_over_http_has_no_failures(fd_baseline: int) -> None:
    async with open_sim(decode_ms_per_token=20) as engine, open_gateway(engine.url) as gw:
        replies: list[httpx.Response] = []
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:

            async def one() -> None:
                replies.append(await client.post("/v1/completions", json=BODY))

            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(one)
                with trio.fail_after(10):
                    await engine.stats.wait_for(lambda s: s.running == 4)
                paused = await client.post(
                    "/admin/pause", json={"engine_mode": "abort", "replay": True}
                )
                assert paused.status_code == 200 and engine.stats.pause_aborted == 4
                await client.post("/admin/resume", json={"weight_version": "v2"})
        assert [r.status_code for r in replies] == [200] * 4
        for reply in replies:
            assert reply.headers["x-weight-version"] == "v2"
            choice = reply.json()["choices"][0]
            assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 40
        assert engine.stats.completed_by_version == {"v2": 4}


async def test_abort_with_continue_over_http_answers_in_the_callers_shape(fd_baseline: int) -> None:
    async with open_sim(decode_ms_per_token=20) as engine, open_gateway(engine.url) as gw:
        await_resume = {"weight_version": "v1"}
        replies: list[httpx.Response] = []
        plain = {k: v for k, v in BODY.items() if k != "return_token_ids"}  # a text prompt
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            await client.post("/admin/resume", json=await_resume)

            async def one() -> None:
                replies.append(await client.post("/v1/completions", json=plain))

            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(one)
                with trio.fail_after(10):
                    await engine.stats.wait_for(lambda s: s.running == 4)
                paused = await client.post(
                    "/admin/pause", json={"engine_mode": "abort", "replay": "continue"}
                )
                assert paused.status_code == 200 and engine.stats.pause_aborted == 4
                await client.post("/admin/resume", json={"weight_version": "v2"})
        assert [r.status_code for r in replies] == [200] * 4
        for reply in replies:
            assert reply.headers["x-weight-version"] in ("v2", "v1, v2")
            doc = reply.json()
            [choice] = doc["choices"]
            assert choice["finish_reason"] == "length" and doc["usage"]["completion_tokens"] == 40
            assert choice["token_ids"] is None and choice["prompt_token_ids"] is None
            spans = choice["weight_versions"]
            assert spans[0]["start"] == 0 and spans[-1] == {**spans[-1], "version": "v2", "end": 40}
            assert all(a["end"] == b["start"] for a, b in zip(spans, spans[1:], strict=False))


async def test_a_stream_paused_with_continue_is_one_stream_with_done(fd_baseline: int) -> None:
    async with open_sim(decode_ms_per_token=20) as engine, open_gateway(engine.url) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            body = b""
            payload = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
            async with client.stream("POST", "/v1/completions", json=payload) as r:
                assert r.status_code == 200
                paused = False
                async for chunk in r.aiter_bytes():
                    body += chunk
                    if body.count(b"data: ") >= 3 and not paused:
                        paused = True
                        answer = await client.post(
                            "/admin/pause", json={"engine_mode": "abort", "replay": "continue"}
                        )
                        assert answer.status_code == 200
                        await client.post("/admin/resume", json={"weight_version": "v2"})
        assert body.endswith(b"data: [DONE]\n\n") and b'"finish_reason":"abort"' not in body
        events = [orjson.loads(e[6:]) for e in body.split(b"\n\n") if e and e != b"data: [DONE]"]
        tokens = [t for e in events for c in e["choices"] for t in c["token_ids"]]
        assert len(tokens) == 40 and events[-1]["usage"]["completion_tokens"] == 40
        assert events[-2]["choices"][0]["weight_versions"][-1]["end"] == 40
        # decoded once (a token decoded as the abort landed, never sent, may be lost)
        assert 40 <= engine.stats.tokens_decoded <= 41


async def test_a_continued_stream_is_logged_and_counted_as_mixed_version(
    fd_baseline: int, caplog: pytest.LogCaptureFixture
) -> None:
    # A /v1/completions stream started under v1, continued after an abort pause
    # under v2: two engine attempts, and an answer of both versions, as a
    # non-streamed one is counted (it was logged attempts=1 version=v1 and counted
    # under v1).
    caplog.set_level("INFO", logger="trioforward.access")
    async with open_sim(decode_ms_per_token=20) as engine, open_gateway(engine.url) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            await client.post("/admin/resume", json={"weight_version": "v1"})
            body = b""
            async with client.stream("POST", "/v1/completions", json={**BODY, "stream": True}) as r:
                assert r.headers["x-weight-version"] == "v1"  # the head: at dispatch
                paused = False
                async for chunk in r.aiter_bytes():
                    body += chunk
                    if body.count(b"data: ") >= 3 and not paused:
                        paused = True
                        answer = await client.post(
                            "/admin/pause", json={"engine_mode": "abort", "replay": "continue"}
                        )
                        assert answer.status_code == 200
                        await client.post("/admin/resume", json={"weight_version": "v2"})
            assert body.endswith(b"data: [DONE]\n\n")
            metrics = (await client.get("/metrics")).text
    assert engine.stats.by_path["/v1/completions"] == 2  # the stream and its continuation
    assert "trioforward_weight_version_mixed_requests_total 1.0" in metrics
    assert 'trioforward_weight_version_requests_total{weight_version="v1"}' not in metrics
    lines = [r.getMessage() for r in caplog.records if r.name == "trioforward.access"]
    [line] = [x for x in lines if x.startswith("POST /v1/completions ")]
    assert " attempts=2 " in line and line.split()[-1] == "version=v1,v2", line


async def test_a_stream_paused_with_abort_ends_with_one_error_event(fd_baseline: int) -> None:
    async with open_sim(decode_ms_per_token=20) as engine, open_gateway(engine.url) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            body = b""
            async with client.stream("POST", "/v1/completions", json={**BODY, "stream": True}) as r:
                assert r.status_code == 200
                async for chunk in r.aiter_bytes():
                    body += chunk
                    if body.count(b"data: ") == 3:
                        paused = await client.post(
                            "/admin/pause", json={"engine_mode": "abort", "replay": True}
                        )
                        assert paused.status_code == 200
            await client.post("/admin/resume", json={})
        events = [e for e in body.split(b"\n\n") if e]
        assert b"[DONE]" not in body and b'"finish_reason":"abort"' not in body
        error = orjson.loads(events[-1].removeprefix(b"data: "))
        assert error["error"]["code"] == "aborted"
        assert engine.stats.by_path["/v1/completions"] == 1  # a started stream is not replayed


async def test_bad_pause_and_resume_bodies_and_a_failing_engine(fd_baseline: int) -> None:
    async with (
        open_sim() as good,
        open_sim(kind="sglang") as bad,
        open_gateway(good.url, bad.url, engine_kind="vllm") as gw,
    ):
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            for data, param in (
                ({"engine_mode": "freeze"}, "engine_mode"),
                ({"engine_mode": "keep", "replay": "yes"}, "replay"),
            ):
                response = await client.post("/admin/pause", json=data)
                assert response.status_code == 400 and response.json()["error"]["param"] == param
            bad_version = await client.post("/admin/resume", json={"weight_version": "é" * 3})
            assert bad_version.status_code == 400
            failed = await client.post("/admin/pause", json={"engine_mode": "keep"})
            assert failed.status_code == 502
            error: dict[str, Any] = failed.json()["error"]
            assert error["code"] == "engine_control_failed" and error["engine"] == bad.url
            assert good.stats.resumes == 1 and not good.rl.paused
            listed = (await client.get("/admin/engines")).json()["engines"]
            assert [e["paused"] for e in listed] == [False, False]


def test_version_labels_are_bounded() -> None:
    metrics = Metrics(lambda: None)
    for step in range(3 * MAX_VERSION_LABELS):
        metrics.observe("/v1/completions", 200, weight_version=f"step-{step}")
    text = metrics.render().decode()
    series = [
        line
        for line in text.splitlines()
        if line.startswith("trioforward_weight_version_requests_total{")
    ]
    assert len(series) == MAX_VERSION_LABELS
    assert f'weight_version="step-{3 * MAX_VERSION_LABELS - 1}"' in text
    assert 'weight_version="step-0"' not in text


async def test_tinker_results_carry_the_weight_version(fd_baseline: int) -> None:
    # The SampleResponse protobuf has no field for it: the retrieve_future answer
    # carries X-Weight-Version and the sampler info says what samples run on now.
    sample = {
        "type": "sample",
        "num_samples": 1,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [11, 12, 13]}]},
        "sampling_params": {"max_tokens": 5, "seed": 3, "temperature": 1.0},
    }
    async with open_sim(decode_ms_per_token=20) as engine, open_gateway(engine.url) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            session = (await client.post("/api/v1/create_session", json={"tags": []})).json()
            created = await client.post(
                "/api/v1/create_sampling_session",
                json={"session_id": session["session_id"], "base_model": "sim-base"},
            )
            sampler = created.json()["sampling_session_id"]

            async def submit(seq: int) -> str:
                body = {**sample, "sampling_session_id": sampler, "seq_id": seq}
                answer = await client.post("/api/v1/asample", json=body)
                assert answer.status_code == 200 and "x-weight-version" not in answer.headers
                return str(answer.json()["request_id"])

            async def retrieve(request_id: str) -> httpx.Response:
                answer = await client.post("/api/v1/retrieve_future", json={"request_id": request_id})
                assert answer.status_code == 200
                assert answer.headers["content-type"] == "application/x-protobuf"
                return answer

            before = await retrieve(await submit(0))
            assert "x-weight-version" not in before.headers  # no version recorded yet
            assert (await client.post("/admin/pause", json={})).status_code == 200
            held = await submit(1)  # waits at the gate: dispatched after the resume
            resumed = await client.post("/admin/resume", json={"weight_version": "step-7"})
            assert resumed.status_code == 200
            after = await retrieve(held)
            assert after.headers["x-weight-version"] == "step-7"
            repoll = await retrieve(held)
            assert repoll.content == after.content
            assert repoll.headers["x-weight-version"] == "step-7"
            info = (await client.get(f"/api/v1/samplers/{sampler}")).json()
            assert info["weight_version"] == "step-7"
            metrics = (await client.get("/metrics")).text
        assert 'trioforward_weight_version_requests_total{weight_version="step-7"} 1.0' in metrics
        assert engine.stats.by_path["/v1/completions"] == 2


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"engine_mode": "keep", "mode": "abort"}, "mode"),
        ({"engine_mode": "wait", "mode": "abort"}, "mode"),
        ({"engine_mode": "keep", "replay": True}, "replay"),
        ({"replay": True}, "replay"),  # gate-only wait ends nothing to replay
        ({"engine_mode": "keep", "replay": "continue"}, "replay"),
        ({"engine_mode": "wait", "replay": "continue"}, "replay"),
        ({"engine_mode": "abort", "replay": 1}, "replay"),
    ],
)
async def test_a_pause_that_contradicts_itself_is_refused_and_pauses_nothing(
    fd_baseline: int, body: dict[str, Any], param: str
) -> None:
    async with open_sim() as engine, open_gateway(engine.url) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            refused = await client.post("/admin/pause", json=body)
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert error["param"] == param and error["type"] == "invalid_request_error"
            engines = (await client.get("/admin/engines")).json()["engines"]
            assert [e["paused"] for e in engines] == [False]
            assert not engine.rl.paused
            assert (await client.post("/v1/completions", json=BODY)).status_code == 200


async def test_an_sglang_generate_ended_by_an_abort_pause_is_replayed_not_handed_out(
    fd_baseline: int,
) -> None:
    # SGLang's /generate says abort as {"type": "abort"}: the gateway sees it too.
    async with open_sim(kind="sglang", decode_ms_per_token=20) as engine, open_gateway(engine.url) as gw:
        client = gw.app.extensions["trioforward"].client
        with trio.fail_after(10):
            await client.engines.wait_kind(engine.url)
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 40}}
        replies: list[httpx.Response] = []
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:

            async def one() -> None:
                replies.append(await c.post("/generate", json=body))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(one)
                with trio.fail_after(10):
                    await engine.stats.wait_for(lambda s: s.running == 1)
                paused = await c.post("/admin/pause", json={"engine_mode": "abort", "replay": "continue"})
                assert paused.status_code == 200 and engine.stats.pause_aborted == 1
                await c.post("/admin/resume", json={"weight_version": "v2"})
        meta = replies[0].json()["meta_info"]
        assert meta["finish_reason"]["type"] == "length" and len(replies[0].json()["output_ids"]) == 40
        assert engine.stats.by_path["/generate"] == 2  # replayed whole


async def test_a_resume_sent_while_a_wait_pause_drains_leaves_no_engine_paused(
    fd_baseline: int,
) -> None:
    # The field report: POST /admin/pause {"engine_mode": "wait"} with generations
    # in flight, POST /admin/resume {} while it drains. The pause answers 409
    # pause_overtaken, /admin/engines and the engine agree it is not paused, and
    # a new request is answered (before: it hung on the still paused engine).
    # (SGLang's kind: tests/dispatch/test_dispatch_pause_order.py.)
    async with open_sim(decode_ms_per_token=20) as engine, open_gateway(engine.url) as gw:
        replies: list[httpx.Response] = []
        paused: list[httpx.Response] = []
        body = {**BODY, "prompt": [1, 2, 3]}
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:

            async def one() -> None:
                replies.append(await client.post("/v1/completions", json=body))

            async def pause() -> None:
                paused.append(await client.post("/admin/pause", json={"engine_mode": "wait"}))

            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    for _ in range(2):
                        nursery.start_soon(one)
                    await engine.stats.wait_for(lambda s: s.running == 2)
                    nursery.start_soon(pause)
                    # The engine got /pause?mode=wait: the pause drains now.
                    await engine.stats.wait_for(lambda s: s.pauses["wait"] == 1)
                    resumed = await client.post("/admin/resume", json={})
                    assert resumed.status_code == 200, resumed.text
                [p] = paused
                assert p.status_code == 409 and p.json()["error"]["code"] == "pause_overtaken", p.text
                engines = (await client.get("/admin/engines")).json()["engines"]
                assert [e["paused"] for e in engines] == [False] and not engine.rl.paused
                again = await client.post("/v1/completions", json=body)
        assert [r.status_code for r in replies] == [200, 200] and again.status_code == 200
        assert engine.stats.completed == 3 and engine.stats.resumes == 1
        assert await gw.pool_active() == 0
