"""One simulated engine and how to run it (docs/sim.md, "In process").

Owns :class:`~trioforward.sim.SimEngine`: its listener, capacity queue and the
dispatch to its routes (:mod:`._engine`), ``open_engine`` / ``open_fleet``
(:mod:`._open`) and ``trioforward sim-engine`` (:mod:`._cli`).

The top sim package: it may import every other one (tests/test_layers.py);
``trioforward.sim`` re-exports its public names.
"""
