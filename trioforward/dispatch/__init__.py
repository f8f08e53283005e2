"""trioforward.dispatch: the dispatch core and the embedded client (docs/dispatch.md).

::

    async with trioforward.open_client(engines=["http://127.0.0.1:8001"]) as client:
        response = await client.post("/v1/completions", json={...})      # ForwardResponse
        completion = await client.complete(model="sim-base", prompt=[1, 2, 3], max_tokens=16)

Engine registry with a per-engine queue, weighted fair between tenants,
dispatch-time deadlines, retries keyed on the failed :class:`~trioforward.http.Phase`,
on-demand LoRA adapter loading, health probes and pause/resume (docs/dispatch.md).
"""

from __future__ import annotations

from trioforward.codec import Choice, Completion
from trioforward.dispatch.attempts._identity import MAX_ID_LENGTH, bad_id_reason, with_rid
from trioforward.dispatch.attempts._types import ClientStatistics, ForwardResponse
from trioforward.dispatch.client._client import Client, open_client
from trioforward.dispatch.client._forward_stream import ForwardStream
from trioforward.dispatch.dialects._dialect import TokenRequest
from trioforward.dispatch.engines._adapters import AdapterRegistry
from trioforward.dispatch.engines._admin import Engines
from trioforward.dispatch.engines._engines import EngineInfo
from trioforward.dispatch.engines._fair import FairOrder
from trioforward.dispatch.engines._kinds import KINDS as ENGINE_KINDS
from trioforward.dispatch.engines._tenants import (
    QUEUE_TIME_BUCKETS,
    Tenant,
    TenantStatistics,
    TenantTable,
)
from trioforward.dispatch.rollout._abort import AbortCounts, GroupTail
from trioforward.dispatch.rollout._admission import StalenessBound
from trioforward.dispatch.rollout._engine_control import ENGINE_MODES
from trioforward.dispatch.rollout._pause_args import (
    bad_version_reason,
    fleet_pause_args,
    fleet_pause_value,
    pause_conflict,
)
from trioforward.dispatch.rollout._staleness import (
    POLICY_HEADER,
    STALENESS_HEADER,
    WeightPolicy,
    parse_policy,
)
from trioforward.dispatch.rollout._weights import EnginePause

__all__ = [
    "open_client",
    "Client",
    "ForwardResponse",
    "ForwardStream",
    "Completion",
    "Choice",
    "EngineInfo",
    "ClientStatistics",
    "TenantStatistics",
    "Tenant",
    "TenantTable",
    "FairOrder",
    "QUEUE_TIME_BUCKETS",
    "Engines",
    "AdapterRegistry",
    "ENGINE_MODES",
    "ENGINE_KINDS",
    "TokenRequest",
    "EnginePause",
    "fleet_pause_args",
    "fleet_pause_value",
    "pause_conflict",
    "bad_version_reason",
    "bad_id_reason",
    "MAX_ID_LENGTH",
    "with_rid",
    "StalenessBound",
    "AbortCounts",
    "GroupTail",
    "WeightPolicy",
    "parse_policy",
    "POLICY_HEADER",
    "STALENESS_HEADER",
]
