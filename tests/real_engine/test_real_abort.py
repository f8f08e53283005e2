"""POST /admin/abort of one rollout group while vLLM 0.32 (dev mode) decodes it.

The group's requests come back 200 with the tokens decoded so far and
``finish_reason: "abort"``; vLLM's own counters say those sequences stopped
and nothing else did: ``vllm:request_success_total`` counts only the other
group's sequences (vLLM 0.32 counts a sequence aborted through
``/abort_requests`` in no ``finished_reason``), and
``vllm:generation_tokens_total`` grew by far less than the aborted group's
full length.

Why the group is sent while vLLM's scheduler is held (``POST /pause?mode=keep``
on vLLM itself, behind the gateway's back): on the CI machine (2 vCPUs), while
vLLM's CPU engine decodes a small batch, every other process is stalled for
0.5-0.9 s at a time. Measured with a fresh vLLM, a fresh gateway and a logging
TCP proxy between them, plus an idle heartbeat process: the gateway dispatched
each request within ~10 ms of receiving it, but the test client's threads,
still building their HTTP clients when the first request reached vLLM, sent
their requests only as vLLM finished the one before (0.6-0.7 s apart), and the
heartbeat showed gaps of the same length; the same happened with no gateway at
all (client to vLLM directly). So the group reached vLLM one request at a
time and none ran at the abort. Neither the gateway nor vLLM's API server
serializes anything: the senders are starved. Held, vLLM decodes nothing, the
machine stays responsive, and every request of both groups is on the engine
before the first token is decoded.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import httpx
from conftest import Server
from test_real_weight_update import (
    _finished,
    _generated,
    _wait_until_decoding,
    _wait_until_dispatched,
)
from vllm_probes import MODEL

# 8 requests of 16 sequences of 240 tokens (max_model_len 256 minus the prompt):
# seconds of work for the CPU engine decoding them together, so the abort lands
# while it decodes; 2 requests of the other group, 16 tokens each.
N, SEQS, LONG, SHORT = 8, 16, 240, 16


def _body(max_tokens: int) -> dict[str, object]:
    return {
        "model": MODEL,
        "prompt": [0, 413],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "return_token_ids": True,
        "n": SEQS,
    }


def test_abort_a_group_while_vllm_decodes(gateway_base: Server, vllm_base: Server) -> None:
    # The promise is asserted on every round; a round whose abort reached vLLM after
    # the group had finished (the machine stalled longer than the group's decode) is
    # made again, at most 3 times.
    for round_ in range(3):
        if _abort_round(gateway_base, vllm_base, f"RA{round_}"):
            return
    raise AssertionError("3 aborts in a row caught no sequence running")


def _abort_round(gateway_base: Server, vllm_base: Server, group: str) -> int:
    """One group abort; asserts what the answers and vLLM's counters must show and
    returns how many sequences the abort cut."""
    url = gateway_base.url + "/v1/completions"
    # One client for every request, made before any is sent.
    with (
        httpx.Client(timeout=60) as admin,
        httpx.Client(timeout=300) as client,
        ThreadPoolExecutor(N + 2) as pool,
    ):
        before = _finished(admin, vllm_base)
        generated = _generated(admin, vllm_base)

        def post(group: str, max_tokens: int) -> httpx.Response:
            return client.post(url, json=_body(max_tokens), headers={"X-Rollout-Group": group})

        held = admin.post(vllm_base.url + "/pause", params={"mode": "keep"})
        assert held.status_code == 200, held.text
        try:
            doomed: list[Future[httpx.Response]] = [
                pool.submit(post, group, LONG) for _ in range(N)
            ]
            kept = [pool.submit(post, "RB", SHORT) for _ in range(2)]
            # Every request of both groups is on the engine (dispatched by the gateway,
            # held by vLLM's paused scheduler) before anything is decoded.
            _wait_until_dispatched(admin, gateway_base, doomed + kept)
        finally:
            resumed = admin.post(vllm_base.url + "/resume")
        assert resumed.status_code == 200, resumed.text
        _wait_until_decoding(admin, vllm_base, generated, doomed)
        answer = admin.post(gateway_base.url + "/admin/abort", json={"group": group})
        assert answer.status_code == 200, answer.text
        counts = answer.json()
        assert counts["queued"] == 0 and counts["on_engine"] + counts["finished"] == N, counts
        aborted = [f.result() for f in doomed]
        whole = [f.result() for f in kept]
    cut = returned = 0
    for response in aborted:
        assert response.status_code == 200, response.text
        for choice in response.json()["choices"]:
            returned += len(choice["token_ids"])
            if choice["finish_reason"] == "abort":
                cut += 1
                assert len(choice["token_ids"]) < LONG
            else:  # finished before the abort reached it
                assert len(choice["token_ids"]) == LONG
    for response in whole:
        assert response.status_code == 200, response.text
        assert all(
            c["finish_reason"] == "length" and len(c["token_ids"]) == SHORT
            for c in response.json()["choices"]
        )
    with httpx.Client(timeout=30) as http:
        after = _finished(http, vllm_base)
        decoded = _generated(http, vllm_base) - generated
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    # Finished normally: the other group, and the group's sequences that ended first.
    assert delta.get("length", 0) == 2 * SEQS + (N * SEQS - cut)
    assert sum(delta.values()) == delta.get("length", 0)  # nothing else finished
    # The engine stopped decoding the cut sequences: it decoded what came back,
    # give or take the steps in flight, not their full length.
    assert returned + 2 * SEQS * SHORT <= decoded
    if cut:
        assert decoded < N * SEQS * LONG
    return cut
