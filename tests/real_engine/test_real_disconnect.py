"""A client that hangs up mid-generation makes vLLM abort the request (its log and /metrics)."""

from __future__ import annotations

import time

import httpx
from conftest import Server
from prometheus_client.parser import text_string_to_metric_families
from vllm_probes import MODEL

N, MAX_TOKENS = 16, 250  # 4000 tokens: seconds of work on 2 cores, cut after the first chunk


def metric(engine: Server, name: str) -> float:
    text = httpx.get(engine.url + "/metrics", timeout=10).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    )


def test_disconnect_mid_generation_aborts_on_vllm(gateway_lora: Server, vllm_lora: Server) -> None:
    aborts = vllm_lora.count("Aborted request")
    generated = metric(vllm_lora, "vllm:generation_tokens_total")
    body = {
        "model": MODEL,
        "prompt": [0, 413],
        "n": N,
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "stream": True,
    }
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", gateway_lora.url + "/v1/completions", json=body) as reply,
    ):
        assert reply.status_code == 200
        next(reply.iter_raw())  # generation has started
    # The connection is closed. vLLM is another process: poll its log and metrics.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if vllm_lora.count("Aborted request") > aborts:
            if metric(vllm_lora, "vllm:num_requests_running") == 0:
                break
        time.sleep(0.2)
    assert vllm_lora.count("Aborted request") == aborts + 1
    assert metric(vllm_lora, "vllm:num_requests_running") == 0
    assert metric(vllm_lora, "vllm:generation_tokens_total") - generated < N * MAX_TOKENS
