"""Engine-side counters that tests assert on, awaitable without polling."""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import trio

__all__ = ["EngineStats", "TRACEPARENTS_KEPT"]

TRACEPARENTS_KEPT = 1024


class EngineStats:
    """Counters of one simulated engine (mutated only by the engine's tasks).

    Requests to ``/sim/*`` are never counted.

    - ``requests``: requests received (fully read), every path;
      ``by_path``: ``Counter[path]``; ``by_model``: ``Counter[model]``
      (generation requests naming a model, known or not; not counted for
      requests the ``drop`` or ``reject`` fault answered, which are never parsed);
      ``by_seed``: ``Counter[seed]`` of the same requests that carry a ``seed``
      (a client that gives each request its own seed counts generations per request).
    - ``completed``: generation requests answered 200 in full;
      ``aborted``: generation requests whose client went away before the
      answer was fully written (EOF/reset seen while queued, generating or writing).
    - ``responses``: ``Counter[status]`` of answers started (all paths).
    - ``connections_accepted`` / ``connections_open`` / ``connections_reset``
      (reset by the ``refuse_connections`` fault) / ``keep_alive_closed``
      (closed by the server's idle timeout).
    - ``running`` / ``peak_running``: generations holding capacity now / at most;
      ``queued`` / ``peak_queued``: waiting for capacity now / at most.
    - ``adapter_loads``: ``Counter[name]`` (load endpoint and lazy loads);
      ``lazy_loads``: ``Counter[name]``; ``adapter_unloads``: ``Counter[name]``.
    - ``prompt_tokens_computed`` / ``prompt_tokens_cached``: prompt tokens
      prefilled / found in the prefix cache (each prompt once, whatever ``n``;
      cached is always 0 without a prefix cache).
    - weight updates (docs/sim.md): ``pauses``: ``Counter[mode]``; ``resumes``;
      ``pause_aborted``: generations ended with ``finish_reason: "abort"`` (a pause in
      mode abort, ``/abort_requests``); ``held``: generations waiting for resume now;
      ``completed_by_version``: ``Counter[weight version]`` of generations answered in
      full under one version (``"None"``: no version set); ``completed_mixed``: answered
      in full after decoding under two versions (a keep pause across an update).
    - ``tokens_decoded``: every token the engine generated, counted per sequence
      (``n`` choices count ``n`` sequences), work a pause aborted or a client
      hang-up cut short included: what decoding cost, to compare with the tokens
      delivered.
    - ``traceparents``: the W3C ``traceparent`` of each generation request that
      carried one, in arrival order (the last :data:`TRACEPARENTS_KEPT`);
    - ``request_ids``: the ``X-Request-Id`` of generation requests, in arrival
      order (the last 4096): what vLLM takes as its request id.
    - ``prompts``: the prompt token ids of each generation request (its first
      prompt), in arrival order (the last 4096); ``sampled``: the token ids each
      answered instant-mode generation sampled (one list per choice, stop token
      included), in answer order (the last 4096): what the engine was prompted with
      and produced, for tests that check a gateway's token bookkeeping.
    - engine model (a profile; docs/sim.md, "Engine model"): ``preemptions``:
      sequences preempted by recompute (``vllm:num_preemptions_total``);
      ``kv_too_small``: sequences ended because alone they outgrew the KV budget;
      ``steps`` / ``busy_seconds``: scheduler steps run and their modelled time
      (seconds before ``time_scale``: busy fraction = busy_seconds × time_scale / wall);
      ``lag_seconds`` / ``lag_drops``: wall seconds the step loop fell behind
      its schedule beyond what it catches up (the machine's share of a wall
      time, docs/sim.md) / times it dropped such lateness.
      With a profile ``running`` / ``queued`` count sequences (each of ``n``
      choices), as vLLM v1's ``num_requests_running`` / ``_waiting`` do.
    - ``rejected``: answers injected by the ``reject`` fault;
      ``faults``: ``Counter[fault name]`` of every fault applied.

    ``await stats.wait_for(predicate)`` returns once ``predicate(stats)`` holds
    (checked after every change; no polling). Wrap it in ``trio.fail_after``.
    """

    def __init__(self) -> None:
        self.requests = 0
        self.by_path: Counter[str] = Counter()
        self.by_model: Counter[str] = Counter()
        self.by_seed: Counter[int] = Counter()
        self.completed = 0
        self.aborted = 0
        self.responses: Counter[int] = Counter()
        self.connections_accepted = 0
        self.connections_open = 0
        self.connections_reset = 0
        self.keep_alive_closed = 0
        self.running = 0
        self.peak_running = 0
        self.queued = 0
        self.peak_queued = 0
        self.adapter_loads: Counter[str] = Counter()
        self.lazy_loads: Counter[str] = Counter()
        self.adapter_unloads: Counter[str] = Counter()
        self.prompt_tokens_computed = 0
        self.prompt_tokens_cached = 0
        self.pauses: Counter[str] = Counter()
        self.resumes = 0
        self.pause_aborted = 0
        self.held = 0
        self.completed_by_version: Counter[str] = Counter()
        self.completed_mixed = 0
        self.tokens_decoded = 0
        self.preemptions = 0
        self.kv_too_small = 0
        self.steps = 0
        self.busy_seconds = 0.0
        self.lag_seconds = 0.0
        self.lag_drops = 0
        self.rejected = 0
        self.traceparents: list[str] = []
        self.faults: Counter[str] = Counter()
        self.request_ids: deque[str] = deque(maxlen=4096)
        self.prompts: deque[list[int]] = deque(maxlen=4096)
        self.sampled: deque[list[list[int]]] = deque(maxlen=4096)
        self._waiters = 0
        self._changed = trio.Event()

    def traced(self, traceparent: bytes) -> None:
        """Record a generation request's ``traceparent``."""
        kept = self.traceparents
        kept.append(traceparent.decode("latin-1"))
        if len(kept) > TRACEPARENTS_KEPT:
            del kept[0]

    def changed(self) -> None:
        """Wake every :meth:`wait_for` (call after mutating a counter); O(1) when nobody waits."""
        if self._waiters:
            self._changed.set()
            self._changed = trio.Event()

    async def wait_for(self, predicate: Callable[[EngineStats], bool]) -> None:
        """Return once ``predicate(self)`` is true; re-checked after every change.

        Cancellation: a plain checkpoint-based wait; cancel it with a scope.
        """
        while not predicate(self):
            self._waiters += 1
            try:
                await self._changed.wait()
            finally:
                self._waiters -= 1

    def reset(self) -> None:
        """Zero every cumulative counter (gauges ``running``, ``queued``, ``connections_open`` kept)."""
        keep = (self.running, self.queued, self.connections_open, self.held, self._waiters, self._changed)
        self.__init__()  # type: ignore[misc]
        self.running, self.queued, self.connections_open, self.held, self._waiters, self._changed = keep
        self.peak_running, self.peak_queued = self.running, self.queued
        self.changed()

    def snapshot(self) -> dict[str, Any]:
        """A JSON-ready copy of every counter (what ``GET /sim/stats`` returns)."""
        out: dict[str, Any] = {}
        for key, value in vars(self).items():
            if key.startswith("_"):
                continue
            if isinstance(value, Counter):
                value = {str(k): v for k, v in value.items()}
            elif isinstance(value, deque):
                value = list(value)
            elif isinstance(value, float) and math.isinf(value):
                value = None
            out[key] = value
        return out

    def __repr__(self) -> str:
        return f"EngineStats({self.snapshot()!r})"
