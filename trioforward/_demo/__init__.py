"""``trioforward demo``: the whole product on one machine, with no GPU.

A small fleet of simulated engines (``trioforward.sim``), the gateway under
Hypercorn on loopback, and real clients (the official ``tinker`` and ``openai``
SDKs, httpx, trioforward's pool) driving it through a weight-update pause, an
engine restart and a burst. See ``docs/README.md``.
"""

from __future__ import annotations

from trioforward._demo._cli import demo

__all__ = ["demo"]
