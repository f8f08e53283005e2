"""Agent sessions in fleet mode (docs/sessions.md, "Fleet mode"): the session lives
in the state store, so any member serves any turn and a member that leaves, or
is killed, loses no session."""

from __future__ import annotations

import signal
from contextlib import AsyncExitStack
from typing import Any

import httpx
import trio
from fleet_testing import open_members, until_members
from gateway_harness import open_sim, reap, start_serve


def _turn(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "sim-base", "messages": messages, "max_tokens": 5, "return_token_ids": True}


async def test_turns_on_different_members_extend_one_session_that_outlives_a_member(
    valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    head = {"X-Session-Id": "fleet-episode"}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    async with open_sim() as engine, AsyncExitStack() as stack:
        (b,) = await open_members(engine.url, valkey, fleet_name, stack, 1)
        async with AsyncExitStack() as a_stack:
            (a,) = await open_members(engine.url, valkey, fleet_name, a_stack, 1)
            with trio.fail_after(30):
                await until_members([a, b], 2)
            async with httpx.AsyncClient(base_url=a.url) as ca:
                one = (
                    await ca.post("/v1/chat/completions", json=_turn(messages), headers=head)
                ).json()
                messages += [one["choices"][0]["message"], {"role": "user", "content": "on"}]
                # Turn 2 on the other member extends turn 1 (served by the first).
                async with httpx.AsyncClient(base_url=b.url) as cb:
                    two = (
                        await cb.post("/v1/chat/completions", json=_turn(messages), headers=head)
                    ).json()
                rewarded = await ca.post("/v1/sessions/fleet-episode/reward", json={"reward": 1.0})
        # Member a has left the fleet (its process gone): the session is intact on b.
        messages += [two["choices"][0]["message"], {"role": "tool", "content": "ok"}]
        async with httpx.AsyncClient(base_url=b.url) as cb:
            three = (
                await cb.post("/v1/chat/completions", json=_turn(messages), headers=head)
            ).json()
            trajectory = (await cb.get("/v1/sessions/fleet-episode")).json()
            export = await cb.get("/v1/sessions")
            ended = await cb.delete("/v1/sessions/fleet-episode")
            gone = await cb.get("/v1/sessions/fleet-episode")
    p1, t1 = one["prompt_token_ids"], one["choices"][0]["token_ids"]
    p2, t2 = two["prompt_token_ids"], two["choices"][0]["token_ids"]
    assert two["session"] == {"id": "fleet-episode", "turn": 1, "branch": False}
    assert p2[: len(p1) + len(t1)] == p1 + t1
    assert (
        three["session"]["turn"] == 2 and three["prompt_token_ids"][: len(p2) + len(t2)] == p2 + t2
    )
    assert list(engine.stats.prompts) == [p1, p2, three["prompt_token_ids"]]  # the engine's side
    assert [t["token_ids"] for t in trajectory["turns"]] == [
        t1,
        t2,
        three["choices"][0]["token_ids"],
    ]
    assert rewarded.status_code == 200 and trajectory["rewards"] == {"reward": 1.0}
    assert [line.count(b'"id":"fleet-episode"') for line in export.content.splitlines()] == [1]
    assert ended.status_code == 200 and gone.status_code == 404


async def test_session_turns_answer_503_while_the_state_store_is_down(
    valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    head = {"X-Session-Id": "outage"}
    async with open_sim() as engine, AsyncExitStack() as stack:
        (a,) = await open_members(engine.url, valkey, fleet_name, stack, 1)
        async with httpx.AsyncClient(base_url=a.url, timeout=30) as ca:
            first = await ca.post(
                "/v1/chat/completions", json=_turn([{"role": "user", "content": "x"}]), headers=head
            )
            valkey.stop()
            down = await ca.post(
                "/v1/chat/completions", json=_turn([{"role": "user", "content": "y"}]), headers=head
            )
            read = await ca.get("/v1/sessions/outage")
            valkey.start()
    assert first.status_code == 200
    for reply in (down, read):
        assert reply.status_code == 503 and reply.json()["error"]["code"] == "state_unavailable"
    assert engine.stats.by_path["/v1/completions"] == 1  # nothing generated that could not be kept


async def test_a_member_killed_between_turns_loses_no_session(
    valkey: Any, fleet_name: str, fd_baseline: int
) -> None:
    head = {"X-Session-Id": "killed"}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    procs: list[trio.Process] = []
    async with open_sim() as engine:
        try:
            urls = []
            for _ in range(2):
                proc, url, _ = await start_serve(
                    engine.url, "--state-url", valkey.url, "--fleet-name", fleet_name
                )
                procs.append(proc)
                urls.append(url)
            async with httpx.AsyncClient(base_url=urls[0], timeout=30) as ca:
                one = (
                    await ca.post("/v1/chat/completions", json=_turn(messages), headers=head)
                ).json()
            procs[0].kill()  # SIGKILL: no drain, no goodbye to the fleet
            assert await procs[0].wait() == -signal.SIGKILL
            messages += [one["choices"][0]["message"], {"role": "user", "content": "on"}]
            async with httpx.AsyncClient(base_url=urls[1], timeout=30) as cb:
                two = (
                    await cb.post("/v1/chat/completions", json=_turn(messages), headers=head)
                ).json()
                # A streamed turn holds the session in the store the same way.
                messages += [two["choices"][0]["message"], {"role": "user", "content": "end"}]
                streamed = {**_turn(messages), "stream": True}
                async with cb.stream(
                    "POST", "/v1/chat/completions", json=streamed, headers=head
                ) as reply:
                    body = b"".join([chunk async for chunk in reply.aiter_bytes()])
                trajectory = (await cb.get("/v1/sessions/killed")).json()
        finally:
            for proc in procs:
                await reap(proc)
    p1, t1 = one["prompt_token_ids"], one["choices"][0]["token_ids"]
    assert two["session"] == {"id": "killed", "turn": 1, "branch": False}
    assert two["prompt_token_ids"][: len(p1) + len(t1)] == p1 + t1
    p2, t2 = two["prompt_token_ids"], two["choices"][0]["token_ids"]
    assert body.rstrip().endswith(b"data: [DONE]")
    p3 = list(engine.stats.prompts)[2]
    assert list(engine.stats.prompts) == [p1, p2, p3] and p3[: len(p2) + len(t2)] == p2 + t2
    assert [t["token_ids"] for t in trajectory["turns"]] == [t1, t2, engine.stats.sampled[2][0]]
    assert trajectory["branch_points"] == []
