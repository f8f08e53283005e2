"""client.abort() in the embedded client: groups, queued requests, streams, no replay after a pause."""

from __future__ import annotations

from types import SimpleNamespace

import orjson
import pytest
import trio
import trio.testing
from dispatch_testing import body, client_for, completions

from trioforward.dispatch.attempts._request import Request
from trioforward.dispatch.rollout._abort import engine_names
from trioforward.sim import open_engine

LONG = 4000


async def running(engine: object, count: int) -> None:
    """Wait until the engine runs ``count`` requests (its counters' own waiter)."""
    with trio.fail_after(60):
        await engine.stats.wait_for(lambda s: s.running == count)  # type: ignore[attr-defined]


async def test_complete_in_a_group_is_aborted_with_its_tokens_and_queued_ones_never_dispatched(
    fd_baseline: int,
) -> None:
    results: dict[str, object] = {}
    async with open_engine(decode_ms_per_token=5) as engine, client_for(
        engine, engine_capacity=2, abort_grace=30.0
    ) as client:

        async def one(key: str) -> None:
            results[key] = await client.complete(
                model="sim-base", prompt=[1, 2], max_tokens=LONG, group="g", request_id=key
            )

        async with trio.open_nursery() as nursery:
            for key in ("run-0", "run-1"):
                nursery.start_soon(one, key)
            await running(engine, 2)
            nursery.start_soon(one, "wait-0")
            # No I/O before QUEUED: once every task is blocked, it waits for capacity.
            await trio.testing.wait_all_tasks_blocked()
            assert client.statistics().queued == 1
            counts = await client.abort(group="g")
        assert (counts.queued, counts.on_engine, counts.finished) == (1, 2, 0)
        for key in ("run-0", "run-1"):
            (choice,) = results[key].choices  # type: ignore[attr-defined]
            assert choice.finish_reason == "abort" and 0 <= len(choice.tokens) < LONG
        (choice,) = results["wait-0"].choices  # type: ignore[attr-defined]
        assert choice.finish_reason == "abort" and len(choice.tokens) == 0
        assert completions(engine) == 2  # the queued one never reached the engine
        assert engine.stats.pause_aborted == 2


async def test_an_aborted_request_is_not_replayed_by_a_weight_update(fd_baseline: int) -> None:
    async with open_engine(decode_ms_per_token=5) as engine, client_for(engine, abort_grace=30.0) as client:
        out: list[object] = []

        async def one() -> None:
            out.append(await client.post("/v1/completions", json=body(max_tokens=LONG), group="g"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            await running(engine, 1)
            await client.abort(group="g")
        (response,) = out
        assert response.status == 200 and b'"finish_reason":"abort"' in response.content  # type: ignore[attr-defined]
        # A replaying abort pause afterwards finds nothing to run again.
        await client.pause(engine_mode="abort", replay=True)
        await client.resume()
        assert completions(engine) == 1


async def test_abort_arguments_are_checked(fd_baseline: int) -> None:
    async with open_engine() as engine, client_for(engine) as client:
        with pytest.raises(ValueError):
            await client.abort()
        with pytest.raises(ValueError):
            await client.abort(all=True, group="g")
        with pytest.raises(ValueError):
            await client.abort(request_ids="one-id")  # type: ignore[arg-type]
        counts = await client.abort(group="nobody")
        assert counts.to_json() == {"queued": 0, "on_engine": 0, "finished": 0}


async def test_abort_on_sglang_names_the_rid_of_its_native_route(fd_baseline: int) -> None:
    # complete() on SGLang goes to /generate with the attempt's engine-side id as
    # rid; the abort asks /abort_request {"rid"} and SGLang answers with its partial
    # output (finish_reason type abort).
    results: list[object] = []
    async with open_engine(kind="sglang", decode_ms_per_token=5) as engine, client_for(
        engine, abort_grace=30.0
    ) as client:
        await client.engines.wait_kind(engine.url)

        async def one() -> None:
            results.append(await client.complete(model="sim-base", prompt=[1, 2], max_tokens=LONG, group="s"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            await running(engine, 1)
            counts = await client.abort(group="s")
        assert counts.on_engine == 1
        (completion,) = results
        (choice,) = completion.choices  # type: ignore[attr-defined]
        assert choice.finish_reason == "abort" and len(choice.tokens) < LONG
        assert engine.stats.by_path["/abort_request"] >= 1
        assert engine.stats.aborted == 0  # ended by its abort route, not a closed connection


async def test_abort_of_an_openai_route_request_on_sglang_names_its_body_rid(fd_baseline: int) -> None:
    # /v1/completions on SGLang ran as the body's rid (the attempt's engine-side id):
    # the abort asks /abort_request {"rid"} for it and SGLang's answer has the
    # tokens so far, finish_reason abort; no connection closed.
    out: list[object] = []
    async with open_engine(kind="sglang", decode_ms_per_token=5) as engine, client_for(
        engine, abort_grace=30.0
    ) as client:
        await client.engines.wait_kind(engine.url)

        async def one() -> None:
            out.append(await client.post("/v1/completions", json=body(max_tokens=LONG, return_token_ids=True), group="v"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            await running(engine, 1)
            counts = await client.abort(group="v")
        assert counts.on_engine == 1
        (response,) = out
        (choice,) = response.json()["choices"]  # type: ignore[attr-defined]
        assert response.status == 200  # type: ignore[attr-defined]
        assert choice["finish_reason"] == "abort" and len(choice["token_ids"]) < LONG
        assert engine.stats.by_path["/abort_request"] >= 1
        assert engine.stats.aborted == 0  # ended by its abort route, not a closed connection


async def test_aborts_at_once_ask_the_engine_its_control_kind_once(fd_baseline: int) -> None:
    # Eight groups aborted at the same moment (a round's stragglers, one call per
    # group): the engine's control kind is asked once (GET /is_paused), not by
    # every call that needed it before the first answer came back.
    out: list[object] = []
    async with open_engine(decode_ms_per_token=5) as engine, client_for(
        engine, abort_grace=30.0
    ) as client:

        async def one(g: int) -> None:
            out.append(await client.complete(model="sim-base", prompt=[1, g], max_tokens=LONG, group=f"k{g}"))

        async with trio.open_nursery() as nursery:
            for g in range(8):
                nursery.start_soon(one, g)
            await running(engine, 8)
            async with trio.open_nursery() as calls:
                for g in range(8):
                    calls.start_soon(lambda g=g: client.abort(group=f"k{g}"))
        assert engine.stats.by_path["/is_paused"] == 1
        assert engine.stats.by_path["/abort_requests"] == 8
        assert [c.choices[0].finish_reason for c in out] == ["abort"] * 8  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("kind", "path", "prompt", "names"),
    [
        ("sglang", "/v1/completions", [1, 2], ["E"]),
        ("sglang", "/v1/completions", [[1], [2], [3]], ["E", "E_0", "E_1", "E_2"]),
        ("sglang", "/v1/chat/completions", None, ["E"]),
        ("vllm", "/v1/completions", [[1], [2]], ["cmpl-E-0", "cmpl-E-1", "E", "generate-tokens-E"]),
        ("vllm", "/v1/chat/completions", None, ["chatcmpl-E", "E", "generate-tokens-E"]),
    ],
)
def test_engine_names_are_what_each_engine_ran_the_attempt_as(
    kind: str, path: str, prompt: object, names: list[str]
) -> None:
    # SGLang's /v1 routes ran it as the body's rid (a prompt list's items as
    # <rid>_<i>: its tokenizer aborts exact ids); vLLM as cmpl-<id>-<prompt>.
    content = orjson.dumps({"model": "m", "prompt": prompt} if prompt is not None else {"model": "m", "messages": []})
    req = Request("POST", path, [], content, "m", False, None, "r")
    req.engine = SimpleNamespace(kind=kind)  # type: ignore[assignment]
    req.engine_request_id = "E"
    assert engine_names(req) == names
