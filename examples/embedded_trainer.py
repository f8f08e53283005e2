"""A toy RL trainer that samples through trioforward's embedded client.

Each step fans a batch of prompts out from the trainer's own nursery
(``n`` samples per prompt, token ids in, numpy arrays out), scores the samples
with a made-up reward, and then "updates the weights" while the engines are
paused — requests issued meanwhile would wait, not fail.

    python examples/embedded_trainer.py                      # simulated engines
    python examples/embedded_trainer.py --engine http://10.0.0.1:8000 \\
        --engine http://10.0.0.2:8000 --model Qwen/Qwen3-8B     # real vLLM engines

See docs/embedding.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from contextlib import AsyncExitStack

import numpy as np
import trio

import trioforward


def reward(tokens: np.ndarray) -> float:
    """A stand-in reward: the fraction of even token ids. ``tokens``: int32, shape (n,)."""
    return float(np.mean(tokens % 2 == 0)) if tokens.size else 0.0


async def rollout(client: trioforward.Client, model: str, prompt: list[int], seed: int, out: list[float]) -> None:
    """Sample 4 continuations of ``prompt`` and append their rewards to ``out``."""
    completion = await client.complete(
        model=model,
        prompt=prompt,
        max_tokens=16,
        n=4,
        temperature=1.0,
        seed=seed,
        session=f"prompt-{prompt[0]}",  # with routing="session": one prompt, one engine's prefix cache
    )
    for choice in completion.choices:
        assert choice.logprobs is not None and choice.logprobs.shape == choice.tokens.shape
        out.append(reward(choice.tokens))


async def train(engines: Sequence[str], model: str, steps: int = 3, batch: int = 32) -> list[float]:
    """Run ``steps`` training steps; returns the mean reward of each step."""
    history: list[float] = []
    async with trioforward.open_client(engines=engines, engine_capacity=64, dispatch_timeout=600) as client:
        for step in range(steps):
            rewards: list[float] = []
            async with trio.open_nursery() as nursery:
                for i in range(batch):
                    prompt = [1 + i, 2, 3, 4, 5, 6, 7, 8]
                    nursery.start_soon(rollout, client, model, prompt, step * batch + i, rewards)
            history.append(float(np.mean(rewards)))
            # Weight update: no new request reaches an engine until the block ends;
            # requests already running finish first (mode="wait").
            async with client.paused():
                await trio.sleep(0.01)  # push the new weights to the engines here
            stats = client.statistics()
            print(
                f"step {step}: {len(rewards)} samples, mean reward {history[-1]:.3f}, "
                f"requests {stats.requests_total}, retries {sum(stats.retries.values())}"
            )
    return history


async def main(argv: Sequence[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", action="append", default=[], help="engine URL (repeatable); default: simulated")
    parser.add_argument("--model", default="sim-base")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    async with AsyncExitStack() as stack:
        engines = list(args.engine)
        if not engines:
            from trioforward.sim import open_engine

            for _ in range(2):
                engine = await stack.enter_async_context(open_engine(capacity=64, decode_ms_per_token=1.0))
                engines.append(engine.url)
        return await train(engines, args.model, steps=args.steps)


if __name__ == "__main__":
    trio.run(main)
