"""Forwarding on the client: ``post``, ``request`` and ``stream`` (docs/embedding.md;
docs/dispatch.md).

:class:`Forwarding` is a base of :class:`~trioforward.dispatch.Client` (set up by
its ``__init__``): it turns a caller's method, path, body and headers into a
:class:`~trioforward.dispatch.attempts._request.Request` (identity, adapter, routing key,
tenant) and hands it to the dispatcher, with replay, tracing and abort calls
around it; the answer comes back as a
:class:`~trioforward.dispatch.attempts._types.ForwardResponse` or a
:class:`~trioforward.dispatch.client._forward_stream.ForwardStream`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypedDict

import orjson

from trioforward import Settings
from trioforward.dispatch.attempts._dispatch import Dispatcher
from trioforward.dispatch.attempts._identity import check_id
from trioforward.dispatch.attempts._request import (
    HeaderInput,
    OnDispatch,
    Request,
    prepare_headers,
    strip_response_headers,
)
from trioforward.dispatch.attempts._tracing import Tracing
from trioforward.dispatch.attempts._types import ForwardResponse
from trioforward.dispatch.client._forward_stream import ForwardStream
from trioforward.dispatch.dialects._events import CHAT, COMPLETIONS
from trioforward.dispatch.dialects._routes import VLLM, asks_token_strings
from trioforward.dispatch.engines._adapters import AdapterRegistry
from trioforward.dispatch.engines._engines import Engine, Registry
from trioforward.dispatch.engines._prefix import request_prefix_key
from trioforward.dispatch.engines._routing import stable_hash
from trioforward.dispatch.engines._tenants import Tenant, TenantTable
from trioforward.dispatch.rollout._abort import Aborts, aborted_response
from trioforward.dispatch.rollout._admission import Admission
from trioforward.dispatch.rollout._continue import ask_token_ids
from trioforward.dispatch.rollout._pause_args import version_label
from trioforward.dispatch.rollout._replay import replaying_request, replaying_stream
from trioforward.dispatch.rollout._staleness import WeightPolicy, ended_on, parse_policy
from trioforward.dispatch.rollout._weights import WeightUpdates
from trioforward.errors import DispatchAborted

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Forwarding", "Options"]


class Options(TypedDict, total=False):
    """The keyword options of ``post``, ``request`` and ``stream``, as
    :meth:`Forwarding.post` describes them."""

    json: Any
    content: bytes | None
    headers: HeaderInput
    session: str | None
    on_dispatch: OnDispatch | None
    request_id: str | None
    group: str | None
    tenant: str | Tenant | None
    weight_policy: str | WeightPolicy | None


class Forwarding:
    """The forwarding part of :class:`~trioforward.dispatch.Client` (set up by its ``__init__``)."""

    settings: Settings
    adapters: AdapterRegistry
    tenants: TenantTable
    aborts: Aborts
    admission: Admission
    weights: WeightUpdates
    _registry: Registry
    _dispatcher: Dispatcher
    _tracing: Tracing | None
    _session_routing: bool
    _prefix_routing: bool

    def _request(
        self, method: str, path: str, options: Options, session_implied: bool = False
    ) -> Request:
        """The :class:`Request` of a call: ``options`` as :meth:`post` takes them."""
        json, content = options.get("json"), options.get("content")
        request_id, group = options.get("request_id"), options.get("group")
        session, tenant = options.get("session"), options.get("tenant")
        if not path.startswith("/"):
            raise ValueError(f"path must start with '/': {path!r}")
        if content is None:
            content = b"" if json is None else orjson.dumps(json, option=orjson.OPT_SERIALIZE_NUMPY)
        pairs, said = prepare_headers(options.get("headers"), json_body=bool(content))
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
        req.on_dispatch = options.get("on_dispatch")
        # Chat: streams too (continued across an abort pause); the body read.
        chat = path == CHAT and isinstance(json, dict)
        if (path == COMPLETIONS or chat) and method == "POST" and self._ids_understood():
            # Token ids make an aborted completion or chat continuable (docs/operations.md).
            asked = ask_token_ids(content)
            if asked is not None:
                req.content, req.asked_ids = asked, True
        elif path == VLLM and method == "POST":
            # Its logprobs named "token_id:<id>" when asked (docs/server.md, "Token routes").
            req.token_strings = asks_token_strings(content)
        if self._prefix_routing and session_hash is None:
            req.prefix = request_prefix_key(json, content, self.settings.prefix_tokens)
        policy = options.get("weight_policy")
        if policy is None:
            policy = said.policy
        if policy is not None:
            # Which weights it accepts (docs/operations.md): ValueError when malformed.
            req.accepts = self.weights.version_order.accepts(
                policy if isinstance(policy, WeightPolicy) else parse_policy(policy)
            )
        return req

    def _ids_understood(self) -> bool:
        """No engine is of kind ``openai`` (one that may refuse ``return_token_ids``)."""
        return all(e.kind != "openai" for e in self._registry.engines)

    async def post(
        self, path: str, *, session_implied: bool = False, **options: Unpack[Options]
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
        (429) beyond that tenant's ``max_outstanding``. ``weight_policy``: the
        weights it accepts, ``"latest"``, ``"min_version=V"`` or
        ``"max_staleness=k"`` (default: the ``X-Weight-Policy`` header, else any;
        ``ValueError`` when malformed; docs/operations.md, "Which weights a
        request accepts").
        """
        return await self.request("POST", path, session_implied=session_implied, **options)

    async def request(
        self,
        method: str,
        path: str,
        *,
        session_implied: bool = False,
        span: Any = None,
        only: Callable[[Engine], bool] | None = None,
        render: Callable[[Engine, str], tuple[str, bytes]] | None = None,
        **options: Unpack[Options],
    ) -> ForwardResponse:
        """As :meth:`post`, with any method (``GET /v1/models`` ...). ``span``: the
        caller's own OpenTelemetry span for this request (the gateway's server
        span), under which the dispatch spans go when the client traces; the
        caller ends it. ``only(engine)``: the engines it may go to (None: any);
        ``render(engine, engine_id) -> (path, body)``: each attempt's body (None:
        ``content`` as it is; docs/dispatch.md, "Engine dialects")."""
        req = self._request(method, path, options, session_implied)
        req.only, req.render = only, render
        return await self._answer(req, span)

    async def _answer(self, req: Request, span: Any = None) -> ForwardResponse:
        dispatcher = self._dispatcher
        aborts = self.aborts
        aborts.enter(req)  # an abort call finds it by id and group (_abort.py)
        counted = False
        try:
            counted = self.admission.declared and await self.admission.admit(req)  # _admission.py
            if self._tracing is None:
                reply = await replaying_request(dispatcher, req)
            else:
                reply = await self._tracing.request(req, span, replaying_request(dispatcher, req))
        except DispatchAborted:
            if not req.aborted_by_call:
                raise
            return aborted_response(req, dispatcher.weight_version)
        finally:
            if counted:
                self.admission.leave(req)
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
            version_label(req.weight_version, ended_on(reply.engine, dispatcher.weight_version)),
            req.request_id,
            self.staleness(req),
            req.admission_time,
        )

    def staleness(self, req: Request) -> int | None:
        """Versions the weights ``req`` ended on are behind the current ones now
        (``None`` before any version was recorded)."""
        order = self.weights.version_order
        return None if order.current is None else order.behind(req.last_version)

    @asynccontextmanager
    async def stream(
        self,
        path: str,
        *,
        method: str = "POST",
        span: Any = None,
        only: Callable[[Engine], bool] | None = None,
        render: Callable[[Engine, str], tuple[str, bytes]] | None = None,
        **options: Unpack[Options],
    ) -> AsyncIterator[ForwardStream]:
        """``async with client.stream(path, json=...) as fs:`` — as :meth:`post`, but the
        body is read with ``fs.aiter_bytes()``. Engine capacity is held until the block
        exits; leaving before the end closes the upstream connection (the engine aborts).
        ``span`` and ``only`` as for :meth:`request`; the spans end when the block exits.
        """
        req = self._request(method, path, options)
        req.only, req.render = only, render
        replies = replaying_stream(self._dispatcher, req)
        if self._tracing is not None:
            replies = self._tracing.stream(req, span, replies)
        aborts = self.aborts
        aborts.enter(req)
        counted = False
        try:
            try:
                counted = self.admission.declared and await self.admission.admit(req)  # _admission.py
                async with replies as reply:
                    req.stream_body = reply.body  # an abort call may cut it (_abort.py)
                    yield ForwardStream(req, reply, self._dispatcher, self.staleness)
                    return
            except DispatchAborted:
                if not req.aborted_by_call or req.handed_over:
                    raise
            # Aborted by an abort call before its head: the whole stream is its end.
            yield ForwardStream(req, None)
        finally:
            if counted:
                self.admission.leave(req)
            aborts.leave(req)
