"""replay="continue": an aborted completion resumes from its tokens so far (docs/operations.md)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from dispatch_testing import COMPLETION, body, client_for

from trioforward.dispatch import ForwardResponse
from trioforward.errors import ContinuationLimit, DispatchAborted, TenantQueueFull
from trioforward.sim import expected_completion, open_engine

PROMPT = [1, 2, 3]
MODEL = "sim-base"


def gen(max_tokens: int | None = 10, **extra: Any) -> dict[str, Any]:
    out = body(prompt=PROMPT, max_tokens=max_tokens or 0, seed=3, logprobs=1, **extra)
    if max_tokens is None:
        del out["max_tokens"]
    return out


def continued(prompt: list[int], first: int, total: int, index: int = 0) -> tuple[list[int], list[float]]:
    """What the sim answers a generation aborted after ``first`` tokens and continued
    once: its first ``first`` tokens, then a fresh sequence for prompt + those."""
    head, head_lp, _ = expected_completion(MODEL, prompt, 3, index, total)
    tail, tail_lp, _ = expected_completion(MODEL, prompt + head[:first], 3, 0, total - first)
    return head[:first] + tail, head_lp[:first] + tail_lp


async def post_into(client: Any, out: list[ForwardResponse], payload: dict[str, Any]) -> None:
    out.append(await client.post(COMPLETION, json=payload))


async def update(client: Any, version: str, after: float = 0.0) -> None:
    """One abort weight update with continue, ``after`` seconds from now."""
    await trio.sleep(after)
    await client.pause(engine_mode="abort", replay="continue")
    await trio.sleep(30)  # the weights are pushed
    await client.resume(weight_version=version)


async def test_abort_update_with_continue_gives_whole_answers_split_by_version(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        await client.resume(weight_version="v1")
        results: list[ForwardResponse] = []
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(post_into, client, results, gen(return_token_ids=True))
            await engine.stats.wait_for(lambda s: s.running == 4)
            await trio.sleep(0.45)  # four tokens decoded each
            await update(client, "v2")
        assert [r.status for r in results] == [200] * 4
        tokens, logprobs = continued(PROMPT, 4, 10)
        for r in results:
            doc = r.json()
            [choice] = doc["choices"]
            assert choice["finish_reason"] == "length" and choice["token_ids"] == tokens
            assert choice["logprobs"]["token_logprobs"] == logprobs
            assert len(choice["logprobs"]["tokens"]) == 10
            assert choice["weight_versions"] == [
                {"version": "v1", "start": 0, "end": 4},
                {"version": "v2", "start": 4, "end": 10},
            ]
            assert doc["usage"]["prompt_tokens"] == 3 and doc["usage"]["completion_tokens"] == 10
            assert r.weight_version == "v1, v2" and r.attempts == 2
        # Each generation decoded once: the four aborted tokens were kept, not re-run.
        assert engine.stats.tokens_decoded == 4 * 10
        assert engine.stats.by_path[COMPLETION] == 8
        assert client.continued.answers == 4 and client.continued.tokens_kept == 16


async def test_two_updates_during_one_generation(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        await client.resume(weight_version="v1")
        results: list[ForwardResponse] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post_into, client, results, gen(20, return_token_ids=True))
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.35)  # 3 tokens under v1
            await update(client, "v2")
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.55)  # 5 more under v2
            await update(client, "v3")
        [choice] = results[0].json()["choices"]
        assert len(choice["token_ids"]) == 20 and choice["finish_reason"] == "length"
        assert choice["weight_versions"] == [
            {"version": "v1", "start": 0, "end": 3},
            {"version": "v2", "start": 3, "end": 8},
            {"version": "v3", "start": 8, "end": 20},
        ]
        assert engine.stats.tokens_decoded == 20 and results[0].attempts == 3


async def test_a_request_aborted_before_any_token_goes_again_whole(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100, capacity=1) as engine,
        client_for(engine) as client,
    ):
        await client.resume(weight_version="v1")
        results: list[ForwardResponse] = []
        async with trio.open_nursery() as nursery:
            for _ in range(2):  # the second waits in the engine's own queue
                nursery.start_soon(post_into, client, results, gen(return_token_ids=True))
            await engine.stats.wait_for(lambda s: s.running == 1 and s.queued == 1)
            await trio.sleep(0.45)
            await update(client, "v2")
        spans = sorted(
            tuple(s["version"] for s in r.json()["choices"][0]["weight_versions"]) for r in results
        )
        assert spans == [("v1", "v2"), ("v2",)]  # continued; whole on the new weights
        whole = next(r for r in results if len(r.json()["choices"][0]["weight_versions"]) == 1)
        expected, _, _ = expected_completion(MODEL, PROMPT, 3, 0, 10)
        assert whole.json()["choices"][0]["token_ids"] == expected
        assert engine.stats.tokens_decoded == 2 * 10


async def test_n4_each_choice_continues_on_its_own(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        await client.resume(weight_version="v1")
        results: list[ForwardResponse] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post_into, client, results, gen(n=4, return_token_ids=True))
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.45)
            await update(client, "v2")
        doc = results[0].json()
        assert [c["index"] for c in doc["choices"]] == [0, 1, 2, 3]
        for c in doc["choices"]:
            tokens, logprobs = continued(PROMPT, 4, 10, c["index"])
            assert c["token_ids"] == tokens and c["logprobs"]["token_logprobs"] == logprobs
            assert [s["end"] for s in c["weight_versions"]] == [4, 10]
        assert doc["usage"]["completion_tokens"] == 40
        assert engine.stats.tokens_decoded == 40 and engine.stats.by_path[COMPLETION] == 5


async def test_caller_without_max_tokens_keeps_the_first_attempts_budget(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        results: list[ForwardResponse] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post_into, client, results, gen(None))  # the engine's 16
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.45)
            await update(client, "v2")
        [choice] = results[0].json()["choices"]
        assert choice["token_ids"] is None  # the caller did not ask for them
        assert len(choice["logprobs"]["tokens"]) == 16 and choice["finish_reason"] == "length"
        assert [s["end"] for s in choice["weight_versions"]] == [4, 16]
        assert engine.stats.tokens_decoded == 16


async def test_caller_without_return_token_ids_gets_its_shape(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        plain = await client.post(COMPLETION, json=gen())
        choice = plain.json()["choices"][0]
        assert choice["token_ids"] is None and choice["prompt_token_ids"] is None
        assert "weight_versions" not in choice  # passed through as the engine sent it


async def test_continuation_over_the_model_length_ends_with_length(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    # Prompt 3 + 10 tokens fit a 12-token model only as 3 + 9 (vLLM cuts); prompt +
    # the 4 tokens so far still fit, but make the engine refuse by shrinking it.
    async with (
        open_engine(decode_ms_per_token=100, max_model_len=13) as engine,
        client_for(engine) as client,
    ):
        await client.resume(weight_version="v1")
        results: list[ForwardResponse] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post_into, client, results, gen(return_token_ids=True))
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.45)
            await client.pause(engine_mode="abort", replay="continue")
            engine.max_model_len = engine.adapters.max_model_len = 5  # 3 + 4 no longer fits
            await client.resume(weight_version="v2")
        assert results[0].status == 200
        [choice] = results[0].json()["choices"]
        expected, _, _ = expected_completion(MODEL, PROMPT, 3, 0, 10)
        assert choice["token_ids"] == expected[:4] and choice["finish_reason"] == "length"
        assert choice["weight_versions"] == [{"version": "v1", "start": 0, "end": 4}]


async def test_engine_abort_answers_without_token_ids_are_replayed_whole_logged_once(
    fd_baseline: int,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import trioforward.sim.routes._completions as sim_engine  # where the OpenAI routes parse

    parse = sim_engine.parse_generation

    def no_token_ids(*args: Any) -> Any:  # an engine that ignores return_token_ids
        out = parse(*args)
        out.return_token_ids = False
        return out

    monkeypatch.setattr(sim_engine, "parse_generation", no_token_ids)
    caplog.set_level(logging.WARNING, logger="trioforward.dispatch")
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        results: list[ForwardResponse] = []
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(post_into, client, results, gen())
            await engine.stats.wait_for(lambda s: s.running == 3)
            await trio.sleep(0.45)
            await update(client, "v2")
        for r in results:
            [choice] = r.json()["choices"]
            assert choice["finish_reason"] == "length" and len(choice["logprobs"]["tokens"]) == 10
        assert engine.stats.tokens_decoded == 3 * 4 + 3 * 10  # replayed whole
        assert engine.stats.by_path[COMPLETION] == 6
        warnings = [r for r in caplog.records if "without token_ids" in r.getMessage()]
        assert len(warnings) == 1


async def test_continue_beside_a_pause_that_ends_nothing_is_refused(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine() as engine,
        client_for(engine) as client,
    ):
        for mode in ("keep", "wait"):
            with pytest.raises(ValueError, match="'replay'"):
                await client.pause(engine_mode=mode, replay="continue")
        with pytest.raises(ValueError, match="'replay' must be"):
            await client.pause(engine_mode="abort", replay="again")
        assert not engine.rl.paused and engine.stats.pauses == {}


async def test_embedded_complete_carries_spans_and_token_versions(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        await client.resume(weight_version="v1")
        plain = await client.complete(model=MODEL, prompt=PROMPT, max_tokens=3)
        assert plain.choices[0].weight_versions == [{"version": "v1", "start": 0, "end": 3}]
        assert plain.choices[0].token_versions.tolist() == [0, 0, 0]
        out: list[Any] = []

        async def one() -> None:
            out.append(await client.complete(model=MODEL, prompt=PROMPT, max_tokens=10, seed=3))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.45)
            await update(client, "v2")
        choice = out[0].choices[0]
        tokens, logprobs = continued(PROMPT, 4, 10)
        assert choice.tokens.tolist() == tokens
        assert np.array_equal(choice.logprobs, np.array(logprobs, dtype=np.float32))
        assert choice.token_versions.dtype == np.int32
        assert choice.token_versions.tolist() == [0] * 4 + [1] * 6
        assert [s["version"] for s in choice.weight_versions] == ["v1", "v2"]
        from trioforward.sim import render_text

        assert choice.text == render_text(tokens) and out[0].attempts == 2


def sse(body: bytes) -> list[Any]:
    import orjson

    assert body.endswith(b"data: [DONE]\n\n")
    events = [e for e in body.split(b"\n\n") if e]
    assert all(e.startswith(b"data: ") for e in events)
    return [orjson.loads(e[6:]) for e in events[:-1]]


async def stream_into(client: Any, out: list[bytes], payload: dict[str, Any]) -> None:
    async with client.stream(COMPLETION, json={**payload, "stream": True}) as fs:
        assert fs.status == 200
        out.append(b"".join([chunk async for chunk in fs.aiter_bytes()]))


@pytest.mark.parametrize(("n", "fold"), [(1, False), (2, False), (2, True)])
async def test_a_stream_continued_across_the_update_is_one_valid_stream(
    fd_baseline: int,
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    n: int,
    fold: bool,
) -> None:
    from trioforward.dispatch.rollout import _continue_stream
    from trioforward.sim import render_text

    if fold:  # the relayed events are folded into token lists as they come
        monkeypatch.setattr(_continue_stream, "FOLD_BYTES", 300)

    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        await client.resume(weight_version="v1")
        bodies: list[bytes] = []
        payload = gen(n=n, stream_options={"include_usage": True})
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream_into, client, bodies, payload)
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.45)
            await update(client, "v2")
        events = sse(bodies[0])
        assert all(c["finish_reason"] != "abort" for e in events for c in e["choices"])
        assert len({e["id"] for e in events}) == 1
        *chunks, usage = events
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 10 * n
        for index in range(n):
            mine = [c for e in chunks for c in e["choices"] if c["index"] == index]
            tokens, logprobs = continued(PROMPT, 4, 10, index)
            assert all(c["token_ids"] is None for c in mine)  # the caller did not ask
            assert [lp for c in mine for lp in c["logprobs"]["token_logprobs"]] == logprobs
            assert "".join(c["text"] for c in mine) == render_text(tokens)
            offsets = [o for c in mine for o in c["logprobs"]["text_offset"]]
            assert offsets == sorted(offsets) and len(offsets) == 10
            assert mine[-1]["finish_reason"] == "length"
            assert mine[-1]["weight_versions"] == [
                {"version": "v1", "start": 0, "end": 4},
                {"version": "v2", "start": 4, "end": 10},
            ]
        assert engine.stats.tokens_decoded == 10 * n


@pytest.mark.parametrize(
    "engine_options",
    [{"kind": "sglang"}, {"kind": "vllm", "scale_out": True}],
    ids=["sglang-generate", "vllm-inference-generate"],
)
async def test_token_requests_continue_through_every_dialect(
    fd_baseline: int, autojump_clock: trio.testing.MockClock, engine_options: dict[str, Any]
) -> None:
    async with (
        open_engine(decode_ms_per_token=100, **engine_options) as engine,
        client_for(engine) as client,
    ):
        await client.resume(weight_version="v1")
        out: list[Any] = []

        async def one() -> None:
            out.append(await client.complete(model=MODEL, prompt=PROMPT, max_tokens=10, seed=3, n=2))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.45)
            await update(client, "v2")
        for choice in out[0].choices:
            assert len(choice.tokens) == 10 and choice.finish_reason == "length"
            assert choice.weight_versions == [
                {"version": "v1", "start": 0, "end": 4},
                {"version": "v2", "start": 4, "end": 10},
            ]
            assert choice.logprobs is not None and len(choice.logprobs) == 10
        assert engine.stats.tokens_decoded == 20 and client.continued.answers == 1


async def test_continuations_and_replays_are_the_same_request_for_max_outstanding(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    # The tenant may have one request outstanding: its continuations (one per
    # choice, four at once) and a whole replay are that request, never one more.
    tenants = {"default": {"max_outstanding": 1}}
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine, tenants=tenants) as client,
    ):
        await client.resume(weight_version="v1")
        results: list[ForwardResponse] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post_into, client, results, gen(n=4, return_token_ids=True))
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.45)
            await update(client, "v2")
        doc = results[0].json()
        assert [len(c["token_ids"]) for c in doc["choices"]] == [10] * 4
        assert engine.stats.by_path[COMPLETION] == 5  # the first attempt, four continuations
        assert client.statistics().tenants["default"].rejections == 0

        # Whole replay: aborted before its first token, it stays outstanding through
        # the pause (another request is refused meanwhile) and runs again unrefused.
        results.clear()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post_into, client, results, gen(return_token_ids=True))
            await engine.stats.wait_for(lambda s: s.running == 1)
            await client.pause(engine_mode="abort", replay="continue")
            with pytest.raises(TenantQueueFull):
                await client.post(COMPLETION, json=gen())
            await client.resume(weight_version="v3")
        [choice] = results[0].json()["choices"]
        assert [s["version"] for s in choice["weight_versions"]] == ["v3"] and len(choice["token_ids"]) == 10
        assert engine.stats.by_path[COMPLETION] == 7  # the aborted attempt and the replay
        stats = client.statistics().tenants["default"]
        assert stats.rejections == 1 and stats.outstanding == 0


async def test_past_max_continuations_the_503_names_the_continuation_limit(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    # Continued once (the limit), aborted again: the caller's 503 says so, with
    # phase "queued" (the refused continuation was never dispatched), not a
    # connect failure.
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine, max_continuations=1) as client,
    ):
        await client.resume(weight_version="v1")
        errors: list[BaseException] = []

        async def post() -> None:
            try:
                await client.post(COMPLETION, json=gen(return_token_ids=True))
            except DispatchAborted as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post)
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.25)
            await update(client, "v2")
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.25)
            await update(client, "v3")
        [exc] = errors
        assert isinstance(exc, ContinuationLimit) and exc.status == 503
        error = exc.to_json()["error"]
        assert error["code"] == "continuation_limit" and error["phase"] == "queued"
        assert error["type"] == "ContinuationLimit" and error["attempts"] == 2
        assert "max_continuations" in error["message"]
        assert engine.stats.by_path[COMPLETION] == 2 and engine.stats.pause_aborted == 2


async def test_tokens_decoded_before_any_version_was_recorded_are_labelled_default(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    # No version recorded before the update: the first segment's span says
    # "default" (as SGLang and vLLM's token route label the weights they started
    # with), on /v1/completions and in client.complete()'s Choice alike; the
    # header names the same two.
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine) as client,
    ):
        results: list[ForwardResponse] = []
        completions: list[Any] = []

        async def complete() -> None:
            completions.append(await client.complete(model=MODEL, prompt=PROMPT, max_tokens=10, seed=3))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post_into, client, results, gen(return_token_ids=True))
            nursery.start_soon(complete)
            await engine.stats.wait_for(lambda s: s.running == 2)
            await trio.sleep(0.45)  # four tokens decoded each
            await update(client, "v1")
        [r] = results
        assert r.weight_version == "default, v1"
        assert r.json()["choices"][0]["weight_versions"] == [
            {"version": "default", "start": 0, "end": 4},
            {"version": "v1", "start": 4, "end": 10},
        ]
        [done] = completions
        assert [s["version"] for s in done.choices[0].weight_versions] == ["default", "v1"]
