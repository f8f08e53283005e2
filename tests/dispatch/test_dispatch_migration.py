"""Generations whose engine dies mid-answer go on on another engine from the tokens
they had (docs/operations.md, "Migration")."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import trio
import trio.testing
from dispatch_testing import COMPLETION, body, client_for, completions

from trioforward.errors import UpstreamBroken
from trioforward.sim import SimEngine, expected_completion, open_engine, render_text

MODEL = "sim-base"
BUDGET = 10
SEED = 5


def prompt_of(i: int) -> list[int]:
    return [7, 11, 100 + i]  # one prompt per generation: the engine's record tells them apart


def events_of(data: bytes) -> list[dict[str, Any]]:
    assert data.endswith(b"data: [DONE]\n\n") and data.count(b"[DONE]") == 1
    parts = [e for e in data.split(b"\n\n") if e]
    return [orjson.loads(e[6:]) for e in parts[:-1]]


def expected(prompt: list[int], survivor: SimEngine) -> tuple[list[int], int]:
    """The tokens one generation must end with, and how many the dead engine made:
    its first ``k`` tokens, then what the survivor samples for prompt + those ``k``
    (it was prompted with exactly that once)."""
    [seen] = [p for p in survivor.stats.prompts if p[: len(prompt)] == prompt]
    k = len(seen) - len(prompt)
    head = expected_completion(MODEL, prompt, SEED, 0, BUDGET)[0]
    assert seen == prompt + head[:k]
    tail = expected_completion(MODEL, seen, SEED, 0, BUDGET - k)[0]
    return head[:k] + tail, k


async def run_on_dying_engine(
    client: Any, dying: SimEngine, survivor: SimEngine, count: int
) -> tuple[dict[int, bytes], dict[int, Any], dict[int, BaseException]]:
    """``count`` streamed and ``count`` whole generations on ``dying`` (the only
    engine when they start); ``survivor`` joins, then ``dying`` dies mid-decode."""
    streamed: dict[int, bytes] = {}
    whole: dict[int, Any] = {}
    failed: dict[int, BaseException] = {}

    async def stream(i: int) -> None:
        payload = body(prompt=prompt_of(i), max_tokens=BUDGET, seed=SEED, stream=True)
        payload["stream_options"] = {"include_usage": True}
        chunks = []
        try:
            async with client.stream(COMPLETION, json=payload) as fs:
                async for chunk in fs.aiter_bytes():
                    chunks.append(chunk)
        except UpstreamBroken as exc:
            failed[i] = exc
        streamed[i] = b"".join(chunks)

    async def answer(i: int) -> None:
        payload = body(prompt=prompt_of(i), max_tokens=BUDGET, seed=SEED)
        try:
            whole[i] = await client.post(COMPLETION, json=payload)
        except UpstreamBroken as exc:
            failed[i] = exc

    async with trio.open_nursery() as nursery:
        for i in range(count):
            nursery.start_soon(stream, i)
            nursery.start_soon(answer, count + i)
        await dying.stats.wait_for(lambda s: s.running == 2 * count)
        client.engines.add(survivor.url)
        await trio.sleep(0.45)  # about 4 tokens each
        await dying.stop_listening()  # the engine dies: every connection with it
    return streamed, whole, failed


COUNT = 64


async def test_an_engine_that_dies_mid_decode_loses_no_generation(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_engine(decode_ms_per_token=100, capacity=0) as dying,
        open_engine(decode_ms_per_token=100, capacity=0) as survivor,
        client_for(dying, assemble_answers=True, max_migrations=2) as client,
    ):
        await client.resume(weight_version="v1")
        survivor.rl.weight_version = "v1"  # it runs v1: taken in once it reports so
        streamed, whole, failed = await run_on_dying_engine(client, dying, survivor, COUNT)
        assert failed == {}
        delivered = 0
        for i, data in streamed.items():
            *deltas, usage = events_of(data)
            tokens, k = expected(prompt_of(i), survivor)
            assert 0 < k < BUDGET
            got = [t for e in deltas for c in e["choices"] for t in c["token_ids"] or ()]
            text = "".join(c["text"] for e in deltas for c in e["choices"])
            # The gateway asked for the ids itself: the caller gets none, and its text
            # is every token once, in order (none lost, none repeated at the seam).
            assert got == [] and text == render_text(tokens)
            last = deltas[-1]["choices"][0]
            assert last["finish_reason"] == "length"
            assert last["weight_versions"] == [{"version": "v1", "start": 0, "end": BUDGET}]
            assert usage["usage"]["completion_tokens"] == BUDGET
            delivered += BUDGET
        for i, reply in whole.items():
            assert reply.status == 200
            [choice] = reply.json()["choices"]
            tokens, k = expected(prompt_of(i), survivor)
            assert 0 < k < BUDGET
            assert choice["text"] == render_text(tokens)
            assert choice["finish_reason"] == "length" and choice["token_ids"] is None
            assert choice["weight_versions"] == [{"version": "v1", "start": 0, "end": BUDGET}]
            assert reply.attempts == 2
            assert reply.json()["usage"]["prompt_tokens"] == len(prompt_of(i))
            assert reply.json()["usage"]["completion_tokens"] == BUDGET
            delivered += BUDGET
        # Engine side: each generation reached the dead engine once and the survivor
        # once (its continuation), and decoding cost at most 5 % over what was delivered.
        assert dying.stats.by_path[COMPLETION] == 2 * COUNT
        assert survivor.stats.by_path[COMPLETION] == 2 * COUNT
        decoded = dying.stats.tokens_decoded + survivor.stats.tokens_decoded
        assert delivered == 2 * COUNT * BUDGET
        assert decoded <= 1.05 * delivered, (decoded, delivered)
        assert client.statistics().migrations == {(COMPLETION, "broken"): 2 * COUNT}


async def test_max_migrations_zero_keeps_the_502(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    count = 4
    async with (
        open_engine(decode_ms_per_token=100, capacity=0) as dying,
        open_engine(decode_ms_per_token=100, capacity=0) as survivor,
        client_for(dying, assemble_answers=True, max_migrations=0) as client,
    ):
        streamed, whole, failed = await run_on_dying_engine(client, dying, survivor, count)
        assert whole == {} and sorted(failed) == list(range(2 * count))
        assert all(e.code == "upstream_broken" and e.engine == dying.url for e in failed.values())
        assert survivor.stats.by_path[COMPLETION] == 0
        assert client.statistics().migrations == {}


@pytest.mark.parametrize("assemble", [False, True])
async def test_a_generation_that_had_no_token_is_not_sent_again(
    fd_baseline: int, autojump_clock: trio.testing.MockClock, assemble: bool
) -> None:
    """The engine dies in prefill: nothing proves it never ran the requests, and
    there is no token to go on from: 502 as before, the survivor never asked."""
    async with (
        open_engine(prefill_ms_per_token=1000, decode_ms_per_token=100) as dying,
        open_engine() as survivor,
        client_for(dying, assemble_answers=assemble) as client,
    ):
        errors: list[BaseException] = []

        async def one(stream: bool) -> None:
            payload = body(prompt=prompt_of(0), max_tokens=BUDGET, stream=stream)
            try:
                if stream:
                    async with client.stream(COMPLETION, json=payload) as fs:
                        await fs.aread()
                else:
                    await client.post(COMPLETION, json=payload)
            except UpstreamBroken as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, True)
            nursery.start_soon(one, False)
            await dying.stats.wait_for(lambda s: s.by_path[COMPLETION] == 2)
            client.engines.add(survivor.url)
            await trio.sleep(1)  # in prefill
            await dying.stop_listening()
        assert len(errors) == 2
        assert survivor.stats.by_path[COMPLETION] == 0
        assert client.statistics().migrations == {}


@pytest.mark.parametrize("route", ["post", "complete"])
async def test_an_abort_the_engine_made_on_its_own_migrates(
    fd_baseline: int, autojump_clock: trio.testing.MockClock, route: str
) -> None:
    """Someone aborts the engine's requests behind the gateway's back (the engine's
    own ``/abort_requests``): the answer goes on on the other engine, whole."""
    async with (
        open_engine(decode_ms_per_token=100) as aborting,
        open_engine(decode_ms_per_token=100) as survivor,
        client_for(aborting) as client,
    ):
        prompt = prompt_of(0)
        got: list[Any] = []

        async def run() -> None:
            if route == "post":
                payload = body(prompt=prompt, max_tokens=BUDGET, seed=SEED)
                [choice] = (await client.post(COMPLETION, json=payload)).json()["choices"]
                got.append(choice["text"])
            else:
                done = await client.complete(model=MODEL, prompt=prompt, max_tokens=BUDGET, seed=SEED)
                got.append(render_text(done.choices[0].tokens.tolist()))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await aborting.stats.wait_for(lambda s: s.running == 1)
            client.engines.add(survivor.url)
            await trio.sleep(0.45)
            async with httpx.AsyncClient() as http:
                answer = await http.post(aborting.url + "/abort_requests", json={})
                assert answer.json()["aborted"] == 1
        tokens, k = expected(prompt, survivor)
        assert 0 < k < BUDGET and got == [render_text(tokens)]
        assert survivor.stats.by_path[COMPLETION] == 1
        assert client.statistics().migrations == {(COMPLETION, "engine_abort"): 1}


async def test_a_stream_on_an_engine_health_ejects_migrates(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    """The engine stops answering its health probes (a restart behind the same
    address, a hang) while its stream's connection stays open: the ejection cuts
    the stream, and it goes on on the other engine."""
    async with (
        open_engine(decode_ms_per_token=400) as failing,
        open_engine(decode_ms_per_token=100) as survivor,
        client_for(failing, health_interval=1.0, health_failures=1) as client,
    ):
        prompt = prompt_of(0)
        chunks: list[bytes] = []
        payload = body(prompt=prompt, max_tokens=BUDGET, seed=SEED, stream=True)

        async def read() -> None:
            async with client.stream(COMPLETION, json=payload) as fs:
                async for chunk in fs.aiter_bytes():
                    chunks.append(chunk)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await failing.stats.wait_for(lambda s: s.running == 1)
            client.engines.add(survivor.url)
            await trio.sleep(0.5)
            failing.faults.health_status = 503  # ejected at its next probe
        text = "".join(c["text"] for e in events_of(b"".join(chunks)) for c in e["choices"])
        tokens, k = expected(prompt, survivor)
        assert 0 < k < BUDGET and text == render_text(tokens)
        assert completions(failing) == 1 and completions(survivor) == 1
        assert client.statistics().migrations == {(COMPLETION, "broken"): 1}
