"""The simulated model is deterministic and predictable (no sockets)."""

from __future__ import annotations

import numpy as np

from trioforward.sim import (
    VOCAB_SIZE,
    expected_completion,
    expected_prompt_logprobs,
    expected_tokens,
    render_text,
    sample,
    tokenize,
)


def test_same_inputs_same_outputs_and_each_input_matters() -> None:
    base = expected_completion("sim-base", [1, 2, 3], 7, 0, 32)
    assert base == expected_completion("sim-base", [1, 2, 3], 7, 0, 32)
    for other in (
        expected_completion("sim-base-2", [1, 2, 3], 7, 0, 32),
        expected_completion("sim-base", [1, 2, 4], 7, 0, 32),
        expected_completion("sim-base", [1, 2, 3], 8, 0, 32),
        expected_completion("sim-base", [1, 2, 3], None, 0, 32),
        expected_completion("sim-base", [1, 2, 3], 7, 1, 32),
    ):
        assert other[0] != base[0]


def test_tokens_in_vocabulary_logprobs_nonpositive_and_float32_exact() -> None:
    tokens, logprobs, finish = expected_completion("sim-base", list(range(100)), 0, 0, 500)
    assert finish == "length" and len(tokens) == len(logprobs) == 500
    assert all(0 <= t < VOCAB_SIZE for t in tokens)
    assert all(-4.0 < lp <= 0.0 for lp in logprobs)
    assert np.array_equal(
        np.asarray(logprobs, dtype=np.float32).astype(np.float64), np.asarray(logprobs)
    )


def test_shorter_max_tokens_is_a_prefix() -> None:
    long = expected_tokens("sim-base", [5, 6], 1, 0, 20)
    assert expected_tokens("sim-base", [5, 6], 1, 0, 5) == long[:5]


def test_string_prompt_is_its_utf8_bytes() -> None:
    assert tokenize("hé") == [104, 195, 169]
    assert expected_completion("sim-base", "hé", 0, 0, 4) == expected_completion(
        "sim-base", [104, 195, 169], 0, 0, 4
    )


def test_stop_token_ids_end_generation_with_the_token_kept() -> None:
    full = expected_tokens("sim-base", [9], 0, 0, 10)
    tokens, logprobs, finish = expected_completion(
        "sim-base", [9], 0, 0, 10, stop_token_ids=[full[3]]
    )
    assert tokens == full[:4] and len(logprobs) == 4 and finish == "stop"
    s = sample("sim-base", [9], 0, 0, 10, [full[3]])
    assert s.stop_reason == full[3] and s.text == render_text(full[:3])


def test_stop_string_cuts_the_text() -> None:
    full = expected_tokens("sim-base", [9], 0, 0, 10)
    s = sample("sim-base", [9], 0, 0, 10, stop=[f" t{full[2]}"])
    assert s.finish_reason == "stop" and s.stop_reason == f" t{full[2]}"
    assert s.tokens == full[:3] and s.text == render_text(full[:2])


def test_prompt_logprobs_shape_and_ranks() -> None:
    prompt = [11, 22, 33, 44]
    plp = expected_prompt_logprobs("sim-base", prompt, 3)
    assert plp[0] is None and len(plp) == len(prompt)
    for token, entry in zip(prompt[1:], plp[1:], strict=True):
        assert entry is not None
        own = entry[str(token)]
        assert own["decoded_token"] == f" t{token}" and 1 <= int(own["rank"]) <= 4
        by_rank = sorted(entry.values(), key=lambda e: int(e["rank"]))
        lps = [float(e["logprob"]) for e in by_rank]
        assert lps == sorted(lps, reverse=True) and all(lp <= 0 for lp in lps)
    assert expected_prompt_logprobs("sim-base", [], 0) == []
