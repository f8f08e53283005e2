"""Helpers for the fleet tests: members of one fleet on a real Valkey, waiting, tick
by tick (no sleeping), until they see each other, and the body of a Tinker sample."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

from gateway_harness import Gateway, open_gateway

PROMPT = {"chunks": [{"type": "encoded_text", "tokens": [101, 7, 2048, 3]}]}


def sample_body(session: str, seq: int, num_samples: int = 2) -> dict[str, Any]:
    """The JSON body of ``POST /api/v1/asample`` for ``(session, seq)``: 8 tokens, seeded."""
    return {
        "sampling_session_id": session,
        "seq_id": seq,
        "num_samples": num_samples,
        "prompt": PROMPT,
        "sampling_params": {"max_tokens": 8, "seed": seq},
    }


async def open_members(
    engine_url: str, valkey: Any, fleet_name: str, stack: AsyncExitStack, n: int = 2, **knobs: Any
) -> list[Gateway]:
    """``n`` gateways of fleet ``fleet_name`` in front of ``engine_url``, closed by ``stack``;
    ``knobs`` override the settings (lease_interval 0.05 s, member_ttl 2 s by default)."""
    settings = {"lease_interval": 0.05, "member_ttl": 2.0, **knobs}
    return [
        await stack.enter_async_context(
            open_gateway(engine_url, state_url=valkey.url, fleet_name=fleet_name, **settings)
        )
        for _ in range(n)
    ]


async def until_members(gateways: list[Gateway], n: int) -> None:
    """Return once every gateway counts ``n`` live members."""
    while not all(len(gw.state.fleet.members) == n for gw in gateways):
        for gw in gateways:
            await gw.state.fleet.wait_tick()
