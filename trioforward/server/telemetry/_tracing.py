"""The gateway's traces: its tracer provider, each request's server span, admin spans
(docs/operations.md, "End-to-end traces").

Off unless ``otlp_endpoint`` is set or the standard
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT`` variable
is (and ``OTEL_SDK_DISABLED`` is not ``true``, ``OTEL_TRACES_EXPORTER`` not
``none``). Off, no OpenTelemetry module is imported, ``GatewayState.tracing``
is ``None`` and the front's one test of it is the whole per-request cost.

On, the app owns one SDK ``TracerProvider`` (never the process-global one: an
application embedding the app keeps its own): its resource names the service
(``service_name``, else ``OTEL_SERVICE_NAME``, else ``trioforward``), this
process (``service.instance.id`` = host-pid, ``process.pid``), the fleet and,
under ``--workers N``, the worker's slot (``trioforward.worker``); its sampler is
parent-based with ``trace_sample_ratio`` for new traces (unset: the
``OTEL_TRACES_SAMPLER`` variables); its spans leave through
:class:`~._span_export.BoundedExport` to an OTLP/HTTP protobuf exporter.

Each request on the forwarding routes (OpenAI, token) gets a server span (``POST /v1/completions``)
whose parent is the client's W3C ``traceparent``/``tracestate``; the dispatch
core's spans (queue, attempts, adapter loads, replays) hang under it. Each
admin change (``POST``/``DELETE`` on ``/admin/*``: pause, resume, abort,
engines, adapters) is a span of its own.
"""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio

from trioforward import Settings, __version__

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from trioforward.server.front._asgi import Outcome
    from trioforward.server.telemetry._span_export import BoundedExport, OnDrop

__all__ = ["GatewayTracing", "open_tracing", "tracing_enabled", "install_admin_spans", "WORKER_ENV"]

# Set by the --workers N supervisor: the worker's slot (0..N-1), named in the resource.
WORKER_ENV = "TRIOFORWARD_WORKER_INDEX"
MISSING_EXTRA = (
    "tracing is on (otlp_endpoint or OTEL_EXPORTER_OTLP_*ENDPOINT) but OpenTelemetry "
    "is not installed: pip install 'trioforward[tracing]'"
)


def tracing_enabled(settings: Settings, env: Mapping[str, str] = os.environ) -> bool:
    """Whether the gateway exports spans (see the module docstring)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    if settings.otlp_endpoint is not None:
        return True
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


class GatewayTracing:
    """The app's tracer provider and the spans the server itself makes."""

    def __init__(self, provider: Any, export: BoundedExport) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.export = export
        self.tracer = provider.get_tracer("trioforward", __version__)
        self._propagator = TraceContextTextMapPropagator()
        self._api = trace

    def parent(self, get: Any) -> Any:
        """The context of the client's ``traceparent``/``tracestate`` (``get(name)``
        returns a header's text or ``None``), or ``None`` without one."""
        traceparent = get("traceparent")
        if not traceparent:
            return None
        carrier = {"traceparent": traceparent}
        tracestate = get("tracestate")
        if tracestate:
            carrier["tracestate"] = tracestate
        return self._propagator.extract(carrier)

    def request_span(self, method: str, path: str, headers: dict[bytes, bytes]) -> Any:
        """Start the server span of a request on ``path`` (headers: lower-case bytes names)."""

        def get(name: str) -> str | None:
            value = headers.get(name.encode())
            return None if value is None else value.decode("latin-1")

        return self.tracer.start_span(
            f"{method} {path}",
            context=self.parent(get),
            kind=self._api.SpanKind.SERVER,
            attributes={"http.request.method": method, "http.route": path},
        )

    def request_body(self, span: Any, data: dict[str, Any]) -> None:
        """Record what the request's JSON body says: its ``model`` and whether it streams."""
        model = data.get("model")
        facts: dict[str, Any] = {"trioforward.stream": data.get("stream") is True}
        if isinstance(model, str):
            facts["trioforward.model"] = model
        span.set_attributes(facts)

    def end_request(self, span: Any, log: Outcome) -> None:
        """End a request's server span with what the client got (``log``)."""
        status = log.status
        facts: dict[str, Any] = {"http.response.status_code": status}
        if log.request_id is not None:  # X-Request-Id (docs/server.md, "Request ids and rollout groups")
            facts["trioforward.request_id"] = log.request_id
        if log.group is not None:
            facts["trioforward.group"] = log.group
        if log.version is not None:
            facts["trioforward.weight_version"] = log.version
        error = log.error or ("client_closed" if status == 499 else None)
        if error is not None:
            facts["error.type"] = error
        span.set_attributes(facts)
        if error is not None or status >= 500:
            span.set_status(self._api.Status(self._api.StatusCode.ERROR, error or str(status)))
        span.end()


def _resource(settings: Settings) -> Any:
    from opentelemetry.sdk.resources import Resource

    host, pid = socket.gethostname(), os.getpid()
    attributes: dict[str, Any] = {
        "service.instance.id": f"{host}-{pid}",
        "service.version": __version__,
        "host.name": host,
        "process.pid": pid,
    }
    if settings.service_name is not None:
        attributes["service.name"] = settings.service_name
    if settings.state_url is not None:
        attributes["trioforward.fleet"] = settings.fleet_name
    worker = os.environ.get(WORKER_ENV)
    if worker is not None and worker.isdigit():
        attributes["trioforward.worker"] = int(worker)
    # Resource.create reads OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME beneath these.
    resource = Resource.create(attributes)
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "trioforward"}))
    return resource


def _provider(settings: Settings, on_drop: OnDrop) -> GatewayTracing:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError as exc:
        raise RuntimeError(MISSING_EXTRA) from exc
    from trioforward.server.telemetry._span_export import BoundedExport, batch_knobs

    ratio = settings.trace_sample_ratio
    sampler = None if ratio is None else ParentBased(TraceIdRatioBased(ratio))
    provider = TracerProvider(resource=_resource(settings), sampler=sampler)
    endpoint = settings.otlp_endpoint
    exporter = OTLPSpanExporter(
        endpoint=None if endpoint is None else endpoint.rstrip("/") + "/v1/traces"
    )
    max_queue, delay, batch = batch_knobs()
    export = BoundedExport(exporter, max_queue=max_queue, delay=delay, batch=batch, on_drop=on_drop)
    provider.add_span_processor(export)
    return GatewayTracing(provider, export)


@asynccontextmanager
async def open_tracing(settings: Settings, on_drop: OnDrop) -> AsyncIterator[GatewayTracing | None]:
    """The app's tracing for the block (``None`` when off). On exit the last
    spans are exported (bounded: ``_span_export.SHUTDOWN_WAIT``) off the event loop.
    Raises ``RuntimeError`` naming the extra when OpenTelemetry is missing."""
    if not tracing_enabled(settings):
        yield None
        return
    tracing = _provider(settings, on_drop)
    try:
        yield tracing
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(tracing.provider.shutdown)


def install_admin_spans(app: QuartTrio, tracing_of: Any) -> None:
    """A span for each admin change (non-GET ``/admin/*``), named ``METHOD PATH``,
    with ``trioforward.admin`` = the action (``pause``, ``resume``, ``abort``,
    ``engines``, ``adapters``) and the answer's status. ``tracing_of()``: the
    app's :class:`GatewayTracing` or ``None``."""
    from quart import Response, g, request

    @app.before_request
    async def _admin_span() -> None:
        tracing = tracing_of()
        if tracing is None or not request.path.startswith("/admin/") or request.method in ("GET", "HEAD"):
            return
        g.admin_span = tracing.tracer.start_span(
            f"{request.method} {request.path}",
            context=tracing.parent(request.headers.get),
            kind=tracing._api.SpanKind.SERVER,
            attributes={
                "http.request.method": request.method,
                "http.route": request.path,
                "trioforward.admin": request.path.removeprefix("/admin/").split("/")[0],
            },
        )

    @app.after_request
    async def _admin_span_status(response: Response) -> Response:
        span = g.get("admin_span")
        if span is not None:
            span.set_attribute("http.response.status_code", response.status_code)
            if response.status_code >= 500:
                tracing = tracing_of()
                if tracing is not None:
                    span.set_status(tracing._api.Status(tracing._api.StatusCode.ERROR))
        return response

    @app.teardown_request
    async def _admin_span_end(_: BaseException | None) -> None:
        span = g.pop("admin_span", None)
        if span is not None:
            span.end()
