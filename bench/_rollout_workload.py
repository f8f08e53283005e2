"""One RL step's requests for ``bench/rollout_makespan.py``, and the lower bound
on its makespan from the engines' timing model (docs/performance.md,
"Rollout makespan: engine timing and workload").

The workload is drawn once from a seed and is the same for every system:

- ``groups`` prompt groups of ``samples`` samples each (GRPO: the group's
  samples share one prompt, sent as separate requests): a shared system
  prompt, then a question of lognormal length;
- ``sessions`` multi-turn sessions of ``turns`` turns (an agent episode): each
  turn's prompt is the previous prompt, the answer and a tool output
  (:meth:`Workload.session_prompt`), sent once the previous turn answered;
- every request's output length is lognormal (median ``median_output``,
  ``sigma``), capped at ``max_output`` tokens, and the engine decodes exactly
  that many (``max_tokens``; the simulated engine stops only there).

Prompts are text (smg's, sglang-router's and vllm-router's HTTP completions
take a string); the simulated engine tokenizes text as its UTF-8 bytes, one
character a token, so a length in characters is a length in tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = ["FlatTiming", "Workload", "draw", "lower_bound", "model_lower_bound", "text"]


def text(tag: str, n: int) -> str:
    """``n`` characters (= sim tokens) unique to ``tag``."""
    unit = f"[{tag}] "
    return (unit * (n // len(unit) + 1))[:n]


@dataclass(frozen=True, slots=True)
class Workload:
    """The drawn step. ``group_prompts[g]``: group g's prompt (text);
    ``group_outputs[g][s]``: sample s's output tokens. ``session_first[s]``:
    session s's first prompt; ``session_tool[s][t]``: the tool output appended
    after turn t (characters); ``session_outputs[s][t]``: turn t's output tokens."""

    seed: int
    groups: int
    samples: int
    sessions: int
    turns: int
    median_output: int
    sigma: float
    max_output: int
    system_tokens: int
    group_prompts: list[str] = field(repr=False)
    group_outputs: list[list[int]] = field(repr=False)
    session_first: list[str] = field(repr=False)
    session_tool: list[list[int]] = field(repr=False)
    session_outputs: list[list[int]] = field(repr=False)

    def session_prompt(self, s: int, t: int) -> str:
        """Turn ``t``'s prompt of session ``s``: the first prompt, then per earlier
        turn its answer (a stand-in of its length: the simulated engine's
        answer text is ``" t<id>"`` a token, several characters a token) and
        its tool output."""
        parts = [self.session_first[s]]
        for k in range(t):
            parts.append(text(f"answer {s}.{k}", self.session_outputs[s][k]))
            parts.append(text(f"tool {s}.{k}", self.session_tool[s][k]))
        return "".join(parts)

    @property
    def requests(self) -> int:
        return self.groups * self.samples + self.sessions * self.turns

    @property
    def output_tokens(self) -> int:
        return sum(map(sum, self.group_outputs)) + sum(map(sum, self.session_outputs))

    def describe(self) -> dict[str, Any]:
        """The parameters and every drawn length (prompt lengths in tokens)."""
        doc = asdict(self)
        for key in ("group_prompts", "session_first"):
            doc[key.replace("prompts", "prompt_tokens").replace("first", "first_tokens")] = [
                len(p) for p in doc.pop(key)]
        doc["requests"] = self.requests
        doc["output_tokens"] = self.output_tokens
        return doc


def draw(seed: int, groups: int, samples: int, sessions: int, turns: int, median_output: int = 300,
         sigma: float = 1.0, max_output: int = 4096, system_tokens: int = 256) -> Workload:
    """Draws a workload (deterministic in ``seed``). Question lengths are
    lognormal around 400 tokens (40..2,000), a session's first prompt around
    600 (100..3,000), tool outputs around 150 (20..1,000)."""
    rng = np.random.default_rng(seed)

    def lengths(median: float, s: float, lo: int, hi: int, size: tuple[int, ...]) -> list[Any]:
        drawn = np.clip(np.rint(rng.lognormal(np.log(median), s, size)), lo, hi).astype(int)
        return drawn.tolist()  # type: ignore[no-any-return]

    system = text("system: solve the problem and show your work", system_tokens)
    questions = lengths(400, 0.7, 40, 2000, (groups,))
    group_prompts = [system + text(f"question {g}", questions[g]) for g in range(groups)]
    firsts = lengths(600, 0.6, 100, 3000, (sessions,))
    session_first = [system + text(f"task {s}", firsts[s]) for s in range(sessions)]
    return Workload(
        seed, groups, samples, sessions, turns, median_output, sigma, max_output, system_tokens,
        group_prompts, lengths(median_output, sigma, 1, max_output, (groups, samples)),
        session_first, lengths(150, 0.8, 20, 1000, (sessions, turns)),
        lengths(median_output, sigma, 1, max_output, (sessions, turns)),
    )


@dataclass(frozen=True, slots=True)
class FlatTiming:
    """The simulated engine's flat timing (``sim-engine --prefill-ms-per-token``,
    ``--decode-ms-per-token``, ``--capacity``): every running request decodes a
    token each ``decode_ms`` whatever the batch, a prompt token costs
    ``prefill_ms`` of that request's time, ``slots`` requests run at once."""

    prefill_ms: float
    decode_ms: float
    slots: int

    def request_s(self, computed_prompt: int, output: int) -> float:
        return (computed_prompt * self.prefill_ms + output * self.decode_ms) / 1e3


def lower_bound(work: Workload, timing: FlatTiming, engines: int) -> dict[str, float]:
    """No placement finishes the step sooner than the larger of:

    - ``work_s``: the whole work at the fleet's best throughput — every slot
      of every engine busy, each distinct prompt prefix computed once (the
      system prompt once per engine, a group's question once, a session turn
      only what it adds to the previous prompt);
    - ``chain_s``: the longest chain alone at batch 1 — one request, or one
      session's turns back to back (a turn starts when the last one answered);
      the answer's text re-enters the next prompt and is computed there.

    Seconds; ``lower_bound_s`` is the larger."""
    slot_s = 0.0
    chains = []
    for g, prompt in enumerate(work.group_prompts):
        outputs = work.group_outputs[g]
        slot_s += timing.request_s(len(prompt) - work.system_tokens, sum(outputs))
        chains.append(max(timing.request_s(len(prompt), o) for o in outputs))
    for s, first in enumerate(work.session_first):
        chain = 0.0
        new = len(first)
        for t, output in enumerate(work.session_outputs[s]):
            cost = timing.request_s(new - (work.system_tokens if t == 0 else 0), output)
            slot_s += cost
            chain += cost + (work.system_tokens * timing.prefill_ms / 1e3 if t == 0 else 0.0)
            new = output + work.session_tool[s][t]
        chains.append(chain)
    slot_s += engines * timing.request_s(work.system_tokens, 0)
    work_s = slot_s / (engines * timing.slots)
    chain_s = max(chains, default=0.0)
    return {"work_s": work_s, "chain_s": chain_s, "lower_bound_s": max(work_s, chain_s)}


def _distinct_prompt(work: Workload, engines: int) -> int:
    """Prompt tokens computed once each distinct prefix is computed once: the
    system prompt once per engine, each question once, each session turn only
    what it adds to the previous prompt."""
    total = engines * work.system_tokens
    total += sum(len(p) - work.system_tokens for p in work.group_prompts)
    for s, first in enumerate(work.session_first):
        total += len(first) - work.system_tokens
        total += sum(work.session_outputs[s][t] + work.session_tool[s][t] for t in range(work.turns - 1))
    return total


def _requests(work: Workload) -> list[tuple[int, int, int]]:
    """``(session or -1, prompt tokens, output tokens)`` of every request."""
    out = [(-1, len(p), o) for g, p in enumerate(work.group_prompts) for o in work.group_outputs[g]]
    for s in range(work.sessions):
        out += [(s, len(work.session_prompt(s, t)), work.session_outputs[s][t]) for t in range(work.turns)]
    return out


def model_lower_bound(work: Workload, profile: Any, engines: int, max_num_seqs: int, kv_cache_tokens: int,
                      time_scale: float = 1.0) -> dict[str, float]:
    """:func:`lower_bound` for engines that run the sim's engine model
    (``profile``: a ``trioforward.sim`` ``EngineProfile``; a step costs
    ``step_s + seq_s·batch + kv_token_s·kv_tokens + prefill_token_s·prefill``,
    docs/sim.md). Engine time adds up over the fleet's steps whatever the
    placement: ``seq_s`` per decoded token, ``kv_token_s`` per context token a
    decoded token reads, ``prefill_token_s`` per distinct prompt token; and a
    step decodes at most ``max_num_seqs`` tokens, and the sequences it runs
    hold at most ``kv_cache_tokens`` (0 = no limit) of KV that is theirs alone
    (prefix-cache blocks are shared, so only a sequence's own tokens count: a
    group sample's generated tokens, a session turn's prompt past the system
    prompt and its generated tokens), which bounds the steps (``step_s``
    each) from below. ``chain_s``: the longest chain alone — its prefill in
    chunks of ``max_num_batched_tokens``, then one token a step at batch 1
    (the first from the prefill's step). Seconds, times ``time_scale``."""
    tokens = 0
    context = 0
    private = 0  # KV tokens no other running sequence can share, summed over decoded tokens
    chains: dict[int, float] = {}
    longest = 0.0
    previous: dict[int, int] = {}
    for session, prompt, output in _requests(work):
        # the first token comes from the prefill's step; decoded token i >= 1
        # takes a step of its own reading prompt + i tokens of KV
        tokens += output - 1
        context += (output - 1) * prompt + output * (output - 1) // 2
        # a group's samples share its prompt; a session's prompt is its own
        # but for the system prompt every request shares
        own = prompt - work.system_tokens if session >= 0 or work.samples == 1 else 0
        private += (output - 1) * own + output * (output - 1) // 2
        new = prompt - previous.get(session, 0) if session >= 0 else prompt
        chunks = -(-new // profile.max_num_batched_tokens)
        alone = (chunks * profile.step_s + new * profile.prefill_token_s
                 + (output - 1) * (profile.step_s + profile.seq_s)
                 + profile.kv_token_s * ((output - 1) * prompt + output * (output - 1) // 2))
        if session >= 0:
            chains[session] = chains.get(session, 0.0) + alone
            previous[session] = prompt  # the answer re-enters as new text (Workload.session_prompt)
        else:
            longest = max(longest, alone)
    steps = tokens / max_num_seqs
    if kv_cache_tokens > 0:
        steps = max(steps, private / kv_cache_tokens)
    fleet_s = (steps * profile.step_s + tokens * profile.seq_s + context * profile.kv_token_s
               + _distinct_prompt(work, engines) * profile.prefill_token_s)
    work_s = time_scale * fleet_s / engines
    chain_s = time_scale * max([longest, *chains.values()])
    return {"work_s": work_s, "chain_s": chain_s, "lower_bound_s": max(work_s, chain_s)}
