"""The Tinker routes' own state, kept in ``GatewayState.extras["tinker"]``.

Created lazily by the first Tinker request (so it does not depend on the order
of the app's ``before_serving`` hooks) from the gateway's settings, dispatch
client and server-lifetime nursery, and dropped with the ``GatewayState``.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

import trio

from trioforward.server.base._state import GatewayState, get_state
from trioforward.server.tinker._futures import FutureStore
from trioforward.server.tinker._requests import SamplingSession, sampling_session_from_id
from trioforward.server.tinker._runner import SampleRunner

__all__ = ["TinkerState", "tinker_state", "state_of", "EXTRAS_KEY"]

EXTRAS_KEY = "tinker"
log = logging.getLogger("trioforward.tinker")

# Workers when engines declare no capacity (engine_capacity = 0, unlimited).
UNLIMITED_WORKERS = 16384
# Sampling sessions remembered at most (oldest forgotten first). Forgetting is harmless:
# a sampling session id describes itself and is decoded again when next used.
MAX_SAMPLING_SESSIONS = 65536


class TinkerState:
    """Future store, sample runner and known sampling sessions of one serving app."""

    def __init__(self, gateway: GatewayState) -> None:
        settings = gateway.settings
        self.client = gateway.client
        self.adapter_root = settings.adapter_root
        fleet = gateway.fleet
        self.store = FutureStore(
            hold=settings.future_hold,
            retention=settings.future_retention,
            max_retained=settings.max_retained_futures,
            max_outstanding=settings.max_outstanding,
            epoch=None if fleet is None else fleet.epoch,
        )
        # Fleet mode (docs/fleet.md): futures are the fleet's, max_outstanding is fleet-wide.
        self.fleet = fleet
        self.shared: Any = None if fleet is None else fleet.futures
        if fleet is not None:
            self.store.on_resolve = fleet.futures.finished
            fleet.outstanding = lambda: self.store.outstanding
        self.runner = SampleRunner(
            self.store, self.client, gateway.nursery, self._worker_limit, gateway.metrics
        )
        self._nursery = gateway.nursery
        gateway.on_drain.append(self._drain)
        self._capacity = settings.engine_capacity
        self._sampling_sessions: OrderedDict[str, SamplingSession] = OrderedDict()
        self._models: OrderedDict[str, None] = OrderedDict()

    def _drain(self, cutoff: float) -> None:
        """The SIGTERM drain started; at ``cutoff`` (a moment before the grace ends,
        as the dispatch client's queue) every sample still waiting in the runner's
        own queue is dropped (410: no engine ran it, the SDK resubmits it), and the
        polls held for samples still running answer 503 ``shutting_down`` (the SDK
        polls again). Without this both got a closed connection at the grace's end."""

        async def end_at_cutoff() -> None:
            await trio.sleep_until(cutoff)
            for future in self.runner.take_queued():
                self.store.abandon(future)
            self.store.close()

        self._nursery.start_soon(end_at_cutoff)

    def _worker_limit(self) -> int:
        if not self._capacity:
            return UNLIMITED_WORKERS
        try:
            engines = len(self.client.engines.list())
        except Exception:  # an engine registry without list(): one engine's worth
            engines = 1
        return self._capacity * max(engines, 1)

    def registered_adapters(self) -> dict[str, str]:
        """Adapter names the dispatch core knows (name -> path)."""
        try:
            adapters: dict[str, str] = self.client.adapters.list()
        except Exception:
            return {}
        return adapters

    def remember(self, sampling_session: SamplingSession) -> None:
        """Keep the sampling session; register its adapter so the dispatch core loads it on demand
        (again, if the registry's bound made it forget an old one)."""
        if sampling_session.adapter_path is not None and not self.client.adapters.is_adapter(sampling_session.model):
            self.client.adapters.register(sampling_session.model, sampling_session.adapter_path)
            log.info("tinker adapter %s registered at %s", sampling_session.model, sampling_session.adapter_path)
        if sampling_session.sampler_id in self._sampling_sessions:
            return
        self._sampling_sessions[sampling_session.sampler_id] = sampling_session
        self._models[sampling_session.base_model] = None
        self._models[sampling_session.model] = None
        while len(self._sampling_sessions) > MAX_SAMPLING_SESSIONS:
            self._sampling_sessions.popitem(last=False)
        while len(self._models) > MAX_SAMPLING_SESSIONS:
            self._models.popitem(last=False)

    def sampling_session(self, sampler_id: str) -> SamplingSession | None:
        """A known sampling session, or one decoded from its self-describing id (after a restart)."""
        sampling_session = self._sampling_sessions.get(sampler_id)
        if sampling_session is None:
            sampling_session = sampling_session_from_id(sampler_id, self.adapter_root, self.registered_adapters())
        if sampling_session is not None:
            self.remember(sampling_session)  # re-registers an adapter the registry's bound dropped
        return sampling_session

    @property
    def sampling_sessions(self) -> int:
        """Sampling sessions kept (at most :data:`MAX_SAMPLING_SESSIONS`, oldest dropped first)."""
        return len(self._sampling_sessions)

    def known_models(self) -> list[str]:
        """Models sampling sessions have named, then the registered adapters."""
        models = dict(self._models)
        for name in self.registered_adapters():
            models[name] = None
        return list(models)


def tinker_state() -> TinkerState:
    """The Tinker state of the app handling the current request (created on first use)."""
    return state_of(get_state())


def state_of(gateway: GatewayState) -> TinkerState:
    """The Tinker state kept in ``gateway.extras`` (created on first use)."""
    state: Any = gateway.extras.get(EXTRAS_KEY)
    if state is None:
        state = gateway.extras[EXTRAS_KEY] = TinkerState(gateway)
    assert isinstance(state, TinkerState)
    return state
