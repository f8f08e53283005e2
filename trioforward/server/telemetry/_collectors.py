"""The gateway's scrape-time collectors (docs/server.md, "Metrics (`GET /metrics`)"):
what the dispatch core and the fleet already count, read when ``/metrics`` is
scraped, so the request path pays nothing for them and nothing is counted twice.
:class:`~trioforward.server.telemetry._metrics.Metrics` registers them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from trioforward.server.telemetry._metrics_tenants import tenant_families

if TYPE_CHECKING:
    from trioforward.dispatch import Client

__all__ = ["ClientCollector", "FleetCollector"]


class ClientCollector:
    """Reads the dispatch core's own counters at scrape time."""

    def __init__(self, client_getter: Callable[[], Client | None]) -> None:
        self._client_getter = client_getter

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        client = self._client_getter()
        if client is None:
            return
        stats = client.statistics()
        yield CounterMetricFamily(
            "trioforward_dispatch_requests",
            "Requests accepted by the dispatch core",
            value=stats.requests_total,
        )
        retries = CounterMetricFamily(
            "trioforward_retries",
            "Upstream retries by failed phase and reason",
            labels=["phase", "reason"],
        )
        for (phase, reason), count in sorted(stats.retries.items(), key=str):
            retries.add_metric([str(phase), str(reason)], count)
        yield retries
        migrations = CounterMetricFamily(
            "trioforward_migrations",
            "Generations moved to another engine after theirs failed mid-answer, by route and reason",
            labels=["route", "reason"],
        )
        for (route, reason), count in sorted(stats.migrations.items()):
            migrations.add_metric([route, reason], count)
        yield migrations
        responses = CounterMetricFamily(
            "trioforward_engine_responses",
            "Engine answers by engine and HTTP status",
            labels=["engine", "status"],
        )
        for (engine, status), count in sorted(stats.responses.items(), key=str):
            responses.add_metric([engine, str(status)], count)
        yield responses
        # Per engine, never per adapter: an RL run makes a new adapter every step,
        # so an adapter label would grow without bound.
        loads = CounterMetricFamily(
            "trioforward_adapter_loads", "LoRA adapter loads by engine", labels=["engine"]
        )
        for engine, count in sorted(stats.adapter_loads.items()):
            loads.add_metric([engine], count)
        yield loads
        unloads = CounterMetricFamily(
            "trioforward_adapter_unloads",
            "LoRA adapters unloaded by engine (least recently used beyond max_loaded_adapters)",
            labels=["engine"],
        )
        for engine, count in sorted(stats.adapter_unloads.items()):
            unloads.add_metric([engine], count)
        yield unloads
        loaded = GaugeMetricFamily(
            "trioforward_adapters_loaded",
            "LoRA adapters the gateway keeps loaded, by engine",
            labels=["engine"],
        )
        for engine, names in sorted(stats.adapters_loaded.items()):
            loaded.add_metric([engine], len(names))
        yield loaded
        yield GaugeMetricFamily(
            "trioforward_adapters_registered",
            "LoRA adapters registered with the gateway",
            value=stats.adapters_registered,
        )
        yield GaugeMetricFamily(
            "trioforward_in_flight", "Requests dispatched to an engine", value=stats.in_flight
        )
        yield GaugeMetricFamily(
            "trioforward_queued", "Requests waiting for engine capacity", value=stats.queued
        )
        yield CounterMetricFamily(
            "trioforward_session_moves",
            "Sessions routing moved off an overloaded or saturated engine",
            value=stats.session_moves,
        )
        yield GaugeMetricFamily(
            "trioforward_sessions_routed",
            "Sessions whose engine routing remembers (bounded, expiring)",
            value=stats.sessions_routed,
        )
        yield from tenant_families(stats.tenants)
        pool = stats.pool
        connections = GaugeMetricFamily(
            "trioforward_pool_connections", "Upstream connections by state", labels=["state"]
        )
        for state in ("idle", "active", "connecting", "waiting"):
            connections.add_metric([state], getattr(pool, state))
        yield connections
        for name in ("opened", "reused", "closed"):
            yield CounterMetricFamily(
                f"trioforward_pool_connections_{name}",
                f"Upstream connections {name}",
                value=getattr(pool, f"{name}_total"),
            )
        healthy = GaugeMetricFamily(
            "trioforward_engine_healthy",
            "1 while the engine passes its health checks (a paused engine stays 1)",
            labels=["engine"],
        )
        paused = GaugeMetricFamily(
            "trioforward_engine_paused", "1 while paused for a weight update", labels=["engine"]
        )
        limit = GaugeMetricFamily(
            "trioforward_engine_limit",
            "Requests the gateway lets run on the engine (learnt from its load reports, "
            "else its capacity share; 0 = unlimited)",
            labels=["engine"],
        )
        for info in client.engines.list():
            healthy.add_metric([info.url], 1.0 if info.healthy else 0.0)
            paused.add_metric([info.url], 1.0 if info.paused else 0.0)
            limit.add_metric([info.url], float(info.limit if info.limit is not None else info.share))
        yield healthy
        yield paused
        yield limit


class FleetCollector:
    """Fleet gauges (docs/fleet.md, "Metrics"), from this member's last snapshot of
    every live member: so any member reports the whole fleet's shares and demand."""

    def __init__(self, fleet_getter: Callable[[], Any]) -> None:
        self._fleet_getter = fleet_getter

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        fleet = self._fleet_getter()
        if fleet is None:
            return
        members = dict(fleet.members)
        yield GaugeMetricFamily(
            "trioforward_fleet_members", "Live members of the fleet", value=len(members)
        )
        yield GaugeMetricFamily(
            "trioforward_fleet_state_unreachable",
            "1 while this member cannot reach the fleet's shared state",
            value=1.0 if fleet.degraded else 0.0,
        )
        share = GaugeMetricFamily(
            "trioforward_fleet_engine_share",
            "Requests a member may run at once on an engine (its capacity lease)",
            labels=["engine", "member"],
        )
        demand = GaugeMetricFamily(
            "trioforward_fleet_engine_demand",
            "Requests queued + running on an engine at a member",
            labels=["engine", "member"],
        )
        for member_id, record in sorted(members.items()):
            for url, tokens in sorted(record.share.items()):
                share.add_metric([url, member_id], tokens)
            for url, counts in sorted(record.demand.items()):
                demand.add_metric([url, member_id], counts["demand"])
        yield share
        yield demand
