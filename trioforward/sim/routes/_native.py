"""The simulated engine's token routes: one generation loop for SGLang's
``POST /generate`` (``_sglang_generate.py``) and vLLM's ``POST
/inference/v1/generate`` (``_vllm_tokens.py``), docs/sim.md, "Token routes".

A route module parses a body into a :class:`Native` (a ``Generation`` plus the
route's own fields) or an error answer, and renders answers: the whole answer,
the stream's events (one per decode step, the last one ending the stream) and
an aborted answer. This module runs them on the engine's timing model, capacity
queue and pause/abort control, as the OpenAI routes run (``_engine.py``), and
records which weight version produced each output position (``versions``: one
entry per step, the span shape ``[{"version", "start", "end"}]`` is the route's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import trio

from trioforward.sim.core._rl import Run
from trioforward.sim.model._api import Generation
from trioforward.sim.model._generate import Sample
from trioforward.sim.model._stream import STREAM_CONTENT_TYPE
from trioforward.sim.physics._prefix_cache import cache_outputs

if TYPE_CHECKING:
    from trioforward.sim.core._http import Exchange
    from trioforward.sim.engine._engine import SimEngine

__all__ = ["Native", "NativeRoute", "serve_native", "spans"]

Answer = tuple[int, bytes, bytes]
_JSON = b"application/json"


@dataclass(slots=True)
class Native:
    """A parsed token-route request: ``gen`` (prompts, ``n``, budget, seed, stops,
    ``logprobs`` top-k or None, ``stream``), ``rids``: the engine-side id of each
    sample (prompt-major), ``rid``: the request's own id, ``extra``: the route's fields."""

    gen: Generation
    rid: str
    rids: list[str]
    extra: dict[str, Any] = field(default_factory=dict)


class NativeRoute(Protocol):
    """A token route's wire format (module-level functions)."""

    def parse(self, engine: SimEngine, body: bytes, headers: dict[bytes, bytes]) -> Native | Answer: ...

    def whole(self, engine: SimEngine, nat: Native, samples: list[Sample], versions: list[str | None]) -> bytes: ...

    def chunk(
        self,
        engine: SimEngine,
        nat: Native,
        samples: list[Sample],
        sent: list[int],
        versions: list[str | None],
        final: bool,
    ) -> bytes:
        """The stream's bytes for ``samples`` as they are now (``finish_reason`` ""
        while unfinished); ``sent``: tokens of each already streamed (updated);
        ``final``: also the ending events and ``data: [DONE]``."""
        ...

    def refused(self, nat: Native, status: int, message: str) -> Answer: ...


def spans(versions: list[str | None], length: int) -> list[dict[str, Any]] | None:
    """``[{"version", "start", "end"}]`` over output positions ``0..length`` from the
    version of each decode step (None while no version was ever set)."""
    out: list[dict[str, Any]] = []
    for i, version in enumerate(versions[:length]):
        if version is None:
            continue
        if out and out[-1]["version"] == version and out[-1]["end"] == i:
            out[-1]["end"] = i + 1
        else:
            out.append({"version": version, "start": i, "end": i + 1})
    return out or None


def cut(samples: list[Sample], k: int) -> list[Sample]:
    """The samples as an abort after ``k`` decode steps leaves them."""
    return [
        s._replace(tokens=s.tokens[:k], logprobs=s.logprobs[:k], finish_reason="abort", stop_reason=None)
        for s in samples
    ]


async def serve_native(
    engine: SimEngine, ex: Exchange, route: NativeRoute, body: bytes, headers: dict[bytes, bytes]
) -> None:
    """Answer one token-route request on ``engine``."""
    parsed = route.parse(engine, body, headers)
    if not isinstance(parsed, Native):
        return await ex.respond(*parsed)
    nat = parsed
    gen = nat.gen
    stats = engine.stats
    stats.by_model[gen.model] += 1
    if gen.seed is not None:
        stats.by_seed[gen.seed] += 1
    if any(run.rid == nat.rid for run in engine.rl.runs.values()):
        message = f"Duplicate request ID detected: {nat.rid}"
        return await ex.respond(*route.refused(nat, 400, message))
    versions: list[str | None] = []
    sent = [0] * (len(gen.prompts) * gen.n)

    async def work(run: Run) -> None:
        await _generate(engine, ex, route, nat, run, versions, sent)

    async def aborted(run: Run) -> None:
        samples = cut(gen.samples(), run.decoded)
        if gen.stream:
            if ex.status == 0:
                await ex.start_stream(200, STREAM_CONTENT_TYPE)
            return await ex.end_stream(route.chunk(engine, nat, samples, sent, versions, True))
        await ex.respond(200, _JSON, route.whole(engine, nat, samples, versions))

    await engine.rl.generation(nat.rid, work, aborted)


async def _generate(
    engine: SimEngine,
    ex: Exchange,
    route: NativeRoute,
    nat: Native,
    run: Run,
    versions: list[str | None],
    sent: list[int],
) -> None:
    gen, stats = nat.gen, engine.stats
    if engine.scheduler is not None:  # the engine model (docs/sim.md, "Engine model")
        return await _stepped(engine, ex, route, nat, run, versions, sent)
    limiter = None if engine.instant else engine._limiter
    if limiter is not None:
        await engine._take_slot()
    try:
        stats.running += 1
        stats.peak_running = max(stats.peak_running, stats.running)
        stats.changed()
        samples = gen.samples()
        await engine._prefill(gen)
        steps = max((len(s.tokens) for s in samples), default=0)
        if gen.stream:
            await ex.start_stream(200, STREAM_CONTENT_TYPE)
        run.decode_start = trio.current_time()
        for i in range(steps):
            if limiter is not None:
                await engine._decode(1)
            versions.append(engine.rl.weight_version)
            run.decoded = i + 1
            stats.tokens_decoded += sum(1 for s in samples if len(s.tokens) > i)
            stats.changed()  # a test may await progress (O(1) when nobody waits)
            if gen.stream and i < steps - 1:
                await ex.send_chunk(route.chunk(engine, nat, _upto(samples, i + 1), sent, versions, False))
        cache_outputs(engine.prefix_cache, gen, samples)
        if gen.stream:
            await ex.end_stream(route.chunk(engine, nat, samples, sent, versions, True))
        else:
            await ex.respond(200, _JSON, route.whole(engine, nat, samples, versions))
        engine.rl.completed(run.version)
    finally:
        stats.running -= 1
        stats.changed()
        if limiter is not None:
            limiter.release()


async def _stepped(
    engine: SimEngine,
    ex: Exchange,
    route: NativeRoute,
    nat: Native,
    run: Run,
    versions: list[str | None],
    sent: list[int],
) -> None:
    """:func:`_generate` on the engine model: the sequences run in the scheduler's steps."""
    gen, scheduler = nat.gen, engine.scheduler
    assert scheduler is not None
    samples = gen.samples()
    prompts = [gen.prompts[i // gen.n] for i in range(len(samples))]
    seqs = scheduler.submit(gen.model, prompts, [s.tokens for s in samples])
    try:
        steps = max((len(s.tokens) for s in samples), default=0)
        for i in range(steps):
            await scheduler.wait(seqs, i + 1)
            versions.append(engine.rl.weight_version)
            run.decoded = i + 1
            if gen.stream:
                if i == 0:
                    await ex.start_stream(200, STREAM_CONTENT_TYPE)
                if i < steps - 1:
                    await ex.send_chunk(route.chunk(engine, nat, _upto(samples, i + 1), sent, versions, False))
        await scheduler.wait(seqs)
        if gen.stream:
            if ex.status == 0:
                await ex.start_stream(200, STREAM_CONTENT_TYPE)
            await ex.end_stream(route.chunk(engine, nat, samples, sent, versions, True))
        else:
            await ex.respond(200, _JSON, route.whole(engine, nat, samples, versions))
        engine.rl.completed(run.version)
    except BaseException:
        run.decoded = max((s.decoded for s in seqs), default=0)
        raise
    finally:
        scheduler.drop(seqs)


def _upto(samples: list[Sample], k: int) -> list[Sample]:
    """The samples after ``k`` decode steps (unfinished ones: ``finish_reason`` "")."""
    return [
        s if len(s.tokens) <= k else s._replace(tokens=s.tokens[:k], logprobs=s.logprobs[:k], finish_reason="")
        for s in samples
    ]
