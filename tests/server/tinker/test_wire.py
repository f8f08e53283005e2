"""The SampleResponse encoder, judged by the SDK's own decoder (tinker/proto/response_conv.py)."""

from __future__ import annotations

import math

import numpy as np
import orjson
from tinker.proto.response_conv import deserialize_sample_response

from trioforward.server.tinker._wire import (
    LENGTH,
    STOP,
    TRY_AGAIN,
    encode_error,
    encode_sample_response,
)


def test_sequences_round_trip_through_the_sdk_decoder() -> None:
    tokens = np.array([5, 70000, 2**31 - 1], dtype=np.int64)
    logprobs = np.array([-0.5, -1.25, -3.0], dtype=np.float64)
    data = encode_sample_response(
        [(tokens, logprobs, STOP), (np.array([9], dtype=np.int32), None, LENGTH)]
    )
    response = deserialize_sample_response(data)
    assert [s.tokens for s in response.sequences] == [[5, 70000, 2**31 - 1], [9]]
    assert response.sequences[0].logprobs == [-0.5, -1.25, -3.0]
    assert response.sequences[1].logprobs is None
    assert [s.stop_reason for s in response.sequences] == ["stop", "length"]
    assert response.prompt_logprobs is None


def test_prompt_logprobs_nan_becomes_none() -> None:
    data = encode_sample_response(
        [(np.array([1]), np.array([-0.1]), STOP)],
        prompt_logprobs=np.array([np.nan, -2.0, -0.75], dtype=np.float32),
        prompt_cache_hit_tokens=2,
    )
    response = deserialize_sample_response(data)
    assert response.prompt_logprobs == [None, -2.0, -0.75]
    assert response.prompt_cache_hit_tokens == 2


def test_empty_sequence_is_valid() -> None:
    response = deserialize_sample_response(
        encode_sample_response(
            [(np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32), LENGTH)]
        )
    )
    assert response.sequences[0].tokens == []
    assert response.sequences[0].stop_reason == "length"


def test_field_numbers_match_the_sdk_schema() -> None:
    from tinker.proto import tinker_public_pb2 as pb

    data = encode_sample_response(
        [(np.array([3, 4]), np.array([-1.0, -2.0]), LENGTH)], np.array([math.nan, -1.0])
    )
    msg = pb.SampleResponse()
    msg.ParseFromString(data)
    assert msg.sequences[0].stop_reason == pb.STOP_REASON_LENGTH
    assert np.frombuffer(msg.sequences[0].tokens, "<i4").tolist() == [3, 4]
    assert msg.HasField("prompt_logprobs")
    assert not msg.HasField("topk_prompt_logprobs")


def test_error_and_try_again_bodies() -> None:
    assert orjson.loads(encode_error("boom", "user")) == {"error": "boom", "category": "user"}
    assert orjson.loads(TRY_AGAIN)["type"] == "try_again"
