"""The simulated engine's OpenAI generation routes, ``POST /v1/completions`` and
``/v1/chat/completions`` (docs/sim.md, "Engine model").

:class:`OpenAIGeneration` is a base of :class:`~trioforward.sim.SimEngine` (set
up by its ``__init__``): a request is parsed, its model resolved (or loaded
lazily), then answered at once by an instant engine, or else run under the RL
control (pause and abort) through the engine's capacity queue — a FIFO
``trio.CapacityLimiter`` of ``capacity`` slots — with the timing model's
prefill and decode sleeps (``_timing.py``).
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections import deque

import orjson
import trio

from trioforward._h11 import h11
from trioforward.sim.core._adapters import Adapters
from trioforward.sim.core._http import Exchange
from trioforward.sim.core._rl import Run, answer_aborted, decoded_estimate
from trioforward.sim.model._api import ApiError, Generation, complete_body, parse_generation
from trioforward.sim.model._stream import STREAM_CONTENT_TYPE, stream_steps
from trioforward.sim.physics._prefix_cache import cache_outputs, prefill_tokens
from trioforward.sim.physics._timing import TimingModel
from trioforward.sim.routes._sglang_openai import error_body as sglang_error
from trioforward.sim.routes._sglang_openai import served_model

__all__ = ["OpenAIGeneration", "request_id_of"]

_JSON = b"application/json"
_SSE = STREAM_CONTENT_TYPE


class OpenAIGeneration(TimingModel):
    """The OpenAI generation routes of :class:`~trioforward.sim.SimEngine`."""

    port: int
    kind: str
    max_model_len: int | None
    adapters: Adapters
    _nursery: trio.Nursery
    _ids: itertools.count[int]
    replies: deque[str]

    async def _generation(
        self, ex: Exchange, chat: bool, body: bytes, request_id: str | None
    ) -> None:
        stats = self.stats
        try:
            gen = parse_generation(chat, body, self.adapters.base[0], self.max_model_len)
            if self.kind == "sglang":  # base:adapter naming (sim/routes/_sglang_openai.py)
                gen.echo_model, gen.model = gen.model, served_model(self.adapters, gen.model)
        except ApiError as exc:
            if self.kind == "sglang":
                return await ex.respond(exc.status, _JSON, sglang_error(exc.status, exc.message))
            return await ex.respond(exc.status, _JSON, exc.body())
        if self.replies:
            gen.script = self.replies.popleft()
        stats.by_model[gen.model] += 1
        stats.prompts.append(gen.prompts[0])
        if gen.seed is not None:
            stats.by_seed[gen.seed] += 1
        if not self.adapters.serves(gen.model) and not self.adapters.resolve_now(gen.model):
            return await ex.respond(*self.adapters.unknown(gen.model, self._nursery.start_soon))
        # vLLM takes X-Request-Id as its request id ("cmpl-<id>", "chatcmpl-<id>"),
        # and its abort route names a completion prompt "<id>-<index>" (one prompt
        # here: "-0"; vllm/entrypoints/openai/completion/serving.py). SGLang's
        # OpenAI routes take the body's "rid" instead, no header, as the answer's id
        # and the id /abort_request names (else a uuid hex; openai/serving_base.py).
        if self.kind == "sglang":
            request_id = _body_rid(body)
        if request_id is not None:
            stats.request_ids.append(request_id)
            stats.changed()
        if self.kind == "sglang":
            rid = run_id = request_id if request_id is not None else uuid.uuid4().hex
        else:
            base = request_id if request_id is not None else f"{self.port}-{next(self._ids)}"
            rid = f"{'chatcmpl' if chat else 'cmpl'}-{base}"
            run_id = rid if chat else f"{rid}-0"
        created = int(time.time())
        if self.instant:
            stats.running += 1
            if stats.running > stats.peak_running:
                stats.peak_running = stats.running
            try:
                prefill_tokens(self.prefix_cache, self.stats, gen)
                samples = gen.samples()
                stats.tokens_decoded += sum(len(s.tokens) for s in samples)
                stats.sampled.append([list(s.tokens) for s in samples])
                cache_outputs(self.prefix_cache, gen, samples)
            finally:
                stats.running -= 1
            if gen.stream:
                await ex.start_stream(200, _SSE)
                await ex.end_stream(b"".join(stream_steps(gen, samples, rid, created)))
            else:
                await ex.respond(200, _JSON, complete_body(gen, samples, rid, created))
            self.rl.completed(self.rl.weight_version)
        else:
            timed = self._timed_generation if self.scheduler is None else self._stepped_generation
            await self.rl.generation(
                run_id,
                lambda run: timed(ex, gen, rid, created, run),
                lambda run: answer_aborted(ex, gen, rid, created, run, self.decode_ms_per_token),
            )

    async def _timed_generation(
        self, ex: Exchange, gen: Generation, rid: str, created: int, run: Run
    ) -> None:
        stats = self.stats
        await self._take_slot()
        try:
            stats.running += 1
            stats.peak_running = max(stats.peak_running, stats.running)
            stats.changed()
            samples = run.samples = gen.samples()
            await self._prefill(gen)
            run.decode_start = trio.current_time()
            if gen.stream:
                await ex.start_stream(200, _SSE)
                steps = list(stream_steps(gen, samples, rid, created))
                for i, step in enumerate(steps):
                    await self._decode(1)
                    run.decoded += 1
                    stats.tokens_decoded += sum(1 for s in samples if len(s.tokens) > i)
                    if i < len(steps) - 1:
                        await ex.send_chunk(step)
                cache_outputs(self.prefix_cache, gen, samples)
                await ex.end_stream(steps[-1])
            else:
                try:
                    await self._decode(max((len(s.tokens) for s in samples), default=0))
                except BaseException:
                    # Aborted or hung up mid-decode: count what the decode time made.
                    run.decoded = decoded_estimate(run, self.decode_ms_per_token, samples)
                    run.decode_start = None
                    stats.tokens_decoded += sum(min(run.decoded, len(s.tokens)) for s in samples)
                    raise
                stats.tokens_decoded += sum(len(s.tokens) for s in samples)
                cache_outputs(self.prefix_cache, gen, samples)
                run.answering = True  # an abort from here on finds it finished
                await ex.respond(200, _JSON, complete_body(gen, samples, rid, created))
            self.rl.completed(run.version)
        finally:
            stats.running -= 1
            stats.changed()
            self._limiter.release()


    async def _stepped_generation(
        self, ex: Exchange, gen: Generation, rid: str, created: int, run: Run
    ) -> None:
        """The engine model's generation: its sequences run in the scheduler's
        steps (``_scheduler.py``), which counts running, queued and decoded."""
        scheduler = self.scheduler
        assert scheduler is not None
        samples = run.samples = gen.samples()
        prompts = [gen.prompts[i // gen.n] for i in range(len(samples))]
        seqs = scheduler.submit(gen.model, prompts, [s.tokens for s in samples])
        try:
            if gen.stream:
                steps = list(stream_steps(gen, samples, rid, created))
                for i, step in enumerate(steps):
                    await scheduler.wait(seqs, i + 1)
                    run.decoded = i + 1
                    if i == 0:  # the first token is out: the stream starts
                        await ex.start_stream(200, _SSE)
                    if i < len(steps) - 1:
                        await ex.send_chunk(step)
                await ex.end_stream(steps[-1])
            else:
                await scheduler.wait(seqs)
                run.answering = True  # an abort from here on finds it finished
                await ex.respond(200, _JSON, complete_body(gen, samples, rid, created))
            self.rl.completed(run.version)
        except BaseException:
            # Aborted or hung up: what the steps made is what the answer carries.
            run.decoded = max((s.decoded for s in seqs), default=0)
            run.decode_start = None
            raise
        finally:
            scheduler.drop(seqs)


def _body_rid(body: bytes) -> str | None:
    """An SGLang OpenAI-route body's ``"rid"`` (a string), or ``None``."""
    rid = orjson.loads(body).get("rid")
    return rid if isinstance(rid, str) and rid else None


def request_id_of(request: h11.Request) -> str | None:
    """The request's ``X-Request-Id`` header (the last one), or ``None``."""
    found = None
    for name, value in request.headers:
        if name == b"x-request-id":
            found = value.decode("latin-1")
    return found
