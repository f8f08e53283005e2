"""The simulated model and the bodies it answers with, with no I/O (docs/sim.md).

Owns the deterministic tokens and logprobs (:mod:`._generate`, docs/sim.md,
"Deterministic outputs"), vLLM's OpenAI-compatible request parsing and answer
bodies (:mod:`._api`), its server-sent-event streams (:mod:`._stream`) and its
error answers (:mod:`._errors`).

The lowest sim package: it imports no other (tests/test_layers.py).
"""
