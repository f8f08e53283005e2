"""The simulated engine's weight-update endpoints: pause, resume, abort, weight version.

Two engine *kinds* serve them (``open_engine(kind=...)``, docs/sim.md):

``"vllm"`` — vLLM 0.32 started with ``VLLM_SERVER_DEV_MODE=1``
(``vllm/entrypoints/rl/online/api_router.py``):

- ``POST /pause?mode=abort|wait|keep`` (default ``abort``) → ``{"status": "paused"}``;
  another mode → 422 (FastAPI's query validation);
- ``POST /resume`` → ``{"status": "resumed"}``; ``GET /is_paused`` → ``{"is_paused": bool}``;
- ``POST /abort_requests {"request_ids": [...]}`` (empty or missing: every request)
  → ``{"status": "aborted", "aborted": n}``;
- ``POST /update_weight_version {"new_version": str}`` →
  ``{"success": true, "new_version": ...}``; ``GET /weight_info`` → ``{"weight_version": ...}``.

``"sglang"`` — SGLang's server (``http_server.py``; modes from
``io_struct.PauseGenerationReqInput``):

- ``POST /pause_generation {"mode": "abort"|"retract"|"in_place"}`` (default ``abort``) →
  ``{"message": "Generation paused successfully.", "status": "ok"}``;
- ``POST /continue_generation`` → ``{"message": "Generation continued successfully.", ...}``;
- ``POST /update_weight_version {"new_version", "abort_all_requests": true}`` (SGLang's
  default aborts every running request); the version is read on ``GET /model_info``
  (``_sglang_info.py``; ``/get_weight_version`` is gone from SGLang 0.5.21).

``"none"`` (a vLLM without dev mode) and ``"openai"`` (another OpenAI-compatible
server): none of these paths exist (404).

Semantics (both kinds): while paused, new generation requests are *held* (they
wait, unanswered, until resume). ``abort`` ends every running or queued
generation at once with ``finish_reason: "abort"`` (the tokens decoded so far;
a stream gets a last chunk saying so, then ``[DONE]``). ``keep`` / ``in_place``
/ ``retract`` *freeze* decoding: time passes, no token is produced, until resume.
``wait`` answers once running and queued generations have finished.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

import orjson
import trio

from trioforward.sim.core._http import Exchange
from trioforward.sim.core._stats import EngineStats
from trioforward.sim.model._api import Generation, complete_body, usage
from trioforward.sim.model._generate import render_token
from trioforward.sim.model._stream import STREAM_CONTENT_TYPE

__all__ = ["RLControl", "Run", "ENGINE_KINDS", "answer_aborted", "decoded_estimate"]

ENGINE_KINDS = ("vllm", "sglang", "none", "openai")
_FREEZE = frozenset({"keep", "in_place", "retract"})
_VLLM_PATHS = frozenset(
    {"/pause", "/resume", "/is_paused", "/abort_requests", "/update_weight_version", "/weight_info"}
)
_SGLANG_PATHS = frozenset(
    {"/pause_generation", "/continue_generation", "/update_weight_version"}
)

Answer = tuple[int, bytes, bytes]  # status, content type, body
_JSON = b"application/json"


def _json(status: int, data: Any) -> Answer:
    return status, _JSON, orjson.dumps(data)


class Run:
    """One generation in the engine (queued or running), abortable by a pause.

    ``scope`` is cancelled by an abort; ``aborted`` then says so. ``decoded``:
    decode steps done (streams count them; a whole answer estimates them from
    its decode time when aborted); ``version``: the weight version at its start.
    """

    __slots__ = ("rid", "scope", "aborted", "answering", "decoded", "decode_start", "version", "samples")

    def __init__(self, rid: str, version: str | None) -> None:
        self.rid = rid
        self.scope = trio.CancelScope()
        self.aborted = False
        # Decoded in full and being written out (a whole answer): an abort now
        # does nothing, as on vLLM, whose output for it is already made.
        self.answering = False
        self.decoded = 0
        self.decode_start: float | None = None
        self.version = version
        self.samples: list[Any] | None = None  # generated once, kept for an abort answer


class RLControl:
    """Pause state, running generations and weight version of one simulated engine."""

    def __init__(self, kind: str, stats: EngineStats, wake_decoders: Callable[[], None]) -> None:
        if kind not in ENGINE_KINDS:
            raise ValueError(f"kind must be one of {', '.join(ENGINE_KINDS)}, got {kind!r}")
        self.kind = kind
        self.paths = {"vllm": _VLLM_PATHS, "sglang": _SGLANG_PATHS}.get(kind, frozenset())
        self.stats = stats
        self.paused = False
        self.mode: str | None = None
        self.weight_version: str | None = None
        # Every generation in the engine, by a serial of its own (two requests may
        # carry one X-Request-Id: vLLM aborts both by it).
        self.runs: dict[int, Run] = {}
        self._serial = 0
        self._wake_decoders = wake_decoders
        self._resumed = trio.Event()
        self._unanswered = 0  # aborted generations whose abort answer is not written yet

    @property
    def frozen(self) -> bool:
        """True while a keep / in_place / retract pause halts decoding."""
        return self.mode in _FREEZE

    # -- generations -----------------------------------------------------------

    async def hold(self) -> None:
        """Wait (counted in ``stats.held``) while the engine is paused."""
        stats = self.stats
        while self.paused:
            stats.held += 1
            stats.changed()
            try:
                await self._resumed.wait()
            finally:
                stats.held -= 1
                stats.changed()

    async def generation(
        self,
        rid: str,
        work: Callable[[Run], Awaitable[None]],
        aborted: Callable[[Run], Awaitable[None]],
    ) -> None:
        """Run ``work`` (a timed generation) once not paused; if an abort ends it,
        answer with ``aborted`` (outside the cancelled scope)."""
        await self.hold()
        self._serial += 1
        serial = self._serial
        run = self.runs[serial] = Run(rid, self.weight_version)
        try:
            try:
                with run.scope:
                    await work(run)
            finally:
                del self.runs[serial]
            if run.aborted:
                await aborted(run)
        finally:
            # Given back however the run ends: an abort pause waits for this count.
            # A client hang-up (the disconnect watcher cancelling the exchange) in
            # the same tick as the abort makes the Cancelled leave ``run.scope``
            # (trio lets an outer cancellation through an inner cancelled scope),
            # skipping the abort answer; the count must still be given back.
            if run.aborted:
                self._unanswered -= 1
                self.stats.changed()

    def completed(self, version: str | None) -> None:
        """A generation that started under ``version`` was answered in full."""
        if version == self.weight_version:
            self.stats.completed_by_version[str(version)] += 1
        else:
            self.stats.completed_mixed += 1
        self.stats.changed()

    def abort(self, rids: list[str] | None = None) -> int:
        """End the named generations (all if ``None``) with ``finish_reason: "abort"``."""
        wanted = None if rids is None else set(rids)
        runs = [r for r in self.runs.values() if (wanted is None or r.rid in wanted) and not r.answering]
        for run in runs:
            if not run.aborted:
                run.aborted = True
                run.scope.cancel()
                self._unanswered += 1
                self.stats.pause_aborted += 1
        self.stats.changed()
        return len(runs)

    # -- pause / resume ----------------------------------------------------------

    async def pause(self, mode: str) -> None:
        self.paused = True
        self.mode = mode
        self.stats.pauses[mode] += 1
        self.stats.changed()
        if mode in _FREEZE:
            self._wake_decoders()
        elif mode == "abort":
            # Answers once the generations it ended have answered (their tokens so far).
            self.abort()
            await self.stats.wait_for(lambda s: self._unanswered == 0)
        elif mode == "wait":
            await self.stats.wait_for(lambda s: s.running == 0 and s.queued == 0)

    def resume(self) -> None:
        was_frozen = self.frozen
        self.paused = False
        self.mode = None
        self.stats.resumes += 1
        self.stats.changed()
        self._resumed.set()
        self._resumed = trio.Event()
        if was_frozen:
            self._wake_decoders()

    # -- routes --------------------------------------------------------------------

    async def serve(self, path: str, method: bytes, target: bytes, body: bytes) -> Answer:
        """Answer one request on :attr:`paths`."""
        try:
            data = orjson.loads(body) if body else {}
        except orjson.JSONDecodeError:
            return _json(400, {"detail": "Invalid JSON format"})
        if not isinstance(data, dict):
            return _json(400, {"detail": "Request body must be a JSON object"})
        if self.kind == "vllm":
            return await self._vllm(path, method, target, data)
        return await self._sglang(path, method, data)

    async def _vllm(self, path: str, method: bytes, target: bytes, data: dict[str, Any]) -> Answer:
        get = method == b"GET"
        if path == "/is_paused" and get:
            return _json(200, {"is_paused": self.paused})
        if path == "/weight_info" and get:
            return _json(200, {"weight_version": self.weight_version})
        if get:
            return _json(405, {"detail": "Method Not Allowed"})
        if path == "/pause":
            query = parse_qs(target.partition(b"?")[2].decode("latin-1"))
            mode = query.get("mode", ["abort"])[-1]
            if mode not in ("abort", "wait", "keep"):
                detail = [{"type": "literal_error", "loc": ["query", "mode"], "input": mode}]
                return _json(422, {"detail": detail})
            await self.pause(mode)
            return _json(200, {"status": "paused"})
        if path == "/resume":
            self.resume()
            return _json(200, {"status": "resumed"})
        if path == "/abort_requests":
            ids = data.get("request_ids")
            n = self.abort(list(ids) if ids else None)
            return _json(200, {"status": "aborted", "aborted": n})
        version = data.get("new_version")
        if not isinstance(version, str):
            return _json(422, {"detail": [{"type": "missing", "loc": ["body", "new_version"]}]})
        self.weight_version = version
        return _json(200, {"success": True, "new_version": version})

    async def _sglang(self, path: str, method: bytes, data: dict[str, Any]) -> Answer:
        if method != b"POST":
            return _json(405, {"detail": "Method Not Allowed"})
        if path == "/pause_generation":
            mode = data.get("mode", "abort")
            if mode not in ("abort", "retract", "in_place"):
                return _json(400, {"error": {"message": f"Invalid mode: {mode!r}."}})
            await self.pause(mode)
            return _json(200, {"message": "Generation paused successfully.", "status": "ok"})
        if path == "/continue_generation":
            self.resume()
            return _json(200, {"message": "Generation continued successfully.", "status": "ok"})
        version = data.get("new_version")
        if not isinstance(version, str):
            return _json(400, {"error": {"message": "new_version must be a string"}})
        if data.get("abort_all_requests", True):
            self.abort()
        self.weight_version = version
        message = f"Weight version updated to {version}"
        return _json(200, {"success": True, "message": message, "new_version": version})


async def answer_aborted(
    ex: Exchange, gen: Generation, rid: str, created: int, run: Run, decode_ms_per_token: float
) -> None:
    """vLLM 0.32's answer to an aborted generation: 200, ``finish_reason: "abort"``.

    A whole answer carries the tokens decoded so far (``token_ids`` with
    ``return_token_ids``, logprobs so far; estimated from its decode time). A
    stream (head sent or not) gets one last event per choice with no new token
    (``token_ids: []`` with ``return_token_ids``), the usage chunk with
    ``stream_options.include_usage``, then ``[DONE]``.
    """
    samples = run.samples if run.samples is not None else gen.samples()
    k = decoded_estimate(run, decode_ms_per_token, samples)
    cut = [
        s._replace(
            tokens=s.tokens[:k],
            logprobs=s.logprobs[:k],
            finish_reason="abort",
            stop_reason=None,
            text="".join(render_token(t) for t in s.tokens[:k]),
        )
        for s in samples
    ]
    if gen.stream:
        head = {
            "id": rid,
            "object": "chat.completion.chunk" if gen.chat else "text_completion",
            "created": created,
            "model": gen.echo_model or gen.model,
        }
        if ex.status == 0:
            await ex.start_stream(200, STREAM_CONTENT_TYPE)
        return await ex.end_stream(_aborted_chunks(head, gen, cut, k == 0))
    await ex.respond(200, _JSON, complete_body(gen, cut, rid, created))


def _aborted_chunks(head: dict[str, Any], gen: Generation, cut: list[Any], first: bool) -> bytes:
    out = []
    ids = gen.return_token_ids
    for index in range(len(cut)):
        choice: dict[str, Any] = {"index": index, "logprobs": None}
        if gen.chat:
            choice["delta"] = {}
        else:
            choice["text"] = ""
        choice["finish_reason"] = "abort"
        choice["stop_reason"] = None
        if not gen.chat:
            choice["prompt_token_ids"] = gen.prompts[index // gen.n] if ids and first else None
        choice["token_ids"] = [] if ids else None
        out.append(b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n")
    if gen.include_usage:
        use = usage(gen, cut, details=False)
        out.append(b"data: " + orjson.dumps({**head, "choices": [], "usage": use}) + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def decoded_estimate(run: Run, decode_ms_per_token: float, samples: list[Any]) -> int:
    """Decode steps an aborted generation made: counted (streams, or already
    estimated), else estimated from its decode time; below the longest sample."""
    longest = max((len(s.tokens) for s in samples), default=0)
    if run.decode_start is None or decode_ms_per_token <= 0:
        return min(run.decoded, max(0, longest - 1))
    steps = (trio.current_time() - run.decode_start) * 1000.0 / decode_ms_per_token
    return max(0, min(longest - 1, math.floor(steps)))
