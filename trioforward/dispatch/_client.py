"""The embedded client: ``async with trioforward.open_client(...) as client`` (docs/embedding.md).

The gateway server is a thin layer over this same object.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import orjson
import trio

from trioforward import Settings
from trioforward._background import open_background_nursery
from trioforward.codec import Completion
from trioforward.dispatch import _dialect_completions
from trioforward.dispatch._abort import AbortCounts, Aborts, aborted_response
from trioforward.dispatch._adapters import AdapterLoader, AdapterRegistry
from trioforward.dispatch._admin import Engines
from trioforward.dispatch._complete import Rendering, completion_body, completion_of, token_request
from trioforward.dispatch._continue import CONTINUABLE_PATH, ContinueCounts, ask_token_ids
from trioforward.dispatch._control import engine_models
from trioforward.dispatch._dialect import TokenRequest
from trioforward.dispatch._dispatch import Dispatcher
from trioforward.dispatch._engine_control import EngineControl
from trioforward.dispatch._engines import Engine, Registry
from trioforward.dispatch._forward_stream import ForwardStream
from trioforward.dispatch._gating import PauseGate
from trioforward.dispatch._health import health_loop
from trioforward.dispatch._identity import check_id
from trioforward.dispatch._kinds import detect_loop, kind_setting
from trioforward.dispatch._prefix import request_prefix_key
from trioforward.dispatch._replay import replaying_request, replaying_stream
from trioforward.dispatch._request import (
    HeaderInput,
    OnDispatch,
    Request,
    prepare_headers,
    strip_response_headers,
)
from trioforward.dispatch._routing import stable_hash
from trioforward.dispatch._tenants import Tenant, TenantTable
from trioforward.dispatch._tracing import Tracing, tracing_for
from trioforward.dispatch._types import ClientStatistics, ForwardResponse
from trioforward.dispatch._versions import VersionGate
from trioforward.dispatch._weights import WeightUpdates, version_label
from trioforward.errors import DispatchAborted, TrioforwardError
from trioforward.http import ConnectionPool, open_pool

__all__ = ["Client", "open_client"]

READMIT_MAX = 30.0  # s: longest back-off before an ejected engine is tried again (no probes)


class Client(PauseGate):
    """Forwards requests to engines under the rules of docs/dispatch.md. Create with :func:`open_client`."""

    def __init__(
        self,
        settings: Settings,
        pool: ConnectionPool,
        control_pool: ConnectionPool,
        nursery: trio.Nursery,
        tracing: Tracing | None = None,
    ) -> None:
        self.settings = settings
        self._tracing = tracing  # None: no spans (docs/operations.md, "End-to-end traces")
        self._pool = pool
        self._control_pool = control_pool
        self._nursery = nursery
        self._registry = Registry(
            settings.engine_capacity, settings.health_failures, settings.health_successes
        )
        self.adapters = AdapterRegistry(settings.adapters, settings.max_registered_adapters)
        self._loader = AdapterLoader(
            self.adapters,
            control_pool,
            settings.adapter_load_timeout,
            settings.max_loaded_adapters,
            nursery.start_soon,
        )
        self._dispatcher = Dispatcher(settings, self._registry, pool, self._loader)
        #: The tenant table (docs/dispatch.md, "Tenants and fair queueing").
        self.tenants = TenantTable(settings)
        self._paused_all = False
        self._kinds = dict(settings.engine_kinds)  # URL -> kind set by the operator
        control = EngineControl(
            control_pool,
            self.configured_kind,
            settings.engine_control_timeout,
            settings.dispatch_timeout,
            self._registry.by_url.get,
        )
        self.weights = WeightUpdates(self._registry, self._dispatcher, control)
        self.aborts = Aborts(control, settings.abort_grace)
        self.versions = VersionGate(
            self._registry,
            control,
            control_pool,
            lambda: self._dispatcher.weight_version,
            nursery.start_soon,
            settings.health_interval,
            settings.health_timeout,
        )
        self.weights.versions = self.versions
        self._registry.on_readmit = lambda e: self.versions.hold(e, "re-admitted after an ejection")
        self._session_routing = settings.routing in ("session", "prefix")
        self._prefix_routing = settings.routing == "prefix"
        self.engines = Engines(self._registry, self._engine_added)
        if settings.health_interval <= 0:
            # No probes to re-admit an ejected engine: an ejection must be temporary.
            self._registry.on_eject = self._readmit_later

    def _readmit_later(self, engine: Engine) -> None:
        """Re-admit ``engine`` on trial after a back-off (1 s, doubling per ejection
        in a row, at most :data:`READMIT_MAX`): probes are off, so nothing else would."""
        delay = min(READMIT_MAX, 2.0 ** (engine.ejections - 1))

        async def readmit() -> None:
            await trio.sleep(delay)
            self._registry.readmit(engine)

        self._nursery.start_soon(readmit)

    def configured_kind(self, url: str) -> str | None:
        """The kind the operator gave engine ``url`` (``engine_kinds``, else
        ``engine_kind``); ``None``: detected (docs/operations.md, "Engine kinds")."""
        kind = self._kinds.get(url)
        return kind if kind is not None else kind_setting(self.settings.engine_kind)

    def _engine_added(self, engine: Engine, kind: str | None = None) -> None:
        if kind is not None:
            self._kinds[engine.url] = kind
        if self._paused_all:
            self._registry.set_paused(engine, True)
        self.versions.hold(engine, "added")
        s = self.settings
        configured = self.configured_kind(engine.url)
        engine.kind = configured  # known at once when set; what it serves follows
        self._nursery.start_soon(detect_loop, self._control_pool, engine, configured, s.health_timeout)
        if s.health_interval > 0:
            self._nursery.start_soon(
                lambda: health_loop(
                    self._registry,
                    self._control_pool,
                    engine,
                    interval=s.health_interval,
                    probe_timeout=s.health_timeout,
                )
            )

    # -- forwarding ---------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        json: Any,
        content: bytes | None,
        headers: HeaderInput,
        session: str | None,
        session_implied: bool = False,
        request_id: str | None = None,
        group: str | None = None,
        tenant: str | Tenant | None = None,
    ) -> Request:
        if not path.startswith("/"):
            raise ValueError(f"path must start with '/': {path!r}")
        if content is None:
            content = b"" if json is None else orjson.dumps(json, option=orjson.OPT_SERIALIZE_NUMPY)
        pairs, said = prepare_headers(headers, json_body=bool(content))
        session_header = said.session
        # Identity: the keyword, else the header, else one the dispatcher makes.
        if request_id is None:
            request_id = said.request_id
        if request_id is not None:
            check_id(request_id, "request_id (X-Request-Id)")
        if group is None:
            group = said.group
        if group is not None:
            check_id(group, "group (X-Rollout-Group)")
        model: str | None = None
        is_adapter = False
        if self.adapters:
            # Only an adapter needs the model name: skip parsing when none is registered.
            if json is None and content:
                try:
                    json = orjson.loads(content)
                except orjson.JSONDecodeError:
                    json = None
            if isinstance(json, dict):
                name = json.get("model")
                if isinstance(name, str):
                    model = name
                    is_adapter = self.adapters.is_adapter(name)
        key = session if session is not None else session_header
        if session_implied and self._prefix_routing:
            key = None  # not the caller's own key: the prompt routes
        session_hash = stable_hash(key) if key is not None and self._session_routing else None
        if tenant is None:
            who = self.tenants.default
        else:
            who = tenant if isinstance(tenant, Tenant) else self.tenants.named(tenant)
        req = Request(
            method, path, pairs, content, model, is_adapter, session_hash, request_id or "", group,
            tenant=who,
        )
        if path == CONTINUABLE_PATH and method == "POST" and self._ids_understood():
            # Token ids make an aborted completion continuable (docs/operations.md).
            asked = ask_token_ids(content)
            if asked is not None:
                req.content, req.asked_ids = asked, True
        if self._prefix_routing and session_hash is None:
            req.prefix = request_prefix_key(json, content, self.settings.prefix_tokens)
        return req

    def _ids_understood(self) -> bool:
        """No engine is of kind ``openai`` (one that may refuse ``return_token_ids``)."""
        return all(e.kind != "openai" for e in self._registry.engines)

    async def post(
        self,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        headers: HeaderInput = None,
        session: str | None = None,
        session_implied: bool = False,
        on_dispatch: OnDispatch | None = None,
        request_id: str | None = None,
        group: str | None = None,
        tenant: str | Tenant | None = None,
    ) -> ForwardResponse:
        """Forward ``POST path`` to an engine and return its answer, whatever its status.

        ``json``: the parsed body (its ``"model"`` drives adapter loading);
        ``content``: the body bytes if already encoded (sent as is). ``headers``:
        forwarded, hop-by-hop ones dropped. ``session``: routing key (default: the
        ``X-Session-ID`` header). ``session_implied``: that key is implied by the
        API the request came through (a Tinker sample's sampling session and
        sequence id), not sent by a client: ``routing = "prefix"`` routes by the
        prompt instead (docs/dispatch.md, "Prefix routing"). Raises :class:`~trioforward.errors.TrioforwardError`
        subclasses for gateway-level failures (with ``.phase``, ``.attempts``,
        ``.engine``, ``.queue_time``, ``.engine_time``). Cancellation propagates
        at once; the upstream connection is closed so the engine aborts.
        ``on_dispatch(engine_url, attempt, queue_time_s)``, if given, is called as
        each attempt starts (synchronously; it must not raise): what a request
        that is cancelled reached. ``request_id`` (default: the ``X-Request-Id``
        header, else one the gateway makes; the answer's ``.request_id``) and
        ``group`` (the rollout group, default: the ``X-Rollout-Group`` header):
        printable ASCII without spaces, 1..128 characters, else ``ValueError``
        (docs/server.md, "Request ids and rollout groups").
        ``tenant``: the tenant it is served for (a
        name of the tenant table; ``None``: ``default_tenant``; docs/embedding.md,
        "Tenants"); ``ValueError`` for an unknown name, :class:`~trioforward.errors.TenantQueueFull`
        (429) beyond that tenant's ``max_outstanding``.
        """
        return await self.request(
            "POST",
            path,
            json=json,
            content=content,
            headers=headers,
            session=session,
            session_implied=session_implied,
            on_dispatch=on_dispatch,
            request_id=request_id,
            group=group,
            tenant=tenant,
        )

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        headers: HeaderInput = None,
        session: str | None = None,
        session_implied: bool = False,
        on_dispatch: OnDispatch | None = None,
        span: Any = None,
        request_id: str | None = None,
        group: str | None = None,
        only: Callable[[Engine], bool] | None = None,
        render: Callable[[Engine, str], tuple[str, bytes]] | None = None,
        tenant: str | Tenant | None = None,
    ) -> ForwardResponse:
        """As :meth:`post`, with any method (``GET /v1/models`` ...). ``span``: the
        caller's own OpenTelemetry span for this request (the gateway's server
        span), under which the dispatch spans go when the client traces; the
        caller ends it. ``only(engine)``: the engines it may go to (None: any);
        ``render(engine, engine_id) -> (path, body)``: each attempt's body (None:
        ``content`` as it is; docs/dispatch.md, "Engine dialects")."""
        req = self._request(
            method, path, json, content, headers, session, session_implied, request_id, group, tenant
        )
        req.on_dispatch = on_dispatch
        req.only, req.render = only, render
        return await self._answer(req, span)

    async def _answer(self, req: Request, span: Any = None) -> ForwardResponse:
        dispatcher = self._dispatcher
        aborts = self.aborts
        aborts.enter(req)  # an abort call finds it by id and group (_abort.py)
        try:
            if self._tracing is None:
                reply = await replaying_request(dispatcher, req)
            else:
                reply = await self._tracing.request(req, span, replaying_request(dispatcher, req))
        except DispatchAborted:
            if not req.aborted_by_call:
                raise
            return aborted_response(req, dispatcher.weight_version)
        finally:
            aborts.leave(req)
        return ForwardResponse(
            reply.status,
            strip_response_headers(reply.headers),
            reply.content,
            reply.engine.url,
            req.attempts,
            req.queue_time,
            req.engine_time,
            tuple(req.retries) if req.retries else (),
            version_label(req.weight_version, dispatcher.weight_version),
            req.request_id,
        )

    @asynccontextmanager
    async def stream(
        self,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        headers: HeaderInput = None,
        session: str | None = None,
        method: str = "POST",
        on_dispatch: OnDispatch | None = None,
        span: Any = None,
        request_id: str | None = None,
        group: str | None = None,
        only: Callable[[Engine], bool] | None = None,
        render: Callable[[Engine, str], tuple[str, bytes]] | None = None,
        tenant: str | Tenant | None = None,
    ) -> AsyncIterator[ForwardStream]:
        """``async with client.stream(path, json=...) as fs:`` — as :meth:`post`, but the
        body is read with ``fs.aiter_bytes()``. Engine capacity is held until the block
        exits; leaving before the end closes the upstream connection (the engine aborts).
        ``span`` and ``only`` as for :meth:`request`; the spans end when the block exits.
        """
        req = self._request(
            method, path, json, content, headers, session,
            request_id=request_id, group=group, tenant=tenant,
        )
        req.on_dispatch = on_dispatch
        req.only, req.render = only, render
        replies = replaying_stream(self._dispatcher, req)
        if self._tracing is not None:
            replies = self._tracing.stream(req, span, replies)
        aborts = self.aborts
        aborts.enter(req)
        try:
            try:
                async with replies as reply:
                    req.stream_body = reply.body  # an abort call may cut it (_abort.py)
                    yield ForwardStream(req, reply, self._dispatcher)
                    return
            except DispatchAborted:
                if not req.aborted_by_call or req.handed_over:
                    raise
            # Aborted by an abort call before its head: the whole stream is its end.
            yield ForwardStream(req, None)
        finally:
            aborts.leave(req)

    async def abort(
        self,
        *,
        group: str | None = None,
        request_ids: Sequence[str] | None = None,
        all: bool = False,
    ) -> AbortCounts:
        """Abort this client's requests of rollout ``group``, those named by
        ``request_ids``, or ``all`` of them (docs/operations.md, "Over-sampling:
        cancelling a round's stragglers"): queued ones never reach an engine;
        ones on an engine are aborted there; each caller gets a normal answer with
        what was generated so far and ``finish_reason: "abort"``, never replayed.
        Returns :class:`AbortCounts` (``queued``, ``on_engine``, ``finished``)
        once they are answered; unknown ids and groups count 0. Raises
        ``ValueError`` when none of the three is given, or ``all`` with another."""
        if all and (group is not None or request_ids is not None):
            raise ValueError("abort: 'all' aborts everything; give it alone")
        if not all and group is None and request_ids is None:
            raise ValueError("abort: give group, request_ids or all=True")
        if isinstance(request_ids, str):
            raise ValueError("abort: request_ids is a list of ids, not one string")
        return await self.aborts.abort(request_ids=request_ids, group=group, every=all)

    async def complete(
        self,
        *,
        model: str,
        prompt: Sequence[int] | Any,
        max_tokens: int,
        n: int = 1,
        temperature: float = 1.0,
        seed: int | None = None,
        logprobs: bool = True,
        stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        prompt_logprobs: int | None = None,
        session: str | None = None,
        request_id: str | None = None,
        group: str | None = None,
        tenant: str | None = None,
        **extra: Any,
    ) -> Completion:
        """Sample ``n`` completions of token-id ``prompt`` (:meth:`sample`: ``POST
        /v1/completions``, or the engine's own token route, docs/dispatch.md,
        "Engine dialects").

        Returns a :class:`~trioforward.codec.Completion`: each choice's ``tokens`` is
        ``np.ndarray[int32]`` ``(len,)``, ``logprobs`` ``np.ndarray[float32]`` (or
        ``None`` when ``logprobs=False``); ``prompt_logprobs`` (when asked) is
        ``float32`` ``(len(prompt),)`` with NaN at position 0. Raises
        :class:`~trioforward.errors.EngineRejected` (``.status``, ``.body``) for a
        non-2xx answer, :class:`~trioforward.codec.CodecError` (a ``ValueError``)
        for a 2xx body that is not a completion or has no ``token_ids``, the
        dispatch errors of :meth:`post`, and ``ValueError`` for ``stream`` or
        ``return_token_ids`` in ``extra``. ``request_id`` and ``group`` as for
        :meth:`post`; the completion's ``.request_id`` is the request's id.
        """
        args: dict[str, Any] = dict(
            model=model,
            prompt=prompt,
            max_tokens=max_tokens,
            n=n,
            temperature=temperature,
            seed=seed,
            logprobs=logprobs,
            stop=stop,
            stop_token_ids=stop_token_ids,
            prompt_logprobs=prompt_logprobs,
            extra=extra,
        )
        content = orjson.dumps(completion_body(**args), option=orjson.OPT_SERIALIZE_NUMPY)
        return await self.sample(
            token_request(**args),
            session=session,
            completions_body=content,
            request_id=request_id,
            group=group,
            tenant=tenant,
        )

    async def sample(
        self,
        request: TokenRequest,
        *,
        session: str | None = None,
        session_implied: bool = False,
        headers: HeaderInput = None,
        completions_body: bytes | None = None,
        request_id: str | None = None,
        group: str | None = None,
        tenant: str | Tenant | None = None,
    ) -> Completion:
        """Sample a token-level ``request`` on whichever engine routing picks, in
        that engine's dialect (docs/dispatch.md, "Engine dialects"): SGLang
        ``/generate``, vLLM ``/inference/v1/generate`` when served, else
        ``/v1/completions`` with ``return_token_ids`` (``completions_body``: that
        body already encoded, sent as is). Every attempt gets a fresh engine-side id.
        Returns and raises as :meth:`complete`; ``session``, ``session_implied``
        ``headers``, ``request_id``, ``group`` and ``tenant`` as for :meth:`post`. ``request.extra`` goes to
        ``/v1/completions`` engines only.
        """
        response, parse = await self.sample_response(
            request,
            session=session,
            session_implied=session_implied,
            headers=headers,
            completions_body=completions_body,
            request_id=request_id,
            group=group,
            tenant=tenant,
        )
        return completion_of(response, parse)

    async def sample_response(
        self,
        request: TokenRequest,
        *,
        session: str | None = None,
        session_implied: bool = False,
        headers: HeaderInput = None,
        completions_body: bytes | None = None,
        request_id: str | None = None,
        group: str | None = None,
        tenant: str | Tenant | None = None,
    ) -> tuple[ForwardResponse, Callable[[bytes, str | None], Completion]]:
        """As :meth:`sample`, but the engine's answer as it came, whatever its
        status, with the function that decodes a 2xx body of it (the dialect of
        the engine that answered; raises :class:`~trioforward.codec.CodecError`)."""
        request.adapter = self.adapters.is_adapter(request.model)
        if completions_body is None:
            completions_body = _dialect_completions.render(request, "")[1]
        rendering = Rendering(request, completions_body)
        json = {"model": request.model, "prompt": request.prompt}
        req = self._request(
            "POST",
            _dialect_completions.PATH,
            json,
            completions_body,
            headers,
            session,
            session_implied,
            request_id,
            group,
            tenant,
        )
        req.render = rendering
        return await self._answer(req), rendering.parse

    @property
    def continued(self) -> ContinueCounts:
        """What ``replay="continue"`` did so far (:class:`~trioforward.dispatch._continue.ContinueCounts`)."""
        return self._dispatcher.continued

    async def engine_models(self) -> list[dict[str, Any]]:
        """The engines' ``GET /v1/models`` entries (dicts with ``"id"``, in engine order).

        A control call: asked of every engine at once over the control pool,
        each within ``health_timeout`` — never behind engine capacity or a
        pause (docs/semantics.md, "Which path each engine call takes"). An
        engine that does not answer in time is left out; never raises for one.
        """
        return await engine_models(
            list(self._registry.engines), self._control_pool, self.settings.health_timeout
        )

    def new_request_id(self) -> str:
        """A fresh request id, unique to this process (what a request sent without
        one gets; docs/server.md, "Request ids and rollout groups")."""
        return self._dispatcher.ids.request_id()

    def retry_after_hint(self, error: TrioforwardError) -> int | None:
        """Seconds a client should wait before retrying after the gateway-made 429/503
        ``error`` (``None`` for other errors): what ``Retry-After`` says
        (docs/server.md, "Headers passed on"). Sets ``error.retry_after`` too."""
        return self._dispatcher._hinted(error).retry_after

    def begin_drain(self, cutoff: float, reason: str = "the gateway is shutting down") -> None:
        """End the QUEUED phase by ``cutoff`` (``trio.current_time()`` clock, s): a
        request still QUEUED then, or queued later, raises :class:`~trioforward.errors.ShuttingDown`
        (503, ``reason`` opens its message); one waiting for an engine while none can
        serve it (all ejected or removed) raises it at once. Dispatched requests are
        untouched (docs/embedding.md, "Closing the client"). An earlier cutoff wins."""
        self._dispatcher.drain.begin(cutoff, reason)

    # -- introspection ---------------------------------------------------------------

    def statistics(self) -> ClientStatistics:
        """A snapshot of the counters (O(engines) at most)."""
        d = self._dispatcher
        return ClientStatistics(
            requests_total=d.requests_total,
            in_flight=d.in_flight,
            queued=d.queued,
            retries=dict(d.retries),
            responses=dict(d.responses),
            adapter_loads=dict(self._loader.loads),
            adapter_unloads=dict(self._loader.unloads),
            adapters_loaded=self._loader.loaded(),
            adapters_registered=len(self.adapters.list()),
            pool=self._pool.statistics(),
            tenants={t.name: t.statistics() for t in self.tenants},
        )


@asynccontextmanager
async def open_client(
    engines: Iterable[str] | None = None,
    settings: Settings | None = None,
    *,
    tracer_provider: Any = "process",
    **knob_overrides: Any,
) -> AsyncIterator[Client]:
    """``async with open_client(engines=[...], settings=..., **knobs) as client:``

    ``engines`` (base URLs; one string is read as ``TRIOFORWARD_ENGINES`` is,
    comma-separated) replace ``settings.engines``; ``knob_overrides`` are
    any :class:`Settings` fields (validated; raises ``SettingsError``). On exit the
    health probes stop and idle connections close; a request still QUEUED in
    another task, or sent after the exit, raises :class:`~trioforward.errors.ShuttingDown`
    (``client.begin_drain(now)``; docs/embedding.md, "Closing the client"); a
    request already dispatched in another task runs on to its end.
    An exception raised in the block comes out as itself, not inside an
    ``ExceptionGroup`` (docs/embedding.md).

    ``tracer_provider``: an OpenTelemetry ``TracerProvider`` for the client's
    spans; ``None``: no spans; ``"process"`` (default): the process's, if one
    was set before this call, else no spans (docs/operations.md, "End-to-end traces").
    """
    settings = settings if settings is not None else Settings()
    if knob_overrides:
        settings = settings.replace(**knob_overrides)
    if engines is not None:
        settings = settings.replace(engines=engines if isinstance(engines, str) else tuple(engines))
    async with (
        open_pool(
            max_connections=settings.connections_per_engine,
            idle_expiry=settings.idle_expiry,
            connect_timeout=settings.connect_timeout,
        ) as pool,
        open_pool(
            max_connections=0,
            idle_expiry=settings.idle_expiry,
            # Each call bounds itself by its deadline (a health probe: health_timeout);
            # a pause or resume may wait for a busy engine to accept for as long as
            # engine_control_timeout (a vLLM API server busy with a batch took over 5 s
            # to accept one, and the weight update failed with 502).
            connect_timeout=max(settings.health_timeout, settings.engine_control_timeout),
        ) as control,
        open_background_nursery() as nursery,
    ):
        client = Client(settings, pool, control, nursery, tracing_for(tracer_provider))
        for url in settings.engines:
            client.engines.add(url)
        try:
            yield client
        finally:
            client.begin_drain(trio.current_time(), "the client was closed")
