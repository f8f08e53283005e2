"""A small correctness sweep per target of ``bench/gateway_burst.py``, in the same run.

What a trainer relies on besides speed, checked against the same simulated
engines after the bursts:

- ``token_ids``: ``POST /v1/completions`` with ``"prompt": [1, 2, 3, 4]`` (token
  ids, as RL trainers send them; vLLM accepts them) — the status and whether one
  choice came back; ``token_id_batch``: two token-id prompts, two choices;
- ``dropped``: every engine's next generation request is read and then the
  connection closes without an answer (the simulated engine's ``drop`` fault).
  On a real engine the request was already being generated, so a gateway that
  sends it again runs the generation twice: the sweep reports the client's
  status and the engine-side receipts (``/sim/stats``) of that one request,
  once on a pooled connection (``dropped_pooled``: indistinguishable on the
  wire from the keep-alive race, where an engine closes an idle connection just
  as the request goes out) and once on a connection opened for it
  (``dropped_fresh``: the engines' idle timeout closed every pooled connection
  first);
- ``burst_errors`` (and their kinds; warm-up and measured bursts) and ``upstream_connections`` (connections
  each engine accepted during the warm-up and measured bursts) at the largest
  burst, from the burst rows.
"""

from __future__ import annotations

import json
import time
from typing import Any

try:  # bench/ on sys.path (`python bench/gateway_burst.py`, bench/run_all.py)
    from _targets import Target, engine_stats, post_json
except ImportError:  # `python -m bench.gateway_burst`
    from bench._targets import Target, engine_stats, post_json  # type: ignore[no-redef]

BASE = {"model": "sim-base", "max_tokens": 4, "temperature": 1.0}


def _choices(status: int | None, body: bytes, expected: int) -> dict[str, Any]:
    ok = False
    if status == 200:
        try:
            ok = len(json.loads(body)["choices"]) == expected
        except (ValueError, KeyError, TypeError):
            ok = False
    return {"status": status, "ok": ok}


def _set_faults(engines: list[str], faults: dict[str, Any]) -> None:
    for engine in engines:
        status, body = post_json(engine + "/sim/faults", faults, timeout=5)
        if status != 200:
            raise RuntimeError(f"{engine}/sim/faults answered {status}: {body!r}")


def _idle(engines: list[str], timeout: float = 15.0) -> bool:
    """Waits until no engine has a connection open but the one asking (the
    engines close idle keep-alive connections after 5 s); False on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(engine_stats(e)["connections_open"] <= 1 for e in engines):
            return True
        time.sleep(0.5)
    return False


def dropped(url: str, engines: list[str], fresh: bool) -> dict[str, Any]:
    """One request whose engine connection drops after the engine read it: on a
    connection the gateway opened for it (``fresh``: every pooled connection was
    closed by the engines' idle timeout first) or on a pooled one (``fresh``
    False: a few requests warm the pool just before)."""
    idle = _idle(engines) if fresh else None
    if not fresh:
        for _ in range(2 * len(engines)):
            post_json(url + "/v1/completions", {**BASE, "prompt": "warm"}, timeout=10)
    _set_faults(engines, {"reset_stats": True, "drop": 1})
    try:
        status, _ = post_json(url + "/v1/completions", {**BASE, "prompt": "dropped"}, timeout=60)
    finally:
        _set_faults(engines, {"drop": 0})
    stats = [engine_stats(e) for e in engines]
    receipts = sum(s["by_path"].get("/v1/completions", 0) for s in stats)
    return {
        "status": status,
        "engine_receipts": receipts,
        "drops": sum(s["faults"].get("drop", 0) for s in stats),
        "resent": receipts > 1,
        "engines_idle_first": idle,
    }


def sweep(target: Target, engines: list[str], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Every check above for ``target``; ``rows``: the burst results of the run."""
    url = target.urls[0]
    mine = [r for r in rows if r["target"] == target.name]
    largest = max(mine, key=lambda r: r["size"]) if mine else None
    out: dict[str, Any] = {
        "target": target.name,
        "token_ids": _choices(*post_json(url + "/v1/completions", {**BASE, "prompt": [1, 2, 3, 4]}), 1),
        "token_id_batch": _choices(
            *post_json(url + "/v1/completions", {**BASE, "prompt": [[1, 2], [3, 4]]}), 2
        ),
        "dropped_pooled": dropped(url, engines, fresh=False) if target.pid is not None else None,
        "dropped_fresh": dropped(url, engines, fresh=True) if target.pid is not None else None,
    }
    if largest is not None:
        out["burst_size"] = largest["size"]
        out["burst_requests"] = largest["requests"] + largest["size"]  # + the warm-up burst
        out["burst_errors"] = largest["errors"] + largest.get("warmup_errors", 0)
        kinds = dict(largest["error_kinds"])
        for kind, count in largest.get("warmup_error_kinds", {}).items():
            kinds[kind] = kinds.get(kind, 0) + count
        out["burst_error_kinds"] = kinds
        out["upstream_connections"] = largest.get("upstream_connections")
    return out


def format_sweep(sweeps: list[dict[str, Any]]) -> str:
    """The sweep as a Markdown table."""
    lines = [
        "| target | token-id prompt | token-id batch | dropped after engine read, pooled connection: "
        "client status, engine receipts | same, fresh connection | errors at the largest burst size (warm-up + measured) "
        "| upstream connections per engine |",
        "|---|---|---|---|---|---|---|",
    ]

    def check(result: dict[str, Any]) -> str:
        return f"{'ok' if result['ok'] else 'FAIL'} ({result['status']})"

    def drop_text(drop: dict[str, Any] | None) -> str:
        if drop is None:
            return "–"
        n = drop["engine_receipts"]
        return f"{drop['status']}, {n} receipt{'s' if n != 1 else ''}" + (" (re-sent)" if drop["resent"] else "")

    for s in sweeps:
        kinds = ", ".join(f"{k}: {v}" for k, v in sorted(s.get("burst_error_kinds", {}).items()))
        errors = f"{s.get('burst_errors', '–')} of {s.get('burst_requests', '–')}" + (f" ({kinds})" if kinds else "")
        conns = s.get("upstream_connections")
        lines.append(
            f"| {s['target']} | {check(s['token_ids'])} | {check(s['token_id_batch'])} | "
            f"{drop_text(s.get('dropped_pooled'))} | {drop_text(s.get('dropped_fresh'))} | "
            f"{errors} | {' / '.join(map(str, conns)) if conns else '–'} |"
        )
    return "\n".join(lines)
