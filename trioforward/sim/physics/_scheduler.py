"""The engine model's scheduler: one step loop over every running sequence
(docs/sim.md, "Engine model").

Used when the engine has a profile (``--profile``); the plain timing model
(``_timing.py``) and instant mode do not come here. It follows vLLM v1's
scheduler (``vllm/v1/core/sched/scheduler.py``):

- each step serves the running sequences oldest first, then admits waiting
  ones (FIFO, preempted ones first) while fewer than ``max_num_seqs`` run and
  the step's token budget (``max_num_batched_tokens``) lasts: a decoding
  sequence takes 1 token, a prefilling one a chunk of its prompt, so a long
  prefill shares the step, and slows it, with everyone's decode;
- KV is allocated in blocks as a sequence grows (``_kv.py``); when a running
  sequence's next block does not fit, the *newest* running sequence is
  preempted by recompute: its blocks are freed (full ones stay in the prefix
  cache, evictable), it goes back to the front of the queue with the tokens it
  has generated, and is prefilled again (prompt + those tokens) when admitted;
  no new sequence is admitted in a step that preempted;
- the step lasts :meth:`EngineProfile.step_seconds` × ``time_scale``
  (× a prefill stall's slowdown; a frozen pause or an infinite stall halts it).
  Steps are paced by a running deadline on trio's clock: each step ends at the
  previous step's scheduled end plus its own length, so a late wakeup (a busy
  machine) shortens the next sleep instead of delaying every later step. The
  loop catches up at most :data:`MAX_LAG` wall seconds; lateness beyond that is
  dropped from the schedule and counted (``lag_seconds``, ``lag_drops``), so a
  long freeze of the process is not replayed as a burst of instant steps.

Each choice of a request (``n``) is one sequence, as in vLLM v1. A request
waits on its sequences (:meth:`Scheduler.wait`); cancelling it (abort, client
gone) drops them (:meth:`Scheduler.drop`), giving their blocks back.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from trioforward.sim.physics._kv import KVBudget
from trioforward.sim.physics._physics import EngineProfile
from trioforward.sim.physics._prefix_cache import PrefixCache

if TYPE_CHECKING:
    from trioforward.sim.core._rl import RLControl
    from trioforward.sim.core._stats import EngineStats

__all__ = ["MAX_LAG", "Scheduler", "SimSequence"]

#: Wall seconds the step loop may run behind its schedule and still catch up
#: (by running steps back to back); lateness beyond it is dropped and counted.
MAX_LAG = 0.25


@dataclass(eq=False, slots=True)
class SimSequence:
    """One sequence (one choice of a request) in the engine model.

    ``prompt`` and ``output`` are token ids (``output``: all it will generate);
    ``decoded``: output tokens generated so far; ``computed``: tokens whose KV
    is held; ``context``: tokens to prefill before decoding (prompt + decoded
    at admission); ``preemptions``: times it was preempted.
    """

    model: str
    prompt: list[int]
    output: list[int]
    order: int
    decoded: int = 0
    computed: int = 0
    context: int = 0
    preemptions: int = 0
    done: bool = False
    pinned: list[int] = field(default_factory=list)
    private: int = 0

    @property
    def prefilling(self) -> bool:
        return self.computed < self.context

    @property
    def held(self) -> int:
        """Blocks this sequence holds (pinned cached ones and private ones)."""
        return len(self.pinned) + self.private


class Scheduler:
    """The step loop of one simulated engine with a profile.

    ``max_num_seqs``: sequences running at once (0 = unlimited);
    ``kv_cache_tokens``: the KV budget (0 = unlimited); ``time_scale``: wall
    seconds per modelled second. ``stall`` is called before each step and
    returns the slowdown (1.0 none, ``inf`` halt) and when it ends (trio time); ``changed`` is the event the
    engine sets when a stall or pause changes. Counters: ``steps``,
    ``preemptions`` (also ``stats.preemptions``), ``busy_seconds`` (modelled
    time spent in steps), ``lag_seconds`` / ``lag_drops`` (wall seconds of
    lateness beyond :data:`MAX_LAG` dropped from the schedule / times; also
    in ``stats``).
    """

    def __init__(
        self,
        profile: EngineProfile,
        *,
        stats: EngineStats,
        rl: RLControl,
        cache: PrefixCache | None,
        max_num_seqs: int,
        kv_cache_tokens: int,
        time_scale: float,
        stall: Callable[[], tuple[float, float]],
        changed: Callable[[], trio.Event],
    ) -> None:
        self.profile = profile
        self.block_size = cache.block_size if cache is not None else profile.block_size
        self.kv = KVBudget(kv_cache_tokens, self.block_size, cache)
        self.cache = cache
        self.max_num_seqs = max_num_seqs if max_num_seqs > 0 else math.inf
        self.time_scale = time_scale
        self.stats = stats
        self.rl = rl
        self._stall = stall
        self._changed = changed
        self.running: list[SimSequence] = []  # admission order: oldest first
        self.waiting: deque[SimSequence] = deque()
        self._order = itertools.count()
        self._work = trio.Event()
        self._stepped = trio.Event()
        self.steps = 0
        self.preemptions = 0
        self.busy_seconds = 0.0
        self.lag_seconds = 0.0
        self.lag_drops = 0
        self.max_lag = MAX_LAG
        self.loop_running = False

    # -- requests ----------------------------------------------------------

    def submit(self, model: str, prompts: list[list[int]], outputs: list[list[int]]) -> list[SimSequence]:
        """Queue one sequence per output (``outputs[i]`` continues ``prompts[i]``)."""
        seqs = [
            SimSequence(model, list(p), list(o), next(self._order)) for p, o in zip(prompts, outputs, strict=True)
        ]
        self.waiting.extend(seqs)
        self._counts()
        self._work.set()
        return seqs

    async def wait(self, seqs: list[SimSequence], tokens: int | None = None) -> None:
        """Return once every sequence is done, or (``tokens``) has generated
        ``min(tokens, its length)`` tokens. Cancellation: a plain wait."""
        while not all(
            s.done or (tokens is not None and s.decoded >= min(tokens, len(s.output))) for s in seqs
        ):
            await self._stepped.wait()

    def drop(self, seqs: list[SimSequence]) -> None:
        """Take unfinished ``seqs`` out (their request ended early), freeing their blocks."""
        for s in seqs:
            if s.done:
                continue
            s.done = True
            if s in self.running:
                self.running.remove(s)
                self._free(s, keep=True)
            elif s in self.waiting:
                self.waiting.remove(s)
        self._counts()

    # -- the loop ------------------------------------------------------------

    async def run(self) -> None:
        """The step loop (runs for the engine's life; idle costs one wait).

        ``deadline`` is the trio time the last step was scheduled to end; it
        restarts from now after an idle wait or a halt, which are not lateness.
        """
        self.loop_running = True
        deadline = trio.current_time()
        while True:
            if not self.running and not self.waiting:
                self._work = trio.Event()
                await self._work.wait()
                deadline = trio.current_time()
                continue
            slowdown, until = self._stall()
            if self.rl.frozen or slowdown == math.inf:
                changed = self._changed()
                with trio.move_on_at(math.inf if self.rl.frozen else until):
                    await changed.wait()
                deadline = trio.current_time()
                continue
            seconds, progress = self._schedule()
            self.steps += 1
            self.busy_seconds += seconds
            self.stats.steps += 1
            self.stats.busy_seconds += seconds
            if seconds > 0:
                deadline = self._pace(deadline + seconds * self.time_scale * slowdown)
                await trio.sleep_until(deadline)
            else:
                await trio.lowlevel.checkpoint()
            self._advance(progress)

    def _pace(self, end: float) -> float:
        """The step's end on trio's clock: ``end`` (its scheduled end), or, when
        that is more than ``max_lag`` in the past, ``max_lag`` before now, the
        lateness beyond it counted in ``lag_seconds`` / ``lag_drops``."""
        floor = trio.current_time() - self.max_lag
        if end >= floor:
            return end
        self.lag_seconds += floor - end
        self.lag_drops += 1
        self.stats.lag_seconds += floor - end
        self.stats.lag_drops += 1
        return floor

    def _schedule(self) -> tuple[float, list[tuple[SimSequence, int]]]:
        """Plan one step: which sequence computes how many tokens; its modelled seconds."""
        budget = self.profile.max_num_batched_tokens
        plan: list[tuple[SimSequence, int]] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            tokens = min(seq.context - seq.computed, budget) if seq.prefilling else 1
            if not self._grow(seq, seq.computed + tokens):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
                continue
            plan.append((seq, tokens))
            budget -= tokens
            i += 1
        while not preempted and self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            if not self._admit(seq):
                break
            self.waiting.popleft()
            self.running.append(seq)
            tokens = min(seq.context - seq.computed, budget)
            if tokens > 0 and not self._grow(seq, seq.computed + tokens):
                self.running.pop()
                self._free(seq, keep=False)
                self.waiting.appendleft(seq)
                break
            plan.append((seq, tokens))
            budget -= tokens
        if not plan and not self.running and self.waiting:
            # Alone and still too big for the whole budget: it can never run.
            # vLLM refuses to start with a KV cache below max_model_len; here
            # the sequence ends where it stands (counted in ``kv_too_small``).
            seq = self.waiting.popleft()
            seq.done = True
            self.stats.kv_too_small += 1
            self._stepped.set()
            self._stepped = trio.Event()
        self._counts()
        batch = sum(1 for s, _ in plan if not s.prefilling)
        prefill = sum(t for s, t in plan if s.prefilling)
        kv_tokens = sum(s.computed for s in self.running)
        return self.profile.step_seconds(batch, kv_tokens, prefill), plan

    def _admit(self, seq: SimSequence) -> bool:
        """Look ``seq``'s context up in the prefix cache and pin its full blocks;
        False (nothing changed) if they do not fit in the KV budget."""
        context = seq.prompt + seq.output[: seq.decoded]
        seq.context = len(context)
        cache, stats = self.cache, self.stats
        cached = 0
        if cache is not None:
            cached = cache.match(seq.model, context)
            keys = cache.full_keys(seq.model, context)
            if not self.kv.room(len(keys) - cached // self.block_size):
                return False
            cache.insert(seq.model, context)
            cache.pin(keys)
            seq.pinned = keys
        seq.computed = cached
        stats.prompt_tokens_cached += cached
        stats.prompt_tokens_computed += seq.context - cached
        return True

    def _grow(self, seq: SimSequence, tokens: int) -> bool:
        """Hold blocks for ``tokens`` KV tokens of ``seq``; False if they do not fit."""
        need = -(-tokens // self.block_size) - seq.held
        if need <= 0:
            return True
        if not self.kv.reserve(need):
            return False
        seq.private += need
        return True

    def _free(self, seq: SimSequence, keep: bool) -> None:
        """Give ``seq``'s blocks back; ``keep``: its full blocks stay cached (evictable)."""
        self.kv.release(seq.private)
        seq.private = 0
        if self.cache is not None:
            self.cache.unpin(seq.pinned)
            seq.pinned = []
            if keep:
                self.cache.insert(seq.model, seq.prompt + seq.output[: seq.decoded])
                self.kv.trim()

    def _preempt(self, seq: SimSequence) -> None:
        self.running.remove(seq)
        self._free(seq, keep=True)
        seq.computed = seq.context = 0
        seq.preemptions += 1
        self.preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(seq)

    def _advance(self, plan: list[tuple[SimSequence, int]]) -> None:
        decoded = 0
        for seq, tokens in plan:
            if seq.done:  # dropped during the step
                continue
            if seq.prefilling:
                seq.computed += tokens
                if seq.prefilling:
                    continue
            else:
                seq.computed += 1
            if seq.decoded < len(seq.output):  # the step samples one token
                seq.decoded += 1
                decoded += 1
            if seq.decoded >= len(seq.output):
                seq.done = True
                self.running.remove(seq)
                self._free(seq, keep=True)
        self.stats.tokens_decoded += decoded
        self._counts()
        self._stepped.set()
        self._stepped = trio.Event()

    def _counts(self) -> None:
        stats = self.stats
        stats.running = len(self.running)
        stats.queued = len(self.waiting)
        stats.peak_running = max(stats.peak_running, stats.running)
        stats.peak_queued = max(stats.peak_queued, stats.queued)
        stats.changed()
