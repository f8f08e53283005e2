"""vLLM 0.32's token route (``--enable-scale-out``) through the gateway: the same
answer as the engine gives directly, whole and streamed; the gateway's own
token-level requests (complete(), Tinker) sent on it; a hang-up, and an abort by
the caller's id through the gateway's /inference/v1/abort_requests, abort the
generation (docs/server.md, "Token routes"; docs/dispatch.md, "Engine dialects")."""

from __future__ import annotations

import httpx
import numpy as np
import orjson
import trio
from conftest import Server
from vllm_probes import MODEL, PROMPT_IDS

import trioforward

BODY = {
    "model": MODEL,
    "token_ids": PROMPT_IDS,
    "sampling_params": {"max_tokens": 8, "temperature": 0.7, "seed": 11, "logprobs": 1, "n": 2},
}


def _events(content: bytes) -> list[dict]:
    parts = [p for p in content.split(b"\n\n") if p]
    assert parts[-1] == b"data: [DONE]"
    return [orjson.loads(p[6:]) for p in parts[:-1]]


async def test_token_route_through_the_gateway_equals_direct(vllm_base: Server, gateway_base: Server) -> None:
    async with httpx.AsyncClient(timeout=120) as http:
        engines = (await http.get(gateway_base.url + "/admin/engines")).json()["engines"]
        assert [(e["kind"], e["token_route"]) for e in engines] == [("vllm", True)]
        direct = (await http.post(vllm_base.url + "/inference/v1/generate", json={**BODY, "request_id": "d1"})).json()
        r = await http.post(gateway_base.url + "/inference/v1/generate", json={**BODY, "request_id": "g1"})
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["request_id"] == "generate-tokens-g1"
        for mine, theirs in zip(got["choices"], direct["choices"], strict=True):
            assert mine["token_ids"] == theirs["token_ids"]
            assert mine["weight_versions"] == theirs["weight_versions"]
            lp = [c["logprob"] for c in mine["logprobs"]["content"]]
            np.testing.assert_allclose(lp, [c["logprob"] for c in theirs["logprobs"]["content"]], rtol=1e-4, atol=1e-4)
        stream = {**BODY, "stream": True}
        direct_s = await http.post(vllm_base.url + "/inference/v1/generate", json=stream)
        gw_s = await http.post(gateway_base.url + "/inference/v1/generate", json=stream)
    assert gw_s.status_code == 200
    def tokens(content: bytes, index: int) -> list[int]:
        return [t for e in _events(content) for c in e["choices"] if c["index"] == index for t in c["token_ids"]]

    for index in range(2):
        assert tokens(gw_s.content, index) == tokens(direct_s.content, index)
    assert tokens(gw_s.content, 0) == got["choices"][0]["token_ids"]


async def test_complete_goes_on_the_token_route(vllm_base: Server) -> None:
    async with trioforward.open_client(engines=[vllm_base.url]) as client:
        with trio.fail_after(60):
            info = await client.engines.wait_kind(vllm_base.url)
        assert (info.kind, info.token_route) == ("vllm", True)
        completion = await client.complete(model=MODEL, prompt=PROMPT_IDS, max_tokens=8, n=2, temperature=0.7, seed=5)
    body = {"model": MODEL, "prompt": PROMPT_IDS, "return_token_ids": True, "logprobs": 1,
            "max_tokens": 8, "n": 2, "temperature": 0.7, "seed": 5}  # fmt: skip
    async with httpx.AsyncClient(timeout=60) as http:
        direct = (await http.post(vllm_base.url + "/v1/completions", json=body)).json()
    for mine, theirs in zip(completion.choices, direct["choices"], strict=True):
        assert mine.tokens.tolist() == theirs["token_ids"]
        want = np.array(theirs["logprobs"]["token_logprobs"], dtype=np.float32)
        np.testing.assert_allclose(mine.logprobs, want, rtol=1e-4, atol=1e-4)


def test_a_tinker_sample_goes_on_the_token_route(gateway_base: Server, vllm_base: Server) -> None:
    from test_real_tinker import direct, sampling_client, submit

    before = vllm_base.count("/inference/v1/generate")
    result = submit(sampling_client(gateway_base, base_model=MODEL), seed=3).result(timeout=120)
    assert [s.tokens for s in result.sequences] == direct(vllm_base, MODEL, 3)
    assert all(len(s.logprobs) == 8 for s in result.sequences)
    assert vllm_base.count("/inference/v1/generate") > before  # vLLM's access log: the token route


def test_a_hang_up_on_the_token_route_aborts_on_vllm(gateway_base: Server, vllm_base: Server) -> None:
    import time

    from test_real_disconnect import metric

    # 128 sequences of 250 tokens: seconds of work on 2 cores, cut after the first
    # event (16 sequences, 4,000 tokens, were all decoded before the hang-up reached
    # vLLM on a quiet machine: its first stream event can come late, coalesced).
    n, max_tokens = 128, 250
    generated = metric(vllm_base, "vllm:generation_tokens_total")
    body = {
        "model": MODEL,
        "token_ids": [0, 413],
        "sampling_params": {"n": n, "max_tokens": max_tokens, "ignore_eos": True},
        "stream": True,
    }
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", gateway_base.url + "/inference/v1/generate", json=body) as reply,
    ):
        assert reply.status_code == 200
        next(reply.iter_raw())  # generation has started
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and metric(vllm_base, "vllm:num_requests_running") > 0:
        time.sleep(0.2)
    assert metric(vllm_base, "vllm:num_requests_running") == 0
    assert metric(vllm_base, "vllm:generation_tokens_total") - generated < n * max_tokens


def test_an_abort_by_the_callers_id_ends_it_on_vllm(gateway_base: Server, vllm_base: Server) -> None:
    """POST /inference/v1/abort_requests to the gateway with the caller's request_id
    ends the generation on vLLM (by the engine-side id the gateway gave the attempt):
    the stream ends with vLLM's abort, vLLM runs nothing after, fewer tokens decoded.

    The stream is sent while vLLM's scheduler is held (``POST /pause?mode=keep`` on
    vLLM itself) and the abort goes out as soon as vLLM is resumed, not once the stream's
    first event arrives: vLLM coalesces stream events, and while its CPU engine
    decodes, the machine stalls the test's threads for 0.5-0.9 s at a time (the
    measurement is in test_real_abort.py), so a first event could come after most
    of the generation (seen in CI: every sequence finished "length"). A round whose
    abort still came after the generation had finished is made again, at most 3."""
    for round_ in range(3):
        if _abort_round(gateway_base, vllm_base, f"real-abort-{round_}"):
            return
    raise AssertionError("3 aborts in a row reached vLLM after the generation had finished")


def _abort_round(gateway_base: Server, vllm_base: Server, request_id: str) -> bool:
    """One abort by the caller's id; asserts the promise and returns whether the
    abort cut the generation."""
    import threading
    import time

    from test_real_disconnect import metric
    from test_real_weight_update import _generated

    n, max_tokens = 64, 250
    body = {
        "model": MODEL,
        "token_ids": [0, 413],
        "request_id": request_id,
        "sampling_params": {"n": n, "max_tokens": max_tokens, "ignore_eos": True},
        "stream": True,
    }
    events: list[str] = []
    with httpx.Client(timeout=120) as admin, httpx.Client(timeout=120) as client:
        generated = _generated(admin, vllm_base)

        def read() -> None:
            with client.stream("POST", gateway_base.url + "/inference/v1/generate", json=body) as reply:
                assert reply.status_code == 200
                for line in reply.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])

        held = admin.post(vllm_base.url + "/pause", params={"mode": "keep"})
        assert held.status_code == 200, held.text
        reader = threading.Thread(target=read)
        try:
            reader.start()
            deadline = time.monotonic() + 60
            while sum(e["in_flight"] for e in admin.get(gateway_base.url + "/admin/engines").json()["engines"]) < 1:
                assert time.monotonic() < deadline, "the gateway never dispatched the stream"
                time.sleep(0.01)
        finally:
            resumed = admin.post(vllm_base.url + "/resume")
        assert resumed.status_code == 200, resumed.text
        # At once: the stream is on vLLM, its 250 steps of 64 sequences ahead. Not
        # once vLLM's /metrics shows it decoding: a loaded vLLM answered that poll
        # after the generation had finished (3 rounds in a row, seen here).
        answer = admin.post(
            gateway_base.url + "/inference/v1/abort_requests", json={"request_ids": [request_id, "nobody"]}
        )
        assert answer.status_code == 200 and answer.content == b""
        reader.join(120)
    assert not reader.is_alive() and events[-1] == "[DONE]"
    finishes = [c["finish_reason"] for e in events[:-1] for c in orjson.loads(e)["choices"] if c["finish_reason"]]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and metric(vllm_base, "vllm:num_requests_running") > 0:
        time.sleep(0.2)
    assert metric(vllm_base, "vllm:num_requests_running") == 0
    decoded = metric(vllm_base, "vllm:generation_tokens_total") - generated
    if "abort" not in finishes:  # finished before the abort reached vLLM
        assert finishes == ["length"] * n
        return False
    assert decoded < n * max_tokens
    return True
