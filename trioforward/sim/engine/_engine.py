"""The simulated engine: listener, routes and the capacity queue (docs/sim.md, "Engine model").

The timing model's sleeps (prefill, decode, stalls) are in ``_timing.py``; the
OpenAI generation routes, which run through the capacity queue, in
``_completions.py``.

Timing model (vLLM's scheduler, simplified): ``capacity`` requests run at once
(``max_num_seqs``; a FIFO ``trio.CapacityLimiter``), the rest wait in the
engine's own queue. A running request takes ``prefill_ms_per_token`` × prompt
tokens, then ``decode_ms_per_token`` per decode step (``n`` choices decode in
parallel, so steps = the longest choice). With both at 0 (and no stall) the
engine is *instant*: no sleep, no queue, no watcher task.

A *prefill stall* (:meth:`SimEngine.prefill_stall`) slows every running decode
by ``slowdown`` for a while, as a long prompt arriving on a busy engine does;
``slowdown=inf`` halts decoding (even instant decoding) until it ends, which
tests use to hold requests in flight deterministically.

With a *profile* (``profile``: a name in ``PROFILES`` or an
:class:`~trioforward.sim.physics._physics.EngineProfile`) the engine runs the engine
model instead (``_scheduler.py``): one step loop over every running sequence,
each step's time from the batch and its KV (``_physics.py``), a KV budget of
``kv_cache_tokens`` in blocks with preemption by recompute (``_kv.py``).

With a prefix cache (``prefix_cache_tokens`` > 0, see ``_prefix_cache``) the
prefill is charged only for the tokens after the longest cached prefix, as
vLLM's automatic prefix caching does; either way the engine counts the prompt
tokens it computed and those it found cached.
"""

from __future__ import annotations

import itertools
import logging
import math
import socket
import time
from collections import deque
from collections.abc import Collection, Mapping

import orjson
import trio

from trioforward._h11 import h11
from trioforward._listener import BurstListener
from trioforward.sim.core._adapters import NOT_FOUND_DETAIL, Adapters
from trioforward.sim.core._faults import GENERATION_PATHS, FaultError, Faults
from trioforward.sim.core._http import Exchange, reset_stream, serve_connection
from trioforward.sim.core._rl import RLControl
from trioforward.sim.core._stats import EngineStats
from trioforward.sim.physics._physics import PROFILES, EngineProfile
from trioforward.sim.physics._prefix_cache import DEFAULT_BLOCK_SIZE, PrefixCache
from trioforward.sim.physics._scheduler import Scheduler
from trioforward.sim.routes import _sglang_lora
from trioforward.sim.routes._completions import OpenAIGeneration, request_id_of
from trioforward.sim.routes._metrics import metrics_text, sglang_load
from trioforward.sim.routes._sglang_info import INFO_PATHS, serve_info
from trioforward.sim.routes._sglang_openai import error_body as sglang_error
from trioforward.sim.routes._token_routes import (
    CONTROL_PATHS,
    disabled_paths,
    serve_disabled,
    serve_token_route,
    token_paths,
)
from trioforward.sim.routes._tokenize import serve_tokenize
from trioforward.sim.routes._weight_push import PUSH_PATHS, serve_push

__all__ = ["SimEngine"]

log = logging.getLogger("trioforward.sim")

_JSON = b"application/json"
_PROMETHEUS = b"text/plain; version=0.0.4; charset=utf-8"  # prometheus_client's CONTENT_TYPE_LATEST
_VLLM_VERSION = b'{"version":"0.32.0"}'  # GET /version of the vLLM release modelled


class SimEngine(OpenAIGeneration):
    """One simulated vLLM engine. Create it with :func:`trioforward.sim.open_engine`.

    Attributes: ``url`` (``"http://HOST:PORT"``), ``host``, ``port``, ``stats``
    (:class:`EngineStats`), ``faults`` (:class:`Faults`), ``adapters``
    (:class:`Adapters`: ``.base``, ``.loaded``), ``capacity`` and the timing knobs
    (plain attributes, changeable at run time; ``capacity`` is fixed).
    """

    generation_paths = frozenset(GENERATION_PATHS)

    def __init__(
        self,
        nursery: trio.Nursery,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        capacity: int = 256,
        prefill_ms_per_token: float = 0.0,
        decode_ms_per_token: float = 0.0,
        models: Collection[str] = ("sim-base", "sim-base-2"),
        adapters: Mapping[str, str] | None = None,
        lora_modules: Mapping[str, str] | None = None,
        lazy_adapters: float | None = None,
        keep_alive: float | None = 5.0,
        runtime_lora: bool = True,
        unknown_model_status: int = 404,
        missing_paths: Collection[str] = (),
        adapter_load_seconds: float = 0.0,
        max_model_len: int | None = None,
        backlog: int = 4096,
        prefix_cache_tokens: int = 0,
        block_size: int = DEFAULT_BLOCK_SIZE,
        kind: str = "vllm",
        health_check_timeout: float = 20.0,
        scale_out: bool = False,
        profile: str | EngineProfile | None = None,
        kv_cache_tokens: int = 0,
        time_scale: float = 1.0,
        max_num_seqs: int | None = None,
    ) -> None:
        if max_num_seqs is not None:  # vLLM's name for ``capacity``
            capacity = max_num_seqs
        if capacity < 0:
            raise ValueError("capacity must be >= 0 (0 = unlimited)")
        if unknown_model_status not in (400, 404):
            raise ValueError("unknown_model_status must be 404 or 400")
        self._nursery = nursery
        self.host = host
        self.port = port
        self.capacity = capacity
        self.prefill_ms_per_token = prefill_ms_per_token
        self.decode_ms_per_token = decode_ms_per_token
        self.keep_alive = math.inf if keep_alive is None else keep_alive
        self.backlog = backlog
        self.max_model_len = max_model_len
        self.stats = EngineStats()
        # Scripted replies, one per next OpenAI generation (docs/sim.md, "Scripted replies").
        self.replies: deque[str] = deque()
        self.created = time.time()  # Unix time, vLLM's *_created gauges on /metrics
        if isinstance(profile, str):
            if profile not in PROFILES:
                raise ValueError(f"unknown profile {profile!r} (known: {', '.join(sorted(PROFILES))})")
            profile = PROFILES[profile]
        if kv_cache_tokens < 0 or time_scale <= 0:
            raise ValueError("kv_cache_tokens must be >= 0 and time_scale > 0")
        if kv_cache_tokens and profile is None:
            raise ValueError("kv_cache_tokens needs a profile (the engine model)")
        if kv_cache_tokens and prefix_cache_tokens:  # the cache lives in the KV budget
            prefix_cache_tokens = min(prefix_cache_tokens, kv_cache_tokens)
        self.prefix_cache = (
            PrefixCache(prefix_cache_tokens, block_size) if prefix_cache_tokens > 0 else None
        )
        self._accepting: trio.CancelScope | None = None
        self._faults_event = trio.Event()
        self.faults = Faults()
        self.faults.on_change(self._faults_changed)
        self.adapters = Adapters(
            self.stats,
            models,
            resolvable=adapters,
            lora_modules=lora_modules,
            lazy_seconds=lazy_adapters,
            missing_paths=missing_paths,
            runtime_lora=runtime_lora,
            missing_status=unknown_model_status,
            load_seconds=adapter_load_seconds,
            max_model_len=max_model_len,
        )
        self._limiter = trio.CapacityLimiter(capacity if capacity > 0 else math.inf)
        self._ids = itertools.count(1)
        self._stall_until = -math.inf
        self._stall_slowdown = 1.0
        self._stall_changed = trio.Event()
        self.rl = RLControl(kind, self.stats, self._wake_decoders)
        self.profile = profile
        self.scheduler: Scheduler | None = None
        if profile is not None:
            self.scheduler = Scheduler(
                profile,
                stats=self.stats,
                rl=self.rl,
                cache=self.prefix_cache,
                max_num_seqs=capacity,
                kv_cache_tokens=kv_cache_tokens,
                time_scale=time_scale,
                stall=self._stall_factor,
                changed=lambda: self._stall_changed,
            )
            nursery.start_soon(self.scheduler.run)
        self.push_paths = PUSH_PATHS.get(kind, frozenset())
        self.model_path: str | None = None  # the last weight push's (_weight_push.py)
        self.kind = kind
        # The token route: SGLang's /generate, or vLLM's /inference/v1/generate
        # (served only with --enable-scale-out, as vLLM 0.32).
        self.scale_out = scale_out
        self.token_paths = token_paths(kind, scale_out)
        self.disabled_token_paths = disabled_paths(kind, scale_out)
        self.generation_paths = frozenset({*GENERATION_PATHS, *self.token_paths}) - CONTROL_PATHS
        self.adapters.owned_by = {"sglang": "sglang", "openai": "openai"}.get(kind, "vllm")
        # SGLang's SGLANG_HEALTH_CHECK_TIMEOUT: how long /health waits while paused.
        self.health_check_timeout = health_check_timeout
        self._serving: trio.CancelScope | None = None
        self._stopped = trio.Event()

    # -- lifecycle -----------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def listening(self) -> bool:
        return self._serving is not None

    async def start_listening(self) -> None:
        """Bind ``host:port`` (SO_REUSEADDR; the port chosen at first start is kept) and serve.

        Raises ``OSError`` if the port is taken.
        """
        if self._serving is not None:
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(self.backlog)
        except BaseException:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        self._serving = trio.CancelScope()
        self._stopped = trio.Event()
        # Batched accepts: a burst of thousands of connects must not overflow
        # the accept queue (the "direct" baseline of bench/gateway_burst.py).
        await self._nursery.start(self._serve, BurstListener(sock), self._serving)

    async def stop_listening(self) -> None:
        """Close the listener and every connection (in-flight requests die with them).

        New connections are then refused (ECONNREFUSED) until :meth:`start_listening`.
        """
        if self._serving is None:
            return
        self._serving.cancel()
        await self._stopped.wait()

    async def outage(self, seconds: float) -> None:
        """Go down for ``seconds``: stop listening (connections die), then listen again on the same port."""
        await self.stop_listening()
        await trio.sleep(seconds)
        await self.start_listening()

    async def _serve(
        self,
        listener: BurstListener,
        scope: trio.CancelScope,
        task_status: trio.TaskStatus[None],
    ) -> None:
        try:
            with scope:
                async with listener, trio.open_nursery() as connections:
                    task_status.started()
                    await self._accept_loop(listener, connections)
        finally:
            self._serving = None
            self._stopped.set()

    async def _accept_loop(self, listener: BurstListener, connections: trio.Nursery) -> None:
        while True:
            while self.faults.pause_accept:
                await self._faults_event.wait()
            stream: trio.SocketStream | None = None
            # Cancelled when pause_accept is switched on, so a pause takes
            # effect for the very next connection (trio's accept is cancel-safe).
            with trio.CancelScope() as self._accepting:
                stream = await listener.accept()
            self._accepting = None
            if stream is None:
                continue
            if self.faults.refuse_connections:
                reset_stream(stream)
                self.stats.connections_reset += 1
                self.stats.faults["refuse_connections"] += 1
                self.stats.changed()
                continue
            connections.start_soon(self._connection, stream)

    def _faults_changed(self) -> None:
        self._faults_event.set()
        self._faults_event = trio.Event()
        if self.faults.pause_accept and self._accepting is not None:
            self._accepting.cancel()

    async def _connection(self, stream: trio.SocketStream) -> None:
        try:
            await serve_connection(self, stream, self._handle)
        except Exception:
            log.exception("simulated engine: connection failed")

    # -- routes --------------------------------------------------------------

    async def _handle(self, ex: Exchange, request: h11.Request, body: bytes) -> None:
        path, method = ex.path, request.method
        if ex.reject:
            return await self._reject(ex)
        if path in self.token_paths:
            return await serve_token_route(self, ex, method, request.headers, body)
        if path in self.disabled_token_paths:
            return await serve_disabled(ex, method)
        if path in self.generation_paths:
            if method != b"POST":
                return await ex.respond(405, _JSON, b'{"detail":"Method Not Allowed"}')
            return await self._generation(
                ex, path == "/v1/chat/completions", body, request_id_of(request)
            )
        if self.kind == "sglang":
            if path in INFO_PATHS and method == b"GET":
                return await ex.respond(*await serve_info(self, path))
            if path == "/load_lora_adapter" and method == b"POST":
                return await ex.respond(*await _sglang_lora.load(self.adapters, body))
            if path == "/unload_lora_adapter" and method == b"POST":
                return await ex.respond(*_sglang_lora.unload(self.adapters, body))
        if path == "/metrics" and method == b"GET" and self.kind != "sglang":
            return await ex.respond(200, _PROMETHEUS, metrics_text(self))
        if path == "/get_load" and method == b"GET" and self.kind == "sglang":
            return await ex.respond(200, _JSON, sglang_load(self))
        if path == "/health":
            return await ex.respond(self.faults.health_status, b"", b"")  # vLLM: no content type
        if path == "/version" and self.kind in ("vllm", "none"):
            return await ex.respond(200, _JSON, _VLLM_VERSION)
        if path == "/v1/models":
            return await ex.respond(200, _JSON, self.adapters.models_body(int(time.time())))
        if path == "/v1/load_lora_adapter" and method == b"POST" and self.kind != "sglang":
            return await ex.respond(*await self.adapters.load(body))
        if path == "/v1/unload_lora_adapter" and method == b"POST" and self.kind != "sglang":
            return await ex.respond(*self.adapters.unload(body))
        if path == "/tokenize" and method == b"POST" and self.kind != "sglang":
            status, answer = serve_tokenize(body, self.max_model_len)
            return await ex.respond(status, _JSON, answer)
        if path == "/reset_prefix_cache" and method == b"POST":
            if self.prefix_cache is not None:
                self.prefix_cache.clear()
            return await ex.respond(200, _JSON, b"")
        if path in self.push_paths:
            return await ex.respond(*await serve_push(self, path, method, body))
        if path in self.rl.paths:
            status, kind, answer = await self.rl.serve(path, method, request.target, body)
            return await ex.respond(status, kind, answer)
        if path == "/sim/stats":
            return await ex.respond(200, _JSON, orjson.dumps(self.stats.snapshot()))
        if path == "/sim/faults":
            return await self._set_faults(ex, method, body)
        return await ex.respond(404, _JSON, NOT_FOUND_DETAIL)

    async def _reject(self, ex: Exchange) -> None:
        # The ``reject`` fault: an overloaded engine answers before any work.
        faults = self.faults
        status = faults.reject_status
        extra = [] if faults.retry_after is None else [(b"retry-after", b"%g" % faults.retry_after)]
        overloaded = status == 503
        message = "The engine is overloaded; retry later." if overloaded else f"Injected {status}."
        kind = "ServiceUnavailableError" if overloaded else "InjectedError"
        error = {"error": {"message": message, "type": kind, "code": status}}
        if self.kind == "sglang":  # its HTTP exceptions' shape, on every route
            return await ex.respond(status, _JSON, sglang_error(status, message), extra)
        await ex.respond(status, _JSON, orjson.dumps(error), extra)

    async def _set_faults(self, ex: Exchange, method: bytes, body: bytes) -> None:
        if method == b"POST":
            try:
                changes = orjson.loads(body or b"{}")
                if not isinstance(changes, dict):
                    raise FaultError("body must be a JSON object")
                stall = changes.pop("prefill_stall", None)
                slowdown = changes.pop("prefill_stall_slowdown", math.inf)
                if changes.pop("end_stall", False):
                    self.end_stall()
                outage = changes.pop("outage", None)
                if outage is not None:
                    # runs beside this request, which the stop then cuts off
                    self._nursery.start_soon(self.outage, float(outage))
                if changes.pop("reset_stats", False):
                    self.stats.reset()
                self.faults.update(changes)
                if stall is not None:
                    self.prefill_stall(float(stall), float(slowdown or math.inf))
            except (orjson.JSONDecodeError, FaultError, TypeError, ValueError) as exc:
                msg = orjson.dumps(
                    {"error": {"message": str(exc), "type": "BadRequestError", "code": 400}}
                )
                return await ex.respond(400, _JSON, msg)
        await ex.respond(200, _JSON, orjson.dumps(self.faults.snapshot()))
