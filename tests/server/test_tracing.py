"""OpenTelemetry traces of the gateway (docs/operations.md, "End-to-end traces"),
exported to a real OTLP/HTTP receiver started in the test (otlp_receiver.py)."""

from __future__ import annotations

import re
import threading
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import trio
import trio.testing
from gateway_harness import open_gateway, open_sim
from otlp_receiver import Receiver, Span, open_receiver

BODY = {"model": "sim-base", "prompt": "hi", "max_tokens": 4}
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
SERVER, CLIENT = 2, 3  # OTLP SpanKind values


@pytest.fixture(autouse=True)
def quick_export(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Export within 20 ms of a span ending (the default waits 5 s); no OTEL_*
    # variable of the environment the tests run in may switch tracing on or off.
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED",
                 "OTEL_TRACES_EXPORTER", "OTEL_TRACES_SAMPLER", "OTEL_SERVICE_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    yield


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async with open_receiver() as r:
        yield r


def _one(spans: list[Span], name: str) -> Span:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def _traceparent_parent(value: str) -> tuple[str, str]:
    """(trace id, parent id) of a sampled W3C traceparent (flags: bit 0 sampled;
    bit 1 is Trace Context Level 2's random trace id, which the SDK sets)."""
    version, trace_id, parent_id, flags = value.split("-")
    assert version == "00" and int(flags, 16) & 1, value
    return trace_id, parent_id


def _export_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "trioforward-span-export")


async def test_one_request_is_a_server_span_in_the_clients_trace_with_its_attempt(
    fd_baseline: int, receiver: Receiver
) -> None:
    async with open_sim() as engine, open_gateway(engine.url, otlp_endpoint=receiver.url) as gw:
        async with httpx.AsyncClient() as client:
            response = await client.post(
                gw.url + "/v1/completions",
                json=BODY,
                headers={"traceparent": TRACEPARENT, "tracestate": "vendor=abc",
                         "x-request-id": "rollout-7", "x-rollout-group": "g1"},
            )
        assert response.status_code == 200
        with trio.fail_after(20):
            await receiver.wait_for(lambda spans: len(spans) >= 2)
    assert set(receiver.paths) == {"/v1/traces"}
    spans = receiver.spans
    server = _one(spans, "POST /v1/completions")
    attempt = _one(spans, "trioforward.attempt")
    # It got capacity at once: no queue span (one shows a wait: the test below).
    assert not receiver.named("trioforward.queue") and len(spans) == 2
    # The client's trace, the client's span as parent; the gateway's spans under it.
    assert {s.trace_id for s in spans} == {CLIENT_TRACE}
    assert server.parent_id == CLIENT_SPAN and server.kind == SERVER
    assert attempt.parent_id == server.span_id
    assert attempt.kind == CLIENT
    assert server.attributes["http.route"] == "/v1/completions"
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["trioforward.model"] == "sim-base"
    assert server.attributes["trioforward.attempts"] == 1
    assert server.attributes["trioforward.engine"] == engine.url
    # The request id (echoed beside Server-Timing) and the rollout group.
    assert response.headers["x-request-id"] == "rollout-7" and "server-timing" in response.headers
    assert server.attributes["trioforward.request_id"] == "rollout-7"
    assert server.attributes["trioforward.group"] == "g1"
    assert attempt.attributes["trioforward.engine_request_id"].startswith("rollout-7")
    assert attempt.attributes["trioforward.engine"] == engine.url
    assert attempt.attributes["trioforward.outcome"] == "answered"
    assert attempt.attributes["trioforward.phase"] == "read_body"
    # The engine was handed the gateway's attempt span as its parent.
    assert len(engine.stats.traceparents) == 1
    assert _traceparent_parent(engine.stats.traceparents[0]) == (CLIENT_TRACE, attempt.span_id)
    assert engine.stats.by_path["/v1/completions"] == 1
    resource = server.resource
    assert resource["service.name"] == "trioforward"
    assert resource["process.pid"] > 0 and resource["service.instance.id"]


async def test_a_retried_request_shows_two_attempts_with_their_phases(
    fd_baseline: int, receiver: Receiver
) -> None:
    async with open_sim() as engine, open_gateway(
        engine.url, otlp_endpoint=receiver.url, backoff_initial=0.0, service_name="gw-test"
    ) as gw:
        engine.faults.reject = 1  # one 503, then the answer (rejection_retries = 1)
        async with httpx.AsyncClient() as client:
            response = await client.post(gw.url + "/v1/completions", json=BODY)
        assert response.status_code == 200
        with trio.fail_after(20):
            await receiver.wait_for(lambda spans: len(spans) >= 3)
    assert engine.stats.rejected == 1 and engine.stats.by_path["/v1/completions"] == 2
    server = _one(receiver.spans, "POST /v1/completions")
    assert server.parent_id == ""  # no traceparent from the client: a trace of its own
    assert server.resource["service.name"] == "gw-test"
    assert server.attributes["trioforward.attempts"] == 2
    first, second = sorted(receiver.named("trioforward.attempt"), key=lambda s: s.attributes["trioforward.attempt"])
    assert first.attributes["trioforward.outcome"] == "retried"
    assert first.attributes["trioforward.retry_reason"] == "rejection_503"
    assert first.attributes["trioforward.phase"] == "await_headers"
    assert first.attributes["http.response.status_code"] == 503
    assert second.attributes["trioforward.outcome"] == "answered"
    assert first.end_ns <= second.start_ns
    assert {first.parent_id, second.parent_id} == {server.span_id}
    # Each engine attempt was told its own attempt span.
    parents = [_traceparent_parent(tp)[1] for tp in engine.stats.traceparents]
    assert parents == [first.span_id, second.span_id]


async def test_a_request_queued_behind_capacity_shows_its_queue_span(
    fd_baseline: int, receiver: Receiver
) -> None:
    async with open_sim(decode_ms_per_token=20) as engine, open_gateway(
        engine.url, otlp_endpoint=receiver.url, engine_capacity=1
    ) as gw, httpx.AsyncClient() as client:
        answers: list[int] = []

        async def post(max_tokens: int, traceparent: str) -> None:
            body = {**BODY, "max_tokens": max_tokens}
            response = await client.post(gw.url + "/v1/completions", json=body, headers={"traceparent": traceparent})
            answers.append(response.status_code)

        first_tp = f"00-{'1' * 32}-{'a' * 16}-01"
        second_tp = f"00-{'2' * 32}-{'b' * 16}-01"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, 20, first_tp)
            with trio.fail_after(10):
                await engine.stats.wait_for(lambda s: s.running == 1)
            nursery.start_soon(post, 2, second_tp)
            with trio.fail_after(10):
                while gw.state.client.statistics().queued < 1:
                    await trio.testing.wait_all_tasks_blocked()
                    await trio.lowlevel.checkpoint()
        assert answers == [200, 200]
        with trio.fail_after(20):
            await receiver.wait_for(lambda spans: len(receiver.named("trioforward.attempt")) == 2)
    (waited,) = receiver.named("trioforward.queue")
    first_attempt = next(s for s in receiver.named("trioforward.attempt") if s.trace_id == "1" * 32)
    second = next(s for s in receiver.named("POST /v1/completions") if s.trace_id == "2" * 32)
    # The second waited for the first's capacity: its queue span, under its server
    # span, ends after the first's attempt did; the first did not wait (no span).
    assert waited.trace_id == "2" * 32 and waited.parent_id == second.span_id
    assert waited.end_ns >= first_attempt.end_ns > waited.start_ns
    assert waited.attributes["trioforward.engine"] == engine.url
    assert engine.stats.peak_running == 1 and engine.stats.completed == 2


async def test_a_stream_and_a_gateway_error_are_spans_too(fd_baseline: int, receiver: Receiver) -> None:
    async with open_sim() as engine:
        gone = engine.url
    async with open_sim() as engine, open_gateway(
        engine.url, otlp_endpoint=receiver.url, connect_retries=0, health_interval=0
    ) as gw, httpx.AsyncClient() as client:
        async with client.stream("POST", gw.url + "/v1/completions", json={**BODY, "stream": True}) as stream:
            raw = await stream.aread()
        assert raw.endswith(b"data: [DONE]\n\n")
        with trio.fail_after(20):
            await receiver.wait_for(lambda spans: len(spans) >= 2)
        # The only engine gone: the gateway's own 502.
        await client.post(gw.url + "/admin/engines", json={"url": gone})
        await client.delete(gw.url + "/admin/engines", params={"url": engine.url})
        failed = await client.post(gw.url + "/v1/completions", json=BODY)
        assert failed.status_code == 502
        with trio.fail_after(20):
            await receiver.wait_for(lambda spans: len(receiver.named("POST /v1/completions")) == 2)
    streamed, errored = sorted(receiver.named("POST /v1/completions"), key=lambda s: s.start_ns)
    assert streamed.attributes["http.response.status_code"] == 200
    attempt = next(s for s in receiver.named("trioforward.attempt") if s.trace_id == streamed.trace_id)
    assert attempt.end_ns <= streamed.end_ns and attempt.attributes["trioforward.outcome"] == "answered"
    assert errored.attributes["http.response.status_code"] == 502
    assert errored.attributes["error.type"] == "engine_connect_failed"
    assert errored.status_code == 2  # STATUS_CODE_ERROR
    failed_attempt = next(s for s in receiver.named("trioforward.attempt") if s.trace_id == errored.trace_id)
    assert failed_attempt.attributes["trioforward.outcome"] == "failed"
    assert failed_attempt.attributes["trioforward.phase"] == "connect"
    # Admin changes are spans of their own.
    admin = [s for s in receiver.spans if s.attributes.get("trioforward.admin") == "engines"]
    assert sorted(s.name for s in admin) == ["DELETE /admin/engines", "POST /admin/engines"]
    assert {s.attributes["http.response.status_code"] for s in admin} == {200, 201}


async def test_a_dead_collector_leaves_requests_unaffected_and_drops_are_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A collector that accepts and never answers: the export thread is stuck in
    # its first export (timeout 30 s) while the queue of two spans overflows.
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "2")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "30")
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    held: list[trio.SocketStream] = []

    async def hold(stream: trio.SocketStream) -> None:
        held.append(stream)
        await trio.sleep_forever()

    async with trio.open_nursery() as collector:
        collector.start_soon(trio.serve_listeners, hold, listeners)
        dead = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        async with open_sim() as engine, open_gateway(engine.url, otlp_endpoint=dead) as gw:
            async with httpx.AsyncClient() as client:
                statuses = [(await client.post(gw.url + "/v1/completions", json=BODY)).status_code for _ in range(20)]
                metrics = (await client.get(gw.url + "/metrics")).text
            export = gw.state.tracing.export
            assert statuses == [200] * 20 and engine.stats.completed == 20
            # 20 requests x 2 spans: at most one batch (2) taken, 2 queued, the rest dropped.
            assert export.exported == 0
            assert export.dropped_full >= 40 - 4
            line = next(x for x in metrics.splitlines() if x.startswith('trioforward_trace_spans_dropped_total{reason="queue_full"}'))
            assert float(line.split()[-1]) >= 40 - 4
            collector.cancel_scope.cancel()  # the stuck export fails now, the thread can end


async def test_tracing_off_starts_no_exporter_and_passes_traceparent_through(fd_baseline: int) -> None:
    before = _export_threads()
    async with open_sim() as engine, open_gateway(engine.url) as gw:
        assert gw.state.tracing is None
        assert _export_threads() == before
        async with httpx.AsyncClient() as client:
            response = await client.post(gw.url + "/v1/completions", json=BODY, headers={"traceparent": TRACEPARENT})
        assert response.status_code == 200
        assert "server-timing" in response.headers
    assert engine.stats.traceparents == [TRACEPARENT]  # the client's own, untouched


async def test_tracing_is_on_with_the_standard_variable_too(
    monkeypatch: pytest.MonkeyPatch, receiver: Receiver
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    async with open_sim() as engine, open_gateway(engine.url, trace_sample_ratio=1.0) as gw:
        assert gw.state.tracing is not None
        async with httpx.AsyncClient() as client:
            await client.post(gw.url + "/v1/completions", json=BODY)
        with trio.fail_after(20):
            await receiver.wait_for(lambda spans: len(spans) >= 2)
    assert _one(receiver.spans, "POST /v1/completions").resource["service.name"] == "from-env"


async def test_sample_ratio_zero_exports_no_new_trace_but_follows_a_sampled_parent(
    receiver: Receiver,
) -> None:
    async with open_sim() as engine, open_gateway(
        engine.url, otlp_endpoint=receiver.url, trace_sample_ratio=0.0
    ) as gw, httpx.AsyncClient() as client:
        await client.post(gw.url + "/v1/completions", json=BODY)  # a new trace: not sampled
        await client.post(gw.url + "/v1/completions", json=BODY, headers={"traceparent": TRACEPARENT})
        with trio.fail_after(20):
            await receiver.wait_for(lambda spans: len(spans) >= 2)
        # A sampled parent is followed (parent-based sampling); the unsampled new
        # trace made no child span and sent the engine no context (none came).
        assert len(engine.stats.traceparents) == 1
        attempt = _one(receiver.spans, "trioforward.attempt")
        assert _traceparent_parent(engine.stats.traceparents[0]) == (CLIENT_TRACE, attempt.span_id)
    assert {s.trace_id for s in receiver.spans} == {CLIENT_TRACE}
    assert len(receiver.named("POST /v1/completions")) == 1


def test_the_resource_names_the_service_the_process_the_fleet_and_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trioforward._settings import Settings
    from trioforward.server.telemetry._tracing import WORKER_ENV, _resource

    monkeypatch.setenv(WORKER_ENV, "1")
    settings = Settings(state_url="redis://127.0.0.1:6379", fleet_name="rl-run", service_name="gw")
    attributes = _resource(settings).attributes
    assert attributes["service.name"] == "gw"
    assert attributes["trioforward.fleet"] == "rl-run" and attributes["trioforward.worker"] == 1
    assert attributes["process.pid"] > 0
    assert str(attributes["service.instance.id"]).endswith(f"-{attributes['process.pid']}")
    monkeypatch.delenv(WORKER_ENV)
    alone = _resource(Settings()).attributes
    assert alone["service.name"] == "trioforward"
    assert "trioforward.worker" not in alone and "trioforward.fleet" not in alone


@pytest.mark.parametrize(
    ("knobs", "words"),
    [
        ({"otlp_endpoint": "collector:4318"}, "http:// or https://"),
        ({"otlp_endpoint": "http://c:4318/v1/traces"}, "/v1/traces is added"),
        ({"trace_sample_ratio": 1.5}, "0..1"),
        ({"service_name": " "}, "must not be empty"),
    ],
)
def test_bad_tracing_settings_are_refused_with_a_clear_message(knobs: dict[str, object], words: str) -> None:
    from trioforward._settings import Settings, SettingsError

    with pytest.raises(SettingsError, match=re.escape(words)):
        Settings(**knobs)  # type: ignore[arg-type]


def test_the_standard_switches_turn_tracing_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from trioforward._settings import Settings
    from trioforward.server.telemetry._tracing import tracing_enabled

    on = Settings(otlp_endpoint="http://127.0.0.1:4318")
    assert tracing_enabled(on, {}) and not tracing_enabled(Settings(), {})
    assert tracing_enabled(Settings(), {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert not tracing_enabled(on, {"OTEL_SDK_DISABLED": "true"})
    assert not tracing_enabled(on, {"OTEL_TRACES_EXPORTER": "none"})
