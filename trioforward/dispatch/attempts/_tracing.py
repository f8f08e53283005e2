"""OpenTelemetry spans of one forwarded request (docs/operations.md, "End-to-end traces").

Off unless a tracer provider is given (the gateway's own, with ``otlp_endpoint``)
or the process has one (an embedding trainer's): then every request carries a
:class:`RequestTrace` in ``Request.trace``, and the dispatch core calls it at a
handful of points; otherwise ``Request.trace`` is ``None`` and each of those
points costs one attribute test. Nothing here imports OpenTelemetry until a
provider exists, so the core install needs no tracing package.

Spans (names and attributes are listed in docs/operations.md):

- ``trioforward.request`` — the request, made here for the embedded client; the
  gateway makes its own server span and hands it in (``span=``), and the spans
  below hang under it either way;
- ``trioforward.queue`` — QUEUED (engine capacity, a paused engine), made when
  it ends, with its start in the past; only for a request that waited;
- ``trioforward.attempt`` — one upstream attempt (kind CLIENT): the engine gets a
  W3C ``traceparent`` (and the caller's ``tracestate``) whose parent is this span;
- ``trioforward.adapter_load`` — waiting for a LoRA adapter to load after the
  engine did not know it;
- ``trioforward.replay`` — a request run again after an engine pause ended it;
  the spans of the second run hang under it;
- ``trioforward.continuation`` — one aborted choice sent again from its tokens so
  far (``replay="continue"``), with the spans of its own dispatch under it.

Times: OpenTelemetry's are wall-clock nanoseconds (``time.time_ns()``); the
dispatch core's are ``trio.current_time()`` seconds, converted at one instant.
"""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio

from trioforward import Phase

if TYPE_CHECKING:
    from trioforward.dispatch.attempts._outcome import Reply
    from trioforward.dispatch.attempts._request import Headers, Request
    from trioforward.dispatch.engines._engines import Engine

__all__ = [
    "Tracing",
    "RequestTrace",
    "process_tracing",
    "tracing_for",
    "SPAN_REQUEST",
    "SPAN_QUEUE",
    "SPAN_ATTEMPT",
    "SPAN_ADAPTER_LOAD",
    "SPAN_REPLAY",
    "SPAN_CONTINUATION",
    "TRACER_NAME",
]

TRACER_NAME = "trioforward"
SPAN_REQUEST = "trioforward.request"
SPAN_QUEUE = "trioforward.queue"
SPAN_ATTEMPT = "trioforward.attempt"
SPAN_ADAPTER_LOAD = "trioforward.adapter_load"
SPAN_REPLAY = "trioforward.replay"
SPAN_CONTINUATION = "trioforward.continuation"

# The W3C Trace Context fields (https://www.w3.org/TR/trace-context/): replaced on
# each attempt by the attempt span's own.
_TRACE_FIELDS = (b"traceparent", b"tracestate")


def tracing_for(provider: Any) -> Tracing | None:
    """The client's tracing for ``open_client(tracer_provider=...)``: ``"process"``
    -> :func:`process_tracing`; ``None`` -> none; else a ``TracerProvider``'s."""
    if isinstance(provider, str) and provider == "process":
        return process_tracing()
    return None if provider is None else Tracing(provider)


def process_tracing() -> Tracing | None:
    """A :class:`Tracing` over the process's tracer provider, if the process set
    one (``opentelemetry.trace.set_tracer_provider``) before this call; else
    ``None``. Never imports OpenTelemetry: a process that did not is not tracing."""
    api = sys.modules.get("opentelemetry.trace")
    if api is None:
        return None
    provider = api.get_tracer_provider()
    if isinstance(provider, (api.ProxyTracerProvider, api.NoOpTracerProvider)):
        return None  # the API's stand-ins: no SDK provider was set
    return Tracing(provider)


class Tracing:
    """The spans of one client, from ``provider`` (an OpenTelemetry ``TracerProvider``)."""

    def __init__(self, provider: Any) -> None:
        from opentelemetry import trace

        from trioforward import __version__

        self.tracer = provider.get_tracer(TRACER_NAME, __version__)
        self._api = trace

    def begin(self, req: Request, span: Any = None) -> RequestTrace | None:
        """Start tracing ``req`` (sets ``req.trace``): under ``span`` (the caller's
        own request span, which the caller ends), else in a ``trioforward.request``
        span of its own whose parent is the task's current span, if any.

        A request whose trace is not sampled gets no child spans at all (``None``;
        ``req.trace`` stays ``None``): none would be exported, and creating them
        cost about as much as a sampled request's. The engine then gets the
        caller's ``traceparent`` as it came, as with tracing off."""
        if span is None:
            span = self.tracer.start_span(SPAN_REQUEST, kind=self._api.SpanKind.INTERNAL)
            if not span.is_recording():
                return None
            span.set_attributes({"http.request.method": req.method, "url.path": req.url_path})
            owned = True
        elif not span.is_recording():
            return None
        else:
            owned = False
        trace = req.trace = RequestTrace(self, req, span, owned)
        return trace

    async def request(self, req: Request, span: Any, dispatch: Awaitable[Reply]) -> Reply:
        """``await dispatch`` (the whole answer of ``req``), traced."""
        trace = self.begin(req, span)
        if trace is None:
            return await dispatch
        try:
            reply = await dispatch
        except BaseException as exc:
            trace.finish(req, exc)
            raise
        trace.finish(req, None, reply.status)
        return reply

    @asynccontextmanager
    async def stream(
        self, req: Request, span: Any, dispatch: AbstractAsyncContextManager[Reply]
    ) -> AsyncIterator[Reply]:
        """``async with dispatch`` (the streamed answer of ``req``), traced until the block exits."""
        trace = self.begin(req, span)
        if trace is None:
            async with dispatch as reply:
                yield reply
            return
        status: int | None = None
        try:
            async with dispatch as reply:
                status = reply.status
                yield reply
        except BaseException as exc:
            trace.finish(req, exc, status)
            raise
        trace.finish(req, None, status)


class RequestTrace:
    """The spans of one request; every method is cheap and never raises into the
    dispatch core's path for a span's sake."""

    __slots__ = ("_tracing", "span", "owned", "_context", "_attempt", "_replay", "_replays")

    def __init__(self, tracing: Tracing, req: Request, span: Any, owned: bool) -> None:
        self._tracing = tracing
        self.owned = owned
        self.span = span
        identity: dict[str, Any] = {}
        if req.request_id:
            identity["trioforward.request_id"] = req.request_id
        if req.group is not None:
            identity["trioforward.group"] = req.group
        tenant = getattr(req, "tenant", None)
        if tenant is not None and tenant.name:
            identity["trioforward.tenant"] = tenant.name
        if identity:
            span.set_attributes(identity)
        if req.model is not None:
            span.set_attribute("trioforward.model", req.model)
            if req.is_adapter:
                span.set_attribute("trioforward.adapter", req.model)
        self._context = tracing._api.set_span_in_context(span)
        self._attempt: Any = None
        self._replay: Any = None
        self._replays = 0

    # -- QUEUED -------------------------------------------------------------------

    def queued(self, t0: float, end: float, engine: Engine | None, error: BaseException | None = None) -> None:
        """QUEUED from ``t0`` to ``end`` (``trio.current_time()`` s) is over: on
        ``engine`` (its capacity acquired), or ended by ``error``. A request that
        got capacity at once (``end == t0``: the clock was not even read) gets no
        queue span: there was no wait to show."""
        if end == t0 and error is None:
            return
        now_ns, now = time.time_ns(), trio.current_time()
        span = self._tracing.tracer.start_span(
            SPAN_QUEUE, context=self._context, start_time=now_ns - int((now - t0) * 1e9)
        )
        if engine is not None:
            span.set_attribute("trioforward.engine", engine.url)
        if error is not None:
            _failed(span, error)
        span.end(end_time=now_ns - int((now - end) * 1e9))

    # -- attempts -----------------------------------------------------------------

    def attempt(self, engine: Engine, number: int, headers: Headers, engine_id: str | None = None) -> Headers:
        """An attempt on ``engine`` starts (``number`` from 1; ``engine_id``: the
        request id it sends the engine): returns the headers
        to send, ``headers`` with the attempt span's ``traceparent`` (and the
        caller's ``tracestate``) in place of the caller's."""
        tracing = self._tracing
        api = tracing._api
        span = self._attempt = tracing.tracer.start_span(
            SPAN_ATTEMPT,
            context=self._context,
            kind=api.SpanKind.CLIENT,
            attributes={
                "trioforward.engine": engine.url,
                "trioforward.attempt": number,
                "trioforward.engine_request_id": engine_id or "",
            },
        )
        # W3C Trace Context §3.2 (version 00): trace id, parent id, flags, in hex.
        context = span.get_span_context()
        out = [h for h in headers if _name(h[0]) not in _TRACE_FIELDS]
        out.append(
            (b"traceparent", b"00-%032x-%016x-%02x" % (context.trace_id, context.span_id, context.trace_flags))
        )
        if context.trace_state:
            out.append((b"tracestate", context.trace_state.to_header().encode("latin-1")))
        return out

    def retried(self, phase: str, reason: str, status: int | None) -> None:
        """The current attempt failed in ``phase`` and is retried for ``reason``
        (``status``: the engine's, when it answered one)."""
        span = self._attempt
        if span is None:
            return
        self._attempt = None
        facts: dict[str, Any] = {
            "trioforward.phase": phase,
            "trioforward.outcome": "retried",
            "trioforward.retry_reason": reason,
        }
        if status is not None:
            facts["http.response.status_code"] = status
        span.set_attributes(facts)
        span.end()

    async def adapter_load(self, engine: Engine, adapter: str, load: Awaitable[None]) -> None:
        """``await load`` (waiting for ``adapter`` to load on ``engine``) in a
        ``trioforward.adapter_load`` span."""
        span = self._tracing.tracer.start_span(
            SPAN_ADAPTER_LOAD,
            context=self._context,
            attributes={"trioforward.engine": engine.url, "trioforward.adapter": adapter},
        )
        try:
            await load
        except BaseException as exc:
            _failed(span, exc)
            raise
        finally:
            span.end()

    def migrated(self, engine: str, reason: str, tokens: int) -> None:
        """``engine`` failed the request for ``reason`` after ``tokens`` tokens and it
        moves to another engine (docs/operations.md, "Migration"): a
        ``trioforward.migration`` event on the request's span; the segments after it
        are its continuations' spans, each attempt naming its engine."""
        attributes = {"trioforward.engine": engine, "trioforward.migration_reason": reason}
        self.span.add_event("trioforward.migration", {**attributes, "trioforward.tokens_kept": tokens})

    # -- replay -------------------------------------------------------------------

    def replay(self, reason: str | None) -> None:
        """An engine pause ended the request and it runs again: the spans of the
        new run hang under a ``trioforward.replay`` span, until the request ends."""
        self._close_attempt(None, None, reason or "replayed")
        if self._replay is not None:
            self._replay.end()
        self._replays += 1
        span = self._replay = self._tracing.tracer.start_span(
            SPAN_REPLAY,
            context=self._tracing._api.set_span_in_context(self.span),
            attributes={"trioforward.replay": self._replays, "trioforward.replay_reason": reason or ""},
        )
        self._context = self._tracing._api.set_span_in_context(span)

    async def continuation(self, sub: Request, number: int, tokens: int, dispatch: Awaitable[Reply]) -> Reply:
        """``await dispatch``: the continuation ``sub`` of this request (its
        ``number``-th for that choice, after ``tokens`` tokens kept), traced in a
        ``trioforward.continuation`` span of its own under this request's spans."""
        # The attempt whose answer the pause aborted ends here (the first continuation
        # of any of its choices), not when the joined answer is handed out.
        self._close_attempt(None, None, "continued")
        tracing = self._tracing
        span = tracing.tracer.start_span(
            SPAN_CONTINUATION,
            context=self._context,
            attributes={"trioforward.continuation": number, "trioforward.tokens_kept": tokens},
        )
        trace = sub.trace = RequestTrace(tracing, sub, span, True)
        try:
            reply = await dispatch
        except BaseException as exc:
            trace.finish(sub, exc)
            raise
        trace.finish(sub, None, reply.status)
        return reply

    # -- the end --------------------------------------------------------------------

    def finish(self, req: Request, error: BaseException | None, status: int | None = None) -> None:
        """The request is over: with the engine's ``status``, or ``error``. Ends
        the open attempt and replay spans, records the request's facts on the
        request span, and ends it when it is this trace's own."""
        # An answer was read whole or is being streamed: the last attempt reached
        # READ_BODY; a failure says its own phase (the pool records a cancelled one's).
        phase = Phase.READ_BODY if error is None else getattr(error, "phase", None) or req.phase
        self._close_attempt(phase, status, None, error)
        if self._replay is not None:
            self._replay.end()
            self._replay = None
        span = self.span
        facts: dict[str, Any] = {
            "trioforward.attempts": req.attempts,
            "trioforward.queue_time": req.queue_time,
            "trioforward.engine_time": req.engine_time_now(),
        }
        if req.engine is not None:
            facts["trioforward.engine"] = req.engine.url
        if req.weight_version is not None:
            facts["trioforward.weight_version"] = req.weight_version
        if req.retries:
            facts["trioforward.retries"] = [f"{p}:{r}" for p, r in req.retries]
        if self.owned and status is not None:
            facts["http.response.status_code"] = status
        span.set_attributes(facts)  # one lock, not one per attribute
        if self.owned:
            if status is not None:
                if status >= 500:
                    span.set_status(self._tracing._api.Status(self._tracing._api.StatusCode.ERROR))
            if error is not None:
                _failed(span, error)
            span.end()

    def _close_attempt(
        self,
        phase: Phase | None,
        status: int | None,
        reason: str | None,
        error: BaseException | None = None,
    ) -> None:
        span = self._attempt
        if span is None:
            return
        self._attempt = None
        facts: dict[str, Any] = {}
        if phase is not None:
            facts["trioforward.phase"] = phase.value
        if error is not None:
            facts["trioforward.outcome"] = "failed"
            _failed(span, error)
        elif reason is not None:
            facts["trioforward.outcome"] = "aborted"
            facts["trioforward.retry_reason"] = reason
        else:
            facts["trioforward.outcome"] = "answered"
            if status is not None:
                facts["http.response.status_code"] = status
        span.set_attributes(facts)
        span.end()


def _name(name: str | bytes) -> bytes:
    return (name if isinstance(name, bytes) else name.encode("latin-1")).lower()


def _failed(span: Any, error: BaseException) -> None:
    """Mark ``span`` as ended by ``error``: ``error.type`` is the gateway's error
    code (``queue_timeout``, ``engine_connect_failed`` ...) or the class name."""
    from opentelemetry.trace import Status, StatusCode

    code = getattr(error, "code", None)
    if isinstance(error, trio.Cancelled):
        code = "cancelled"
    span.set_attribute("error.type", code if isinstance(code, str) else type(error).__name__)
    span.set_status(Status(StatusCode.ERROR, str(error)[:200] or type(error).__name__))
