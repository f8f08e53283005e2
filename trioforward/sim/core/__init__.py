"""What one simulated engine holds, below its routes (docs/sim.md).

Owns the HTTP/1.1 server side, one h11 connection per task (:mod:`._http`),
the engine-side counters tests await (:mod:`._stats`, docs/sim.md, "Counters (`engine.stats`, `GET /sim/stats`)"),
the fault switches (:mod:`._faults`), the weight-update control: pause, resume,
abort, weight version and the runs an abort ends (:mod:`._rl`, docs/sim.md,
"Weight updates"), and the base models and LoRA adapters served
(:mod:`._adapters`).

May import :mod:`trioforward.sim.model` only (tests/test_layers.py).
"""
