"""codec.decode_completion: engine bodies to numpy arrays."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from trioforward.codec import CodecError, decode_completion


def test_decode_full_body() -> None:
    doc = {
        "id": "cmpl-1",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "text": " a b",
                "token_ids": [10, 11],
                "prompt_token_ids": [1, 2, 3],
                "logprobs": {"tokens": [" a", " b"], "token_logprobs": [-0.5, None]},
                "finish_reason": "length",
                "stop_reason": None,
                "prompt_logprobs": [
                    None,
                    {"2": {"logprob": -1.0, "rank": 1}},
                    {"9": {"logprob": -7.0}, "3": {"logprob": -2.0}},
                ],
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    c = decode_completion(orjson.dumps(doc))
    choice = c.choices[0]
    assert choice.tokens.dtype == np.int32 and choice.tokens.tolist() == [10, 11]
    assert choice.logprobs is not None and choice.logprobs.dtype == np.float32
    assert choice.logprobs[0] == -0.5 and np.isnan(choice.logprobs[1])
    assert c.prompt_logprobs is not None and c.prompt_logprobs.dtype == np.float32
    assert np.isnan(c.prompt_logprobs[0]) and c.prompt_logprobs[1:].tolist() == [-1.0, -2.0]
    assert c.usage["total_tokens"] == 5 and c.id == "cmpl-1"


def test_decode_minimal_body() -> None:
    c = decode_completion(b'{"choices": [{"text": "x", "finish_reason": "stop"}]}')
    assert c.choices[0].tokens.shape == (0,) and c.choices[0].logprobs is None
    assert c.prompt_logprobs is None


@pytest.mark.parametrize("raw", [b"not json", b"[]", b'{"choices": 3}'])
def test_decode_rejects_non_completions(raw: bytes) -> None:
    with pytest.raises(CodecError):
        decode_completion(raw)


def test_required_token_ids_missing_is_an_error_not_an_empty_sample() -> None:
    # An engine that ignores return_token_ids answers text only: with the ids
    # required, that is an error; an empty list (an empty sequence) is not.
    text_only = b'{"choices": [{"text": "x", "finish_reason": "stop"}]}'
    null_ids = b'{"choices": [{"text": "x", "token_ids": null, "finish_reason": "stop"}]}'
    for raw in (text_only, null_ids):
        with pytest.raises(CodecError, match="without 'token_ids'"):
            decode_completion(raw, require_token_ids=True)
    empty = decode_completion(
        b'{"choices": [{"text": "", "token_ids": [], "finish_reason": "length"}]}',
        require_token_ids=True,
    )
    assert empty.choices[0].tokens.shape == (0,)
