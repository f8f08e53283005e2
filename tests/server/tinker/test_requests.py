"""Parsing the SDK's bodies into engine requests; model_path resolution."""

from __future__ import annotations

import os

import orjson
import pytest

from trioforward.server.tinker._requests import (
    BadRequest,
    adapter_for_path,
    make_sampling_session,
    parse_sample,
    sampling_session_from_id,
)


def sample_body(**over: object) -> dict[str, object]:
    body: dict[str, object] = {
        "type": "sample",
        "num_samples": 3,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}, {"tokens": [3]}]},
        "sampling_params": {
            "max_tokens": 8,
            "seed": 7,
            "stop": ["\n"],
            "temperature": 0.5,
            "top_k": -1,
            "top_p": 1,
        },
        "sampling_session_id": "s-x",
        "seq_id": 4,
        "some_future_field": {"ignored": True},
    }
    body.update(over)
    return body


def test_engine_body() -> None:
    sampling_session = make_sampling_session("sess", 0, "sim-base", None, "/a", {})
    job = parse_sample(sample_body(), sampling_session)
    doc = orjson.loads(job.body)
    assert doc == {
        "model": "sim-base",
        "prompt": [1, 2, 3],
        "n": 3,
        "temperature": 0.5,
        "top_p": 1.0,
        "top_k": -1,
        "logprobs": 1,
        "return_token_ids": True,
        "stream": False,
        "max_tokens": 8,
        "seed": 7,
        "stop": ["\n"],
    }
    assert job.session == f"{sampling_session.sampler_id}:4"
    assert job.num_samples == 3


@pytest.mark.parametrize(
    ("stop", "expect"),
    [
        ("x", {"stop": ["x"]}),
        ([5, 6], {"stop_token_ids": [5, 6]}),
        ([], {"ignore_eos": True}),
        (None, {}),
    ],
)
def test_stop_forms(stop: object, expect: dict[str, object]) -> None:
    sampling_session = make_sampling_session("sess", 0, "m", None, "/a", {})
    doc = orjson.loads(parse_sample(sample_body(sampling_params={"stop": stop}), sampling_session).body)
    assert {k: doc[k] for k in ("stop", "stop_token_ids", "ignore_eos") if k in doc} == expect


def test_prompt_logprobs_and_rejections() -> None:
    sampling_session = make_sampling_session("sess", 0, "m", None, "/a", {})
    job = parse_sample(sample_body(prompt_logprobs=True, prompt_logprobs_last_n=1), sampling_session)
    assert orjson.loads(job.body)["prompt_logprobs"] == 1
    assert job.prompt_logprobs_last_n == 1
    for bad in (
        {"topk_prompt_logprobs": 2},
        {"num_samples": 0},
        {"prompt": {"chunks": [{"type": "image", "data": "x"}]}},
        {"sampling_params": {"max_tokens": "many"}},
        {"sampling_params": {"stop": ["a", 1]}},
    ):
        with pytest.raises(BadRequest):
            parse_sample(sample_body(**bad), sampling_session)


def test_model_path_resolution() -> None:
    assert adapter_for_path("tinker://run1/sampler_weights/step5", "/root", {}) == (
        "run1_step5",
        os.path.join("/root", "run1", "step5"),
    )
    assert adapter_for_path("tinker://mylora", "/root", {"mylora": "/p"}) == ("mylora", None)
    assert adapter_for_path("mylora", "/root", {"mylora": "/p"}) == ("mylora", None)
    for bad in ("tinker://run/weights/x", "tinker://../sampler_weights/x", "other"):
        with pytest.raises(BadRequest):
            adapter_for_path(bad, "/root", {})


def test_sampler_ids_are_stable_and_self_describing() -> None:
    a = make_sampling_session("sess", 2, None, "tinker://r/sampler_weights/w", "/root", {})
    b = make_sampling_session("sess", 2, None, "tinker://r/sampler_weights/w", "/root", {})
    assert a == b and a.model == "r_w" and a.base_model == "r_w"
    assert sampling_session_from_id(a.sampler_id, "/root", {}) == a
    assert sampling_session_from_id("s-garbage!", "/root", {}) is None
    assert sampling_session_from_id("other", "/root", {}) is None
    with pytest.raises(BadRequest):
        make_sampling_session("sess", 0, None, None, "/root", {})


def test_a_relative_adapter_root_says_what_to_set() -> None:
    # The engines resolve lora_path on their side: "./adapters" means nothing there.
    with pytest.raises(BadRequest, match="set adapter_root .* to an absolute directory") as info:
        adapter_for_path("tinker://run1/sampler_weights/step5", "./adapters", {})
    assert info.value.status == 400
    assert adapter_for_path("tinker://run1", "./adapters", {"run1": "/w"}) == ("run1", None)
