"""A simulated vLLM-compatible engine with fault injection (docs/sim.md).

In process::

    async with trioforward.sim.open_engine(capacity=4, decode_ms_per_token=1) as engine:
        ...  # talk to engine.url; assert on engine.stats; switch engine.faults

Command line: ``trioforward sim-engine --port 8001``.
Outputs are predictable with :func:`expected_completion` and friends.
"""

from __future__ import annotations

from trioforward.sim.core._adapters import Adapters
from trioforward.sim.core._faults import GENERATION_PATHS, FaultError, Faults
from trioforward.sim.core._stats import EngineStats
from trioforward.sim.engine._engine import SimEngine
from trioforward.sim.engine._open import open_engine, open_fleet
from trioforward.sim.model._generate import (
    VOCAB_SIZE,
    Sample,
    expected_completion,
    expected_prompt_logprobs,
    expected_tokens,
    expected_top_logprobs,
    render_text,
    render_token,
    sample,
    tokenize,
)
from trioforward.sim.physics._prefix_cache import PrefixCache

__all__ = [
    "open_engine",
    "open_fleet",
    "SimEngine",
    "EngineStats",
    "Faults",
    "FaultError",
    "Adapters",
    "PrefixCache",
    "GENERATION_PATHS",
    "VOCAB_SIZE",
    "Sample",
    "sample",
    "expected_completion",
    "expected_tokens",
    "expected_prompt_logprobs",
    "expected_top_logprobs",
    "render_text",
    "render_token",
    "tokenize",
]
