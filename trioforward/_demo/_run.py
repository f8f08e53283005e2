"""The demo's script: fleet, gateway, clients, and the scenario timeline.

Timeline, as fractions of ``--duration`` (steady traffic runs throughout):

====== ==========================================================
0.15   ``POST /admin/pause {"engine_mode": "abort", "replay": "continue"}`` (weight update);
       ``POST /admin/resume {"weight_version": "step-1"}`` ~2 s later
0.35   one simulated engine stops (listener closed), 0.55 restarts
0.65   burst of ``--burst`` concurrent requests
1.00   steady traffic stops; in-flight requests finish; summary
====== ==========================================================
"""

from __future__ import annotations

import tempfile
import threading
from dataclasses import dataclass
from functools import partial
from typing import Any

import click
import httpx
import trio

from trioforward._demo._clients import (
    burst,
    import_sdks,
    openai_worker,
    tinker_worker,
    trainer_loop,
)
from trioforward._demo._fleet import SIM_CAPACITY, Fleet, open_fleet
from trioforward._demo._gateway import Gateway, serve_gateway, serve_workers
from trioforward._demo._tally import Tally, histogram_quantile, parse_histograms
from trioforward._settings import Settings

# The weight version the demo's weight update records (X-Weight-Version afterwards).
WEIGHT_VERSION = "step-1"

__all__ = ["Options", "Step", "run"]

OPENAI_THREADS = 3
TRAINER_LOOPS = 8


@dataclass(slots=True)
class Options:
    """The ``trioforward demo`` flags."""

    engines: int = 3
    duration: float = 40.0
    burst: int = 2000
    port: int = 0
    external: tuple[str, ...] = ()
    workers: int = 1


class Step:
    """What the progress bar shows: the current step and the counts so far."""

    def __init__(self) -> None:
        self.step = "starting"


async def run(opts: Options, tally: Tally, progress: Step) -> dict[str, Any]:
    """Run the whole demo; returns the report (see :func:`_report`). Never raises for a
    failed request: failures are counted in ``tally``."""
    with tempfile.TemporaryDirectory(prefix="trioforward-demo-") as adapter_root:
        async with open_fleet(opts.engines, opts.external, adapter_root) as fleet:
            settings = Settings(
                engines=tuple(fleet.urls),
                engine_capacity=SIM_CAPACITY if fleet.simulated else 256,
                # Health probes every second so a stopped engine is ejected, and a
                # restarted one re-admitted, within the demo's timeline.
                health_interval=1.0,
                health_timeout=1.0,
                adapter_root=adapter_root,
                access_log=False,
                log_level="warning",
                shutdown_grace=5.0,
            )
            if opts.workers > 1:
                progress.step = f"gateway starting: {opts.workers} workers and a private Valkey"
                with tempfile.TemporaryDirectory(prefix="trioforward-demo-gateway-") as workdir:
                    async with serve_workers(settings, opts.port, opts.workers, workdir) as gateway:
                        return await _drive(opts, fleet, gateway, tally, progress)
            progress.step = "gateway starting"
            async with serve_gateway(settings, opts.port) as gateway:
                return await _drive(opts, fleet, gateway, tally, progress)


async def _drive(opts: Options, fleet: Fleet, gateway: Gateway, tally: Tally, progress: Step) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(300.0)) as http:
        model = fleet.base_model if fleet.simulated else await _first_model(http, gateway.url)
        model_path = fleet.model_path if fleet.simulated else None
        stop_threads = threading.Event()
        stop_loops = trio.Event()
        tinker_errors: list[str] = []
        scenario: dict[str, Any] = {}
        progress.step = "importing the openai and tinker SDKs"
        await trio.to_thread.run_sync(import_sdks, abandon_on_cancel=True)
        t_start = tally.now()
        async with trio.open_nursery() as workers:
            # The SDKs are synchronous: each runs in a worker thread until stop_threads.
            # Abandoned on cancellation (Ctrl-C), so a stuck SDK call never blocks exit.
            in_thread = partial(trio.to_thread.run_sync, abandon_on_cancel=True)
            for i in range(OPENAI_THREADS):
                workers.start_soon(partial(in_thread, openai_worker, gateway.url, model, tally, stop_threads, i))
            workers.start_soon(
                partial(in_thread, tinker_worker, gateway.url, model, model_path, tally, stop_threads, tinker_errors)
            )
            for i in range(TRAINER_LOOPS):
                workers.start_soon(trainer_loop, http, gateway.url, model, tally, stop_loops, i)
            try:
                await _scenario(opts, fleet, gateway, http, model, tally, progress, scenario, t_start)
            finally:
                progress.step = "finishing in-flight requests"
                stop_loops.set()
                stop_threads.set()
        duration = tally.now() - t_start
        progress.step = "collecting statistics"
        metrics = await http.get(gateway.url + "/metrics")
        if gateway.workers > 1:
            scenario["fleet"] = await _fleet_view(http, gateway)
        return _report(opts, fleet, gateway, tally, scenario, metrics, duration, tinker_errors)


async def _fleet_view(http: httpx.AsyncClient, gateway: Gateway) -> dict[str, Any]:
    """The gateway's fleet as one worker sees it (docs/fleet.md, "Control plane"):
    its members (pid) and, per engine, each member's share of its capacity."""
    response = await http.get(gateway.url + "/admin/engines")
    fleet = (response.json().get("fleet") or {}) if response.status_code == 200 else {}
    members = fleet.get("members", {})
    return {
        "workers": gateway.workers,
        "members": len(members),
        "pids": sorted(m["pid"] for m in members.values()),
        "shares": {url: [m["share"].get(url, 0) for _, m in sorted(members.items())] for url in fleet.get("engines", {})},
        "state": fleet.get("state"),
    }


def _counts(gateway: Gateway, metrics: httpx.Response) -> tuple[dict[tuple[str, str], int], int]:
    """Retries by (phase, reason) and adapter loads: from the in-process gateway's
    statistics, or, under ``--workers N``, from ``/metrics`` (the box's sum)."""
    if gateway.client is not None:
        stats = gateway.client.statistics()
        return dict(stats.retries), sum(stats.adapter_loads.values())
    from prometheus_client.parser import text_string_to_metric_families

    retries: dict[tuple[str, str], int] = {}
    loads = 0
    if metrics.status_code == 200:
        for family in text_string_to_metric_families(metrics.text):
            for sample in family.samples:
                if sample.name == "trioforward_retries_total" and sample.value:
                    retries[(sample.labels["phase"], sample.labels["reason"])] = int(sample.value)
                elif sample.name == "trioforward_adapter_loads_total":
                    loads += int(sample.value)
    return retries, loads


async def _first_model(http: httpx.AsyncClient, url: str) -> str:
    """The first model the engines serve; a clear error when none answers."""
    response = await http.get(url + "/v1/models")
    data = response.json().get("data") if response.status_code == 200 else None
    if not data:
        engines = (await http.get(url + "/admin/engines")).json().get("engines", [])
        urls = ", ".join(e["url"] for e in engines) or "none"
        raise click.ClickException(
            f"no engine listed a model on GET /v1/models (engines: {urls}); "
            "check that each --engine URL is a running vLLM/SGLang server"
        )
    model: str = data[0]["id"]
    return model


async def _scenario(
    opts: Options,
    fleet: Fleet,
    gateway: Gateway,
    http: httpx.AsyncClient,
    model: str,
    tally: Tally,
    progress: Step,
    out: dict[str, Any],
    t0: float,
) -> None:
    """Pause/resume, engine stop/restart and the burst, at fixed fractions of the run."""
    d = opts.duration

    async def until(fraction: float) -> None:
        await trio.sleep(max(0.0, t0 + fraction * d - tally.now()))

    progress.step = "steady traffic"
    await until(0.15)
    progress.step = "weight update: gateway paused"
    out["pause"] = await _pause_resume(http, gateway.url, tally, fleet, hold=min(2.0, 0.08 * d))
    progress.step = "steady traffic"
    if fleet.simulated and len(fleet.engines) > 1:
        await until(0.35)
        out["engine_restart"] = await _kill_restart(fleet, http, gateway.url, tally, progress, until, t0)
    await until(0.65)
    progress.step = f"burst of {opts.burst} concurrent requests"
    burst_start = tally.now()
    await burst(gateway.url, model, opts.burst, tally)
    out["burst"] = {"requests": opts.burst, "seconds": round(tally.now() - burst_start, 2)}
    progress.step = "steady traffic"
    await until(1.0)
    if "engine_restart" in out:
        restart = out["engine_restart"]
        victim = fleet.urls.index(restart["engine"])
        restart["completed_after_restart"] = fleet.requests_completed()[victim] - restart.pop("_completed_at_restart")


async def _kill_restart(
    fleet: Fleet, http: httpx.AsyncClient, url: str, tally: Tally, progress: Step, until: Any, t0: float
) -> dict[str, Any]:
    """Drain one engine, kill it, bring it back into rotation while it is still down,
    then restart it.

    The drain (``POST /admin/pause`` for that engine, ``mode=wait``) lets the
    requests running on it finish: a request an engine dies in the middle of is
    never retried (the engine may have run it), so killing it undrained would
    fail those requests by design. Resuming it while it is down is the
    interesting part: requests the gateway routes there are refused at connect
    and retried on the other engines, until health probes eject it.
    """
    victim = len(fleet.engines) - 1
    engine = fleet.urls[victim]
    progress.step = f"engine {victim}: draining"
    start = tally.now()
    response = await http.post(url + "/admin/pause", json={"engines": [engine], "mode": "wait"})
    tally.record("admin", start, response.status_code == 200, f"drain: HTTP {response.status_code} {response.text[:200]}")
    progress.step = f"engine {victim}: killed"
    stopped_at = tally.now()
    try:
        await fleet.stop(victim)
    finally:
        with trio.CancelScope(shield=True):
            start = tally.now()
            response = await http.post(url + "/admin/resume", json={"engines": [engine]})
    tally.record("admin", start, response.status_code == 200, f"resume: HTTP {response.status_code} {response.text[:200]}")
    await until(0.55)
    await fleet.start(victim)
    progress.step = f"engine {victim}: restarted"
    return {
        "engine": engine,
        "stopped_at": round(stopped_at - t0, 1),
        "restarted_at": round(tally.now() - t0, 1),
        "_completed_at_restart": fleet.requests_completed()[victim],
    }


async def _pause_resume(
    http: httpx.AsyncClient, url: str, tally: Tally, fleet: Fleet, hold: float
) -> dict[str, Any]:
    """A weight update: pause the engines (abort, continued after resume), hold, resume
    with a new weight version; report whether requests sent meanwhile waited, what
    the engines ended and the gateway replayed (docs/operations.md)."""
    start = tally.now()
    body = {"engine_mode": "abort", "replay": "continue"}
    response = await http.post(url + "/admin/pause", json=body)
    tally.record("admin", start, response.status_code == 200, f"pause: HTTP {response.status_code} {response.text[:200]}")
    pauses = response.json().get("engine_pauses", {}) if response.status_code == 200 else {}
    ended = sum(e.stats.pause_aborted for e in fleet.engines)  # simulated engines only
    paused_at = tally.now()
    try:
        await trio.sleep(hold)
    finally:
        # Even when interrupted: a gateway left paused would hold every request forever.
        with trio.CancelScope(shield=True):
            resumed_at = tally.now()
            response = await http.post(url + "/admin/resume", json={"weight_version": WEIGHT_VERSION})
    tally.record("admin", resumed_at, response.status_code == 200, f"resume: HTTP {response.status_code} {response.text[:200]}")
    # Wait for the requests sent during the pause to come back before judging.
    await trio.sleep(min(2.0, hold))
    spans = [s for s in tally.spans_overlapping(start, resumed_at) if s[0] != "admin"]
    # Sent after the pause was asked for and still outstanding at resume: they waited.
    waited = [s for s in spans if s[2] >= resumed_at]
    # Sent after the pause took effect, yet done before resume: dispatch was not held.
    early = [s for s in spans if s[1] >= paused_at and s[2] < resumed_at and s[3]]
    return {
        "held_seconds": round(resumed_at - paused_at, 2),
        "waited": len(waited),
        "longest_wait_seconds": round(max((s[2] - s[1] for s in waited), default=0.0), 2),
        "completed_before_resume": len(early),  # must be 0: nothing is dispatched while paused
        "held": not early,
        "engine_kinds": sorted({p["kind"] for p in pauses.values()}),
        "ended_by_engines": ended if fleet.simulated else None,
        "weight_version": response.json().get("weight_version") if response.status_code == 200 else None,
    }


def _report(
    opts: Options,
    fleet: Fleet,
    gateway: Gateway,
    tally: Tally,
    scenario: dict[str, Any],
    metrics: httpx.Response,
    duration: float,
    tinker_errors: list[str],
) -> dict[str, Any]:
    retries, gateway_loads = _counts(gateway, metrics)
    histograms = parse_histograms(metrics.text) if metrics.status_code == 200 else {}

    def quantiles(name: str) -> dict[str, float | None]:
        buckets = histograms.get(name, [])
        return {
            "p50": _finite(histogram_quantile(buckets, 0.50)),
            "p99": _finite(histogram_quantile(buckets, 0.99)),
            "count": buckets[-1][1] if buckets else 0,
        }

    expected = ["openai completions", "openai chat", "openai stream", "tinker base", "trainer (httpx)"]
    if fleet.simulated:
        expected.append("tinker lora")
    if opts.burst:
        expected.append("burst")
    silent = [api for api in expected if tally.ok[api] + tally.failed[api] == 0]
    checks = {
        "no failed requests": tally.total_failed == 0,
        "every client made requests" + (f" (none from {', '.join(silent)})" if silent else ""): not silent,
        "metrics served": metrics.status_code == 200,
    }
    if "fleet" in scenario:
        checks["every worker a fleet member"] = scenario["fleet"]["members"] == gateway.workers
    if "pause" in scenario:
        pause = scenario["pause"]
        checks["pause held dispatch"] = bool(pause["held"])
        pause["streams_resubmitted"] = tally.events["streams resubmitted after the pause"]
        client = gateway.client
        if client is not None:  # in this process: what the gateway itself continued
            pause["answers_continued"] = client.continued.answers
            pause["tokens_kept"] = client.continued.tokens_kept
        else:  # --workers: what the openai clients saw (weight_versions of two spans)
            pause["answers_continued"] = tally.events["answers continued"]
            pause["tokens_kept"] = tally.events["tokens kept by continuing"]
        pause["answers_with_version"] = _version_count(metrics.text, pause["weight_version"])
    return {
        "mode": "simulated" if fleet.simulated else "external",
        "engines": fleet.urls,
        "gateway": gateway.url,
        "workers": gateway.workers,
        "metrics_url": gateway.url + "/metrics",
        "duration_seconds": round(duration, 1),
        "requests": {api: tally.ok[api] + tally.failed[api] for api in tally.apis()},
        "succeeded": tally.total_ok,
        "failures": tally.total_failed,
        "failures_by_api": dict(tally.failed),
        "failure_examples": tally.examples,
        "setup_errors": tinker_errors,
        "retries": {f"{phase}/{reason}": n for (phase, reason), n in sorted(retries.items(), key=str)},
        "queue_time_seconds": quantiles("trioforward_queue_wait_seconds"),
        "engine_time_seconds": quantiles("trioforward_engine_time_seconds"),
        "adapter_loads": {
            "gateway": gateway_loads,
            "engines": fleet.adapter_loads() if fleet.simulated else None,
        },
        "scenario": scenario,
        "checks": checks,
        "ok": all(checks.values()),
    }


def _version_count(text: str, version: str | None) -> int:
    """Answers ``/metrics`` counted for weight ``version``."""
    wanted = f'trioforward_weight_version_requests_total{{weight_version="{version}"}} '
    for line in text.splitlines():
        if line.startswith(wanted):
            return int(float(line[len(wanted) :]))
    return 0


def _finite(value: float) -> float | None:
    return None if value != value else round(value, 4)
