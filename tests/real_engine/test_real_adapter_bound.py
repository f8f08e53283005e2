"""The gateway's bound on loaded adapters against vLLM's --max-loras: unload, reload,
every sample succeeds."""

from __future__ import annotations

import pytest

from trioforward._settings import knobs

BOUND_KNOBS = {"max_loaded_adapters", "max_adapters", "adapter_limit", "max_loras"}


def test_adapter_bound_against_max_loras() -> None:
    names = {k.name for k in knobs()}
    if not names & BOUND_KNOBS:
        pytest.skip(
            "the gateway has no bound on loaded adapters per engine yet (an LRU unload knob "
            f"such as {sorted(BOUND_KNOBS)[0]!r}); nothing to hold against --max-loras"
        )
    pytest.fail("the adapter bound exists now: write this test")
