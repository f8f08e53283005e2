"""Fixtures of the Tinker tests: the SDK's background loop is started before fd baselines."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

os.environ["TINKER_TELEMETRY"] = "0"


@pytest.fixture(scope="session")
def sdk_loop() -> Iterator[None]:
    """The tinker SDK runs one asyncio loop in a daemon thread for the process; starting it
    first keeps its self-pipe out of the per-test fd accounting."""
    from tinker.lib.internal_client_holder import _internal_client_holder_thread_singleton

    _internal_client_holder_thread_singleton.get_loop()
    yield
