"""The embedded client's spans (docs/operations.md, "End-to-end traces"): with a
tracer provider, the same spans as the gateway's, under the trainer's own span."""

from __future__ import annotations

from collections.abc import Iterator

import opentelemetry.trace as otel
import pytest
import trio
import trio.testing
from dispatch_testing import COMPLETION, body, client_for
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from trioforward.dispatch import ForwardResponse
from trioforward.sim import open_engine


@pytest.fixture
def exported() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def parent_of(traceparent: str) -> int:
    return int(traceparent.split("-")[2], 16)


async def test_a_request_is_a_span_under_the_trainers_own(
    fd_baseline: int, exported: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = exported
    tracer = provider.get_tracer("trainer")
    async with open_engine() as engine, client_for(engine, tracer_provider=provider) as client:
        with tracer.start_as_current_span("rollout") as rollout:
            completion = await client.complete(model="sim-base", prompt=[1, 2, 3], max_tokens=4)
    assert len(completion.choices[0].tokens) == 4
    spans = exporter.get_finished_spans()
    (request,) = named(spans, "trioforward.request")
    (attempt,) = named(spans, "trioforward.attempt")
    assert not named(spans, "trioforward.queue")  # capacity at once: no wait to show
    assert request.parent is not None and request.parent.span_id == rollout.get_span_context().span_id
    assert attempt.parent.span_id == request.context.span_id  # type: ignore[union-attr]
    assert request.attributes["http.response.status_code"] == 200  # type: ignore[index]
    assert request.attributes["url.path"] == COMPLETION  # type: ignore[index]
    assert request.attributes["trioforward.attempts"] == 1  # type: ignore[index]
    assert request.attributes["trioforward.tenant"] == client.tenants.default.name  # type: ignore[index]
    assert attempt.attributes["trioforward.outcome"] == "answered"  # type: ignore[index]
    assert [parent_of(tp) for tp in engine.stats.traceparents] == [attempt.context.span_id]


async def test_the_processs_tracer_provider_is_used_when_set(
    fd_baseline: int,
    exported: tuple[TracerProvider, InMemorySpanExporter],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    provider, exporter = exported
    async with open_engine() as engine:
        async with client_for(engine) as client:  # no provider set: no spans, nothing sent
            assert client._tracing is None
            await client.post(COMPLETION, json=body())
        monkeypatch.setattr(otel, "get_tracer_provider", lambda: provider)
        async with client_for(engine) as client:
            await client.post(COMPLETION, json=body())
    assert len(named(exporter.get_finished_spans(), "trioforward.request")) == 1
    assert len(engine.stats.traceparents) == 1  # only the traced request carried one


async def test_an_adapter_load_is_a_span_between_two_attempts(
    fd_baseline: int, exported: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = exported
    async with (
        open_engine(adapter_load_seconds=0.05) as engine,
        client_for(engine, adapters={"lora-a": "/adapters/lora-a"}, tracer_provider=provider) as client,
    ):
        response = await client.post(COMPLETION, json=body(model="lora-a"))
    assert response.status == 200 and response.attempts == 2
    assert engine.stats.adapter_loads["lora-a"] == 1
    spans = exporter.get_finished_spans()
    (request,) = named(spans, "trioforward.request")
    (load,) = named(spans, "trioforward.adapter_load")
    first, second = sorted(named(spans, "trioforward.attempt"), key=lambda s: s.start_time or 0)
    assert request.attributes["trioforward.adapter"] == "lora-a"  # type: ignore[index]
    assert load.attributes["trioforward.adapter"] == "lora-a"  # type: ignore[index]
    assert load.parent.span_id == request.context.span_id  # type: ignore[union-attr]
    assert first.attributes["trioforward.retry_reason"] == "adapter_not_loaded"  # type: ignore[index]
    assert first.end_time <= load.start_time and load.end_time <= second.start_time  # type: ignore[operator]


async def test_a_replay_after_a_weight_update_is_a_span_over_the_second_run(
    fd_baseline: int,
    exported: tuple[TracerProvider, InMemorySpanExporter],
    autojump_clock: trio.testing.MockClock,
) -> None:
    provider, exporter = exported
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine, tracer_provider=provider) as client,
    ):
        results: list[ForwardResponse] = []

        async def one() -> None:
            results.append(await client.post(COMPLETION, json=body(max_tokens=10)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            await engine.stats.wait_for(lambda s: s.running == 1)
            await client.pause(engine_mode="abort", replay=True)
            while client.statistics().queued < 1:  # the replay waits for the resume
                await trio.testing.wait_all_tasks_blocked()
            await trio.sleep(5)  # the weight update (virtual time)
            await client.resume(weight_version="v2")
    assert [r.attempts for r in results] == [2]
    spans = exporter.get_finished_spans()
    (request,) = named(spans, "trioforward.request")
    (replay,) = named(spans, "trioforward.replay")
    first, second = sorted(named(spans, "trioforward.attempt"), key=lambda s: s.start_time or 0)
    assert replay.parent.span_id == request.context.span_id  # type: ignore[union-attr]
    assert first.parent.span_id == request.context.span_id  # type: ignore[union-attr]
    assert second.parent.span_id == replay.context.span_id  # type: ignore[union-attr]
    assert first.attributes["trioforward.outcome"] == "aborted"  # type: ignore[index]
    assert second.attributes["trioforward.outcome"] == "answered"  # type: ignore[index]
    assert request.attributes["trioforward.weight_version"] == "v2"  # type: ignore[index]
    # The second run waited in QUEUED (for resume) under the replay span.
    (queue,) = named(spans, "trioforward.queue")
    assert queue.parent.span_id == replay.context.span_id  # type: ignore[union-attr]
    assert queue.end_time - queue.start_time >= 5e9  # type: ignore[operator]


async def test_a_continuation_after_a_weight_update_is_a_span_with_its_own_attempt(
    fd_baseline: int,
    exported: tuple[TracerProvider, InMemorySpanExporter],
    autojump_clock: trio.testing.MockClock,
) -> None:
    provider, exporter = exported
    async with (
        open_engine(decode_ms_per_token=100) as engine,
        client_for(engine, tracer_provider=provider) as client,
    ):
        results: list[ForwardResponse] = []

        async def one() -> None:
            payload = body(prompt=[1, 2, 3], max_tokens=10, seed=3, return_token_ids=True)
            results.append(await client.post(COMPLETION, json=payload))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            await engine.stats.wait_for(lambda s: s.running == 1)
            await trio.sleep(0.45)  # four tokens decoded
            await client.pause(engine_mode="abort", replay="continue")
            await trio.sleep(5)  # the weight update
            await client.resume(weight_version="v2")
    assert [r.status for r in results] == [200]
    assert engine.stats.by_path[COMPLETION] == 2  # the first run and one continuation
    spans = exporter.get_finished_spans()
    (request,) = named(spans, "trioforward.request")
    (continuation,) = named(spans, "trioforward.continuation")
    first, second = sorted(named(spans, "trioforward.attempt"), key=lambda s: s.start_time or 0)
    assert continuation.parent.span_id == request.context.span_id  # type: ignore[union-attr]
    assert continuation.attributes["trioforward.continuation"] == 1  # type: ignore[index]
    assert continuation.attributes["trioforward.tokens_kept"] == 4  # type: ignore[index]
    assert first.parent.span_id == request.context.span_id  # type: ignore[union-attr]
    assert first.attributes["trioforward.outcome"] == "aborted"  # type: ignore[index]
    assert first.end_time <= continuation.start_time  # type: ignore[operator]
    assert second.parent.span_id == continuation.context.span_id  # type: ignore[union-attr]
    assert second.attributes["trioforward.outcome"] == "answered"  # type: ignore[index]
    (queue,) = named(spans, "trioforward.queue")  # the continuation waited for the resume
    assert queue.parent.span_id == continuation.context.span_id  # type: ignore[union-attr]
    assert [parent_of(tp) for tp in engine.stats.traceparents] == [first.context.span_id, second.context.span_id]


def test_an_attempt_names_its_span_as_parent_and_keeps_the_callers_tracestate() -> None:
    from types import SimpleNamespace

    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

    from trioforward.dispatch.attempts._request import Request
    from trioforward.dispatch.attempts._tracing import Tracing

    provider = TracerProvider()
    caller = SpanContext(
        trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
        span_id=0x00F067AA0BA902B7,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "abc")]),
    )
    server = provider.get_tracer("t").start_span("server", context=otel.set_span_in_context(NonRecordingSpan(caller)))
    sent = [(b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            (b"tracestate", b"vendor=abc"), (b"x-session-id", b"s1")]
    req = Request("POST", COMPLETION, sent, b"{}", None, False, None)
    trace = Tracing(provider).begin(req, server)
    assert trace is not None and req.trace is trace
    headers = trace.attempt(SimpleNamespace(url="http://127.0.0.1:1"), 1, req.headers)  # type: ignore[arg-type]
    names = [name for name, _ in headers]
    assert names.count(b"traceparent") == 1 and names.count(b"tracestate") == 1
    values = dict(headers)
    attempt_id = trace._attempt.get_span_context().span_id
    assert values[b"traceparent"] == b"00-4bf92f3577b34da6a3ce929d0e0e4736-%016x-01" % attempt_id
    assert values[b"tracestate"] == b"vendor=abc" and values[b"x-session-id"] == b"s1"
    assert req.headers == sent  # the request's own headers are left as they were
    provider.shutdown()
