"""Every /v1/completions answer with the token ids the caller asked for carries its
weight_versions span, also without an update (docs/operations.md, "Weight versions")."""

from __future__ import annotations

from typing import Any

import orjson
import trio
import trio.testing
from dispatch_testing import COMPLETION, body, client_for

from trioforward.dispatch import ForwardResponse
from trioforward.dispatch.rollout._continue import with_span
from trioforward.sim import expected_completion, open_engine


async def test_an_answer_under_one_version_has_one_span_per_choice(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine) as client:
        ask = body(prompt=[1, 2, 3], max_tokens=5, seed=3, n=2, return_token_ids=True)
        before = await client.post(COMPLETION, json=ask)  # no version recorded yet
        assert all("weight_versions" not in c for c in before.json()["choices"])
        await client.resume(weight_version="v7")
        r = await client.post(COMPLETION, json=ask)
        for c in r.json()["choices"]:
            assert c["token_ids"] == expected_completion("sim-base", [1, 2, 3], 3, c["index"], 5)[0]
            assert c["weight_versions"] == [{"version": "v7", "start": 0, "end": 5}]
        assert b'"weight_versions"' not in before.content
        plain = await client.post(COMPLETION, json=body(prompt=[1, 2, 3], max_tokens=5))
        assert "weight_versions" not in plain.json()["choices"][0]  # ids not asked: as before


async def test_an_answer_a_keep_pause_spanned_names_both_in_the_header_only(
    fd_baseline: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_engine(decode_ms_per_token=100) as engine, client_for(engine) as client:
        await client.resume(weight_version="v1")
        out: list[ForwardResponse] = []

        async def one() -> None:
            out.append(
                await client.post(COMPLETION, json=body(max_tokens=10, return_token_ids=True))
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.45)
            await client.pause(engine_mode="keep")
            await trio.sleep(5)
            await client.resume(weight_version="v2")
        [r] = out
        assert r.weight_version == "v1, v2"
        assert "weight_versions" not in r.json()["choices"][0]  # where the update fell is unknown


def test_with_span_inserts_after_each_token_list_only() -> None:
    content = (
        b'{"choices":[{"index":0,"token_ids": [5, 6, 7],"prompt_token_ids":[1,2]},'
        b'{"index":1,"token_ids":[],"text":"\\"token_ids\\": [9]"}]}'
    )
    doc: dict[str, Any] = orjson.loads(with_span(content, "v3"))
    assert [c["weight_versions"] for c in doc["choices"]] == [
        [{"version": "v3", "start": 0, "end": 3}],
        [{"version": "v3", "start": 0, "end": 0}],
    ]
    assert doc["choices"][0]["prompt_token_ids"] == [1, 2]
    labelled = b'{"choices":[{"token_ids":[1],"weight_versions":[]}]}'
    assert with_span(labelled, "v3") == labelled
    nulls = b'{"choices":[{"token_ids":null}]}'
    assert with_span(nulls, "v3") == nulls


async def test_a_stream_under_one_version_labels_each_choices_last_event(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine) as client:
        ask = body(prompt=[1, 2, 3], max_tokens=5, seed=3, n=2, return_token_ids=True, stream=True)

        async def events() -> list[dict[str, Any]]:
            async with client.stream(COMPLETION, json=ask) as fs:
                data = await fs.aread()
            assert data.endswith(b"data: [DONE]\n\n")
            return [orjson.loads(e[6:]) for e in data.split(b"\n\n") if e and e != b"data: [DONE]"]

        before = await events()  # no version recorded yet
        assert all("weight_versions" not in c for e in before for c in e["choices"])
        await client.resume(weight_version="v7")
        chunks = [c for e in await events() for c in e["choices"]]
        for index in (0, 1):
            mine = [c for c in chunks if c["index"] == index]
            assert sum(len(c["token_ids"]) for c in mine) == 5
            assert mine[-1]["finish_reason"] == "length"
            assert mine[-1]["weight_versions"] == [{"version": "v7", "start": 0, "end": 5}]
            assert all("weight_versions" not in c for c in mine[:-1])
