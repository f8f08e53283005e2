"""Staleness-bounded admission: at most ``(i + η + 1) × step`` rollouts start, the rest
wait (never refused) and start as resumes land; stale running rollouts are handled."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing
from dispatch_testing import COMPLETION, body, client_for, completions

from trioforward.dispatch import ForwardResponse
from trioforward.sim import open_engine


class Done:
    """Answers so far, awaitable by count."""

    def __init__(self) -> None:
        self.answers: list[ForwardResponse] = []
        self._changed = trio.Event()

    def add(self, answer: ForwardResponse) -> None:
        self.answers.append(answer)
        self._changed.set()
        self._changed = trio.Event()

    def rollout(self, client: Any) -> Callable[[str], Awaitable[None]]:
        """A task that posts one short completion of ``group`` and adds its answer."""

        async def one(group: str) -> None:
            self.add(await client.post(COMPLETION, json=body(max_tokens=1), group=group))

        return one

    async def reach(self, count: int) -> None:
        with trio.fail_after(60):
            while len(self.answers) < count:
                await self._changed.wait()


async def test_step_64_eta_1_starts_exactly_the_bound_per_version(fd_baseline: int) -> None:
    async with open_engine() as a, open_engine() as b, client_for(a, b) as client:
        client.declare_staleness(tenant="default", step=64, eta=1)
        done = Done()

        async def rollout(i: int) -> None:
            done.add(await client.post(COMPLETION, json=body(max_tokens=1), group=f"g{i // 8}"))

        async with trio.open_nursery() as nursery:
            for i in range(1000):
                nursery.start_soon(rollout, i)
            for version in range(15):
                expected = min(1000, (version + 2) * 64)  # 128 before v1, 192 before v2, ...
                await done.reach(expected)
                await trio.testing.wait_all_tasks_blocked()
                (stats,) = client.admission.statistics()
                assert completions(a) + completions(b) == expected  # the engines' side
                assert len(done.answers) == stats["started"] == expected
                assert stats["waiting"] == 1000 - expected and client.statistics().queued == 0
                await client.resume(weight_version=f"v{version + 1}")
        waited = sorted(r.admission_time for r in done.answers)
        assert waited[127] == 0.0 and waited[128] > 0.0  # the first 128 never waited
        assert all(r.queue_time < r.admission_time or r.admission_time == 0 for r in done.answers)


async def test_a_group_family_is_bounded_and_other_requests_are_not(fd_baseline: int) -> None:
    async with open_engine() as a, client_for(a) as client:
        client.declare_staleness(group_prefix="run-1/", step=2, eta=0)
        done = Done()
        rollout = done.rollout(client)

        async with trio.open_nursery() as nursery:
            for i in range(5):
                nursery.start_soon(rollout, f"run-1/g{i}")
            nursery.start_soon(rollout, "run-2/g0")  # another family: not bounded
            await done.reach(3)
            await trio.testing.wait_all_tasks_blocked()
            assert completions(a) == 3 and client.admission.waiting == 3
            assert client.withdraw_staleness(group_prefix="run-1/")  # the rest start at once
        assert completions(a) == 6


async def test_an_abort_call_ends_a_wait_at_the_bound_with_an_abort_answer(fd_baseline: int) -> None:
    async with open_engine() as a, client_for(a) as client:
        client.declare_staleness(tenant="default", step=1, eta=0)
        done = Done()
        rollout = done.rollout(client)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(rollout, "first")
            await done.reach(1)
            nursery.start_soon(rollout, "second")
            await trio.testing.wait_all_tasks_blocked()
            counts = await client.abort(group="second")
            assert counts.queued == 1
        assert completions(a) == 1
        choice = done.answers[1].json()["choices"][0]
        assert choice["finish_reason"] == "abort" and done.answers[1].attempts == 0


@pytest.mark.parametrize("on_stale", ["abort", "continue"])
async def test_a_rollout_falling_more_than_eta_behind(fd_baseline: int, on_stale: str) -> None:
    async with open_engine(decode_ms_per_token=10) as a, client_for(a) as client:
        client.declare_staleness(tenant="default", step=4, eta=0, on_stale=on_stale)
        answers: list[Any] = []

        async def rollout() -> None:
            answers.append(await client.post(COMPLETION, json=body(max_tokens=200)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(rollout)
            with trio.fail_after(30):
                await a.stats.wait_for(lambda s: s.running > 0)
            await trio.sleep(0.1)  # ten tokens decoded under the first weights
            await client.pause(engine_mode="keep")
            await client.resume(weight_version="v1")  # it is now one version behind
        (answer,) = answers
        choice = answer.json()["choices"][0]
        if on_stale == "abort":
            assert choice["finish_reason"] == "abort" and 0 < len(choice["text"].split()) < 200
        else:  # ended on the engine, continued on the current weights: one answer
            assert choice["finish_reason"] == "length"
            spans = choice["weight_versions"]
            assert [s["version"] for s in spans] == ["default", "v1"] and spans[-1]["end"] == 200
            assert answer.staleness == 0 and answer.attempts == 2
