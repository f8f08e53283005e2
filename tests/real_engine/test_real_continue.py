"""An abort weight update with replay "continue" while vLLM 0.32 decodes (docs/operations.md,
"Continue after an abort pause"): every answer has its full length, spans name both
versions where the pause split it, the first segment is what vLLM had streamed before
the pause, and vLLM's own generation counter shows no whole re-run."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson
from conftest import Server
from test_real_weight_update import _generated, _wait_until_dispatched
from vllm_probes import MODEL

# 16 requests of 8 sequences (seconds of engine work on 2 cores: the pause lands
# while vLLM decodes) beside one streamed sequence.
MAX_TOKENS, N, SEQS = 240, 16, 8
BODY = {"model": MODEL, "prompt": [0, 413], "max_tokens": MAX_TOKENS, "ignore_eos": True}


def _stream(url: str, seen: list[list[int]], events: list[dict], first: threading.Event) -> None:
    with httpx.Client(timeout=300) as client:
        body = {**BODY, "stream": True, "return_token_ids": True, "n": 1}
        with client.stream("POST", url, json=body) as r:
            assert r.status_code == 200
            buffer = b""
            for chunk in r.iter_bytes():
                buffer += chunk
                *done, buffer = buffer.split(b"\n\n")
                for raw in done:
                    if not raw.startswith(b"data: ") or raw == b"data: [DONE]":
                        continue
                    event = orjson.loads(raw[6:])
                    events.append(event)
                    for c in event["choices"]:
                        seen.append(c["token_ids"])
                    if sum(len(t) for t in seen) >= 5:
                        first.set()
    first.set()


def _update(gateway: Server, engine: Server, step: int) -> bool:
    """One abort update with continue under load; asserts the promise; True if the
    pause caught some sequence decoding (it was continued)."""
    url = gateway.url + "/v1/completions"
    old, new = f"c{step}-old", f"c{step}-new"
    with httpx.Client(timeout=60) as admin:
        assert admin.post(gateway.url + "/admin/resume", json={"weight_version": old}).status_code == 200
        before = _generated(admin, engine)
        seen: list[list[int]] = []
        events: list[dict] = []
        first = threading.Event()
        with ThreadPoolExecutor(N + 1) as pool, httpx.Client(timeout=300) as client:
            stream = pool.submit(_stream, url, seen, events, first)
            whole = [pool.submit(client.post, url, json={**BODY, "n": SEQS}) for _ in range(N)]
            # Once the gateway dispatched everything (its own count, in milliseconds),
            # plus a moment for vLLM to start decoding, longer on each retry. Not the
            # stream's first tokens alone: vLLM's busy API server coalesces stream
            # events, and the first event seen on a quiet machine held all 240.
            _wait_until_dispatched(admin, gateway, [stream, *whole])
            time.sleep(0.2 * step)
            streamed_before = sum(len(t) for t in seen)
            paused = admin.post(
                gateway.url + "/admin/pause", json={"engine_mode": "abort", "replay": "continue"}
            )
            assert paused.status_code == 200, paused.text
            time.sleep(1.0)  # the weight update
            resumed = admin.post(gateway.url + "/admin/resume", json={"weight_version": new})
            assert resumed.status_code == 200, resumed.text
            stream.result()
            replies = [f.result() for f in whole]
        time.sleep(1.0)  # vLLM updates its counters just after the answers
        decoded = _generated(admin, engine) - before
    # The stream: one stream, every token once, the first span what vLLM had sent.
    tokens = [t for ids in seen for t in ids]
    assert len(tokens) == MAX_TOKENS
    last = events[-1]["choices"][0] if events[-1]["choices"] else events[-2]["choices"][0]
    assert last["finish_reason"] == "length"
    # Every stream that asked for token ids ends with its spans once a version is
    # recorded (docs/operations.md, "Weight versions"): one span when the pause
    # missed it, both versions when the pause caught it decoding.
    spans = last["weight_versions"]
    stream_versions = [s["version"] for s in spans]
    assert stream_versions in ([old], [new], [old, new]), spans
    assert spans[-1]["end"] == MAX_TOKENS
    if stream_versions == [old, new]:  # the pause caught the stream decoding
        assert spans[0]["end"] >= streamed_before
    delivered = MAX_TOKENS
    continued = 0
    for reply in replies:
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == MAX_TOKENS * SEQS
        delivered += MAX_TOKENS * SEQS
        for choice in reply.json()["choices"]:
            assert choice["finish_reason"] == "length" and choice["token_ids"] is None
            versions = [s["version"] for s in choice.get("weight_versions") or []]
            assert versions in ([], [old], [new], [old, new]), versions
            continued += versions == [old, new]
    # No whole re-run: vLLM decoded what was delivered, give or take the step that
    # was running as the pause landed (a token or two per sequence).
    sequences = N * SEQS + 1
    assert delivered <= decoded <= delivered + 2 * sequences, (decoded, delivered)
    print(
        f"\ncontinue {step}: stream had {streamed_before} tokens at the pause, spans {spans};"
        f" {continued} of {N * SEQS} sequences continued; vLLM decoded {decoded:.0f} for"
        f" {delivered} delivered"
    )
    return stream_versions == [old, new] or continued > 0


def test_abort_update_with_continue_keeps_what_vllm_decoded(
    gateway_base: Server, vllm_base: Server
) -> None:
    # As the abort test of test_real_weight_update.py: vLLM's pause may take effect
    # after every request finished; the promise is asserted on every update, made
    # again (at most 3 times) until one caught sequences decoding.
    for step in range(1, 4):
        if _update(gateway_base, vllm_base, step):
            return
    raise AssertionError("3 abort pauses in a row caught no sequence decoding")
