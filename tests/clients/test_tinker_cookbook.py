"""tinker-cookbook 0.6.1, unchanged, through the ``tinker`` SDK against the gateway over
a vLLM and an SGLang sim (docs/compatibility.md, "The RL stacks' own clients").

- Its group rollouts (``do_group_rollout`` over a ``ProblemGroupBuilder``), its
  evaluator (``RLTestSetEvaluator``) and its renderer-based completer
  (``TinkerMessageCompleter``): every sample one engine request, all tokens.
- A two-turn rollout (its rollout loop, ``do_single_rollout``) with the first
  turn in flight across each pause mode: both turns whole; the engine decoded
  each token once, except after a whole replay.

The environments are written here, as a cookbook user writes them; the
tokenizer is built here too (``SimTokenizer``: no hub downloads).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest
import tinker
from conftest import SimTokenizer, access_statuses, wait_stats
from tinker_cookbook import renderers
from tinker_cookbook.completers import TinkerMessageCompleter, TinkerTokenCompleter
from tinker_cookbook.rl.metric_util import RLTestSetEvaluator
from tinker_cookbook.rl.problem_env import ProblemEnv, ProblemGroupBuilder
from tinker_cookbook.rl.rollouts import do_group_rollout, do_single_rollout
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, RLDataset, StepResult

BUDGET = 24
KINDS = ["vllm", "sglang"]
# 408 try_again: a held retrieve_future poll that ran out; the SDK polls again (docs/tinker.md)
OK = (200, 408)
# (pause body, the sim's pause counter, tokens decoded per token kept)
PAUSES = [
    ({"engine_mode": "keep"}, 1),
    ({"engine_mode": "wait"}, 1),
    ({"engine_mode": "abort", "replay": True}, None),  # redone whole: more than kept
    ({"engine_mode": "abort", "replay": "continue"}, 1),
]


def _renderer() -> renderers.Renderer:
    return renderers.get_renderer("role_colon", SimTokenizer())


class Question(ProblemEnv):
    def get_question(self) -> str:
        return "Name a token."

    def check_answer(self, sample_str: str) -> bool:
        return " t" in sample_str

    def check_format(self, sample_str: str) -> bool:
        return True

    def get_reference_answer(self) -> str:
        return "t1"


class Questions(RLDataset):
    def __init__(self, groups: int, group_size: int) -> None:
        self.builders = [ProblemGroupBuilder(lambda: Question(_renderer()), group_size) for _ in range(groups)]

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return self.builders

    def __len__(self) -> int:
        return 1


class TwoTurns(Env):
    """Asks, reads the answer, asks again; done after the second answer."""

    def __init__(self) -> None:
        self.renderer = _renderer()
        self.convo: list[renderers.Message] = [{"role": "user", "content": "First question."}]

    async def initial_observation(self) -> Any:
        return self.renderer.build_generation_prompt(self.convo), self.renderer.get_stop_sequences()

    async def step(self, action: list[int], *, extra: Any = None) -> StepResult:
        message, _ = self.renderer.parse_response(action)
        self.convo += [message, {"role": "user", "content": "Second question."}]
        done = len(self.convo) > 3
        return StepResult(
            reward=1.0 if done else 0.0,
            episode_done=done,
            next_observation=self.renderer.build_generation_prompt(self.convo),
            next_stop_condition=self.renderer.get_stop_sequences(),
        )


@pytest.fixture
def sampling(launch: Any, request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any, Any]]:
    """(sim, gateway, a tinker SamplingClient of sim-base through the gateway)."""
    sim = launch("sim-engine", "--kind", request.param, "--model", "sim-base", "--decode-ms-per-token", "50")
    gateway = launch("serve", "--engine", sim.url, "--log-level", "info")
    with tinker.ServiceClient(base_url=gateway.url, api_key="tml-clients") as service:
        yield sim, gateway, service.create_sampling_client(base_model="sim-base")


@pytest.mark.parametrize("sampling", KINDS, indirect=True)
def test_group_rollouts_evaluator_and_message_completer(sampling: tuple[Any, Any, Any]) -> None:
    sim, gateway, client = sampling
    policy = TinkerTokenCompleter(client, max_tokens=BUDGET)

    async def run() -> tuple[Any, dict[str, float], Any]:
        group = await do_group_rollout(ProblemGroupBuilder(lambda: Question(_renderer()), 4), policy)
        metrics = await RLTestSetEvaluator(Questions(groups=2, group_size=3), max_tokens=BUDGET)(client)
        completer = TinkerMessageCompleter(client, _renderer(), max_tokens=BUDGET)
        message = await completer([{"role": "user", "content": "Say something."}])
        return group, metrics, message

    group, metrics, message = asyncio.run(run())
    assert len(group.trajectories_G) == 4
    for trajectory in group.trajectories_G:
        (transition,) = trajectory.transitions
        assert len(transition.ac.tokens) == BUDGET and len(transition.ac.maybe_logprobs) == BUDGET
        assert transition.metrics["correct"] == 1.0  # its renderer parsed the sim's tokens
    assert metrics["test/env/all/correct"] == 1.0, metrics
    assert message["role"] == "assistant" and len(message["content"].split()) == BUDGET
    stats = sim.stats()
    samples = 4 + 2 * 3 + 1
    assert stats["completed"] == samples and stats["tokens_decoded"] == samples * BUDGET
    assert [s for s in access_statuses(gateway) if s not in OK] == []


@pytest.mark.parametrize("sampling", KINDS, indirect=True)
def test_two_turn_rollout_across_each_pause_mode(sampling: tuple[Any, Any, Any]) -> None:
    sim, gateway, client = sampling
    policy = TinkerTokenCompleter(client, max_tokens=BUDGET)
    for body, decoded_per_token in PAUSES:
        before = sim.stats()
        trajectories: list[Any] = []

        def rollout(into: list[Any]) -> None:
            into.append(asyncio.run(do_single_rollout(policy, TwoTurns())))

        runner = threading.Thread(target=rollout, args=(trajectories,))
        runner.start()
        started = before["tokens_decoded"] + 3
        wait_stats(sim, lambda s, started=started: s["running"] == 1 and s["tokens_decoded"] >= started)
        pause = httpx.post(gateway.url + "/admin/pause", json=body, timeout=60)
        assert pause.status_code == 200, (body, pause.text)
        assert httpx.post(gateway.url + "/admin/resume", json={}, timeout=60).status_code == 200
        runner.join(timeout=120)
        assert not runner.is_alive()

        (trajectory,) = trajectories
        assert [len(t.ac.tokens) for t in trajectory.transitions] == [BUDGET, BUDGET], body
        assert trajectory.transitions[-1].episode_done
        stats = sim.stats()
        aborted = 1 if body["engine_mode"] == "abort" else 0  # the first turn, ended by the pause
        assert stats["pause_aborted"] - before["pause_aborted"] == aborted, (body, before, stats)
        assert stats["completed"] - before["completed"] == 2 + aborted, body  # its 200 "abort" counts
        assert sum(stats["pauses"].values()) - sum(before["pauses"].values()) == 1, body
        assert stats["resumes"] - before["resumes"] == 1, body
        decoded = stats["tokens_decoded"] - before["tokens_decoded"]
        if decoded_per_token is None:
            assert decoded > 2 * BUDGET, body  # the first turn was replayed whole
        else:
            assert decoded == 2 * BUDGET, body  # each token decoded once
    assert [s for s in access_statuses(gateway) if s not in OK] == []
