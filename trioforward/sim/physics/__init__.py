"""The engine model: how long a request takes (docs/sim.md, "Engine model").

Owns the cost of one scheduler step and the hardware profiles
(:mod:`._physics`), the KV cache's block budget (:mod:`._kv`), vLLM's automatic
prefix caching (:mod:`._prefix_cache`, docs/sim.md, "Prefix cache"), the step
loop over every running sequence (:mod:`._scheduler`) and the prefill and
decode time each request sees (:mod:`._timing`).

May import :mod:`trioforward.sim.model` and ``core`` (tests/test_layers.py).
"""
