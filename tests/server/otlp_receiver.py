"""A real OTLP/HTTP receiver for the tests: ``POST /v1/traces`` with an
``ExportTraceServiceRequest`` (protobuf), decoded with the OpenTelemetry proto
package (https://opentelemetry.io/docs/specs/otlp/#otlphttp), on 127.0.0.1:0.

``receiver.spans``: every span received, as :class:`Span` (ids as hex);
``await receiver.wait_for(predicate)`` returns once ``predicate(spans)`` holds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import h11
import trio
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root span
    kind: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    status_code: int
    start_ns: int
    end_ns: int


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def _attrs(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


@dataclass
class Receiver:
    url: str  # the base URL (otlp_endpoint)
    spans: list[Span] = field(default_factory=list)
    posts: int = 0
    paths: list[str] = field(default_factory=list)
    _changed: trio.Event = field(default_factory=trio.Event)

    def add(self, path: str, body: bytes) -> None:
        self.posts += 1
        self.paths.append(path)
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for rs in request.resource_spans:
            resource = _attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    self.spans.append(
                        Span(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            kind=s.kind,
                            attributes=_attrs(s.attributes),
                            resource=resource,
                            status_code=s.status.code,
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                        )
                    )
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, predicate: Callable[[list[Span]], bool]) -> None:
        while not predicate(self.spans):
            await self._changed.wait()

    def named(self, name: str) -> list[Span]:
        return [s for s in self.spans if s.name == name]


async def _serve(stream: trio.SocketStream, receiver: Receiver) -> None:
    conn = h11.Connection(h11.SERVER)
    async with stream:
        while True:
            target, body = b"", b""
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    conn.receive_data(data)
                    continue
                if isinstance(event, h11.Request):
                    target = event.target
                elif isinstance(event, h11.Data):
                    body += bytes(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif isinstance(event, h11.ConnectionClosed):
                    return
            receiver.add(target.decode(), body)
            payload = ExportTraceServiceResponse().SerializeToString()
            head = h11.Response(
                status_code=200,
                headers=[(b"content-type", b"application/x-protobuf"), (b"content-length", b"%d" % len(payload))],
            )
            await stream.send_all(conn.send(head) + conn.send(h11.Data(data=payload)) + conn.send(h11.EndOfMessage()))
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()


@asynccontextmanager
async def open_receiver() -> AsyncIterator[Receiver]:
    """An OTLP/HTTP receiver listening on a free loopback port for the block."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    receiver = Receiver(f"http://127.0.0.1:{port}")
    async with trio.open_nursery() as nursery:

        async def handler(stream: trio.SocketStream) -> None:
            await _serve(stream, receiver)

        nursery.start_soon(trio.serve_listeners, handler, listeners)
        try:
            yield receiver
        finally:
            nursery.cancel_scope.cancel()
