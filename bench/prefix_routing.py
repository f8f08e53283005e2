"""Prefix routing: prompt tokens computed vs cached, time and load spread, five routers in one run.

Four simulated engines (``trioforward sim-engine``, each with a prefix cache and
a real prefill cost per uncached token) behind, in turn: ``trioforward serve``
with ``routing`` = ``least-outstanding``, ``round-robin``, ``session`` (the
client sends ``X-Session-ID``), ``prefix`` (no header), and smg's
``cache_aware`` policy (``smg launch``, the ``smg`` package, defaults). Three
workloads each, engine caches and counters reset between runs:

- ``agentic``: rounds (trainer steps) of S sessions x T turns, run
  concurrently; each turn's prompt is the previous prompt plus the answer
  plus new tokens (a shared system prompt, then a per-session task). A
  trainer's agentic batch holds hundreds of rollouts of many turns, more
  than the engines run at once; the default, 2 rounds of 64 sessions x 8
  turns on 16 slots, keeps 4 sessions a slot, so the round's wall is set by
  the engines' work and its spread, as in such a batch. The earlier default,
  one round of 32 x 6 (``--agentic-rounds 1 --sessions 32 --turns 6``), ran
  about 3.5 s and its wall ratios moved by up to 25 % between runs;
- ``grpo``: batches of Q groups of G identical prompts, each batch sent at
  once as separate requests (session id = group), group after group, one
  batch after another. A trainer's batch holds many groups per engine (a
  few hundred prompts x 8 samples on a few engines); the default, 64 groups
  of 8 on 4 engines of 4 slots, keeps 16 groups per engine. With 4 per
  engine (``--groups 16``, the earlier default) the load bound, still
  ``ceil(1.25 * (m + 1) / 4)`` = 1-3 while a burst's first group arrives,
  splits the first groups of each batch over several engines, and that
  share of the batch is larger (docs/performance.md);
- ``skewed``: one hot prefix (75 % of the requests, a unique tail each), the
  rest unique prompts, at a fixed concurrency.
- ``lowload``: the case where the cache is the whole gain — far fewer requests
  in flight than slots (default 8 on 4 engines of 16 slots, its own engine set
  and gateways with ``prefix_tokens`` 32), 40 conversations of 5 turns, each
  starting with its own 128 tokens. ``lost turns`` counts turns that did not
  find their previous prompt cached, ``split`` the conversations that lost it
  at least once (served by two engines or more). The load bound alone,
  ``ceil(1.25 * (m + 1) / 4)`` = 3 here, split them though every engine had
  idle slots; prefix routing now keeps a prefix on its engine while that engine
  has a free slot.

Engine timing: 4 requests at once, 0.5 ms a prompt token of prefill and
5 ms a decode step. A decode step of 5 ms is the order of a small model on
one GPU, and a prompt token costs a tenth of a generated one, about the ratio
of vLLM's prefill to decode throughput. Time is scaled so that engine time,
not the client's and gateway's CPU on the shared 2 cores, sets the wall:
with 2 ms steps and 0.2 ms a token, least-outstanding's GRPO batches took
1.4-1.7x their engine time and the routers' differences were in the noise.
trioforward is told the engines' capacity (``engine_capacity`` = 4, as
docs/configuration.md asks: vLLM's ``max_num_seqs``), so a burst queues at
the gateway, where routing sees it; smg forwards at once and the engines queue.
Answers are 16 tokens, so prefill is a large share of the work: with long
answers the cache saves less time, in proportion.

Each target's ``busy`` is the engine time the timing model charges (prefill
of the computed tokens, decode of the answers); ``work vs least-outst.`` is its
total over least-outstanding's, the time the cache saves if no slot idles.
For each GRPO batch the JSON also has its wall, each engine's busy time and
``placement_bound_s``, the busiest engine's busy time over its slots: the
batch's wall if that placement ran with no idle slot and no overhead (the
rest is the client's, gateway's and engines' CPU, and slots idle at the tail);
the table's ``floor s`` is their sum over the batches. Each agentic round
has the same, and ``chain_bound_s``, the longest session's engine time (its
turns back to back; the floor is the larger of the two) and ``lost_turns``,
the turns that did not find their session's previous prompt cached (fewer
cached tokens than its full blocks: the turn ran elsewhere than the last
one). ``walls per round s``: each batch's or round's wall. ``router CPU s``:
the CPU time the gateway (or smg) process used during the workload.

``prefix:1.5`` is ``prefix`` with ``prefix_load_factor = 1.5`` (the default is
1.25): the knob's trade between cache reuse and balance. Each engine's
outstanding count (in flight + queued, at the gateway for trioforward, on the
engine for smg) is sampled every 20 ms; its peak is compared with the load
bound of ``routing = "prefix"`` (``prefix_load_factor`` times the mean, at the
workload's peak concurrency).

Prompts are text (smg's HTTP router refuses token-id prompts: its
``CompletionRequest.prompt`` is a string or a list of strings). The simulated
engine tokenizes text as its UTF-8 bytes, so one character is one token, and
an answer's text is not the token ids it cached: a next turn reuses the
previous prompt, not the answer. The machine has 2 cores, shared with other
work while this ran: compare ratios within one run.

    python bench/prefix_routing.py [--agentic-rounds 2 --sessions 64 --turns 8 --rounds 2 --groups 64 --group-size 8]

Writes ``bench/results/prefix_routing.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
CLI = "from trioforward.cli import main; main()"
# "prefix:F" is routing = "prefix" with prefix_load_factor F (default 1.25).
POLICIES = ("least-outstanding", "round-robin", "session", "prefix", "prefix:1.5", "smg-cache_aware")
LOAD_FACTOR = 1.25


def _load_factor(target: str) -> float:
    return float(target.partition(":")[2] or LOAD_FACTOR) if target.startswith("prefix") else LOAD_FACTOR


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _spawn(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, start_new_session=True
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _cpu_s(pid: int) -> float:
    """CPU time (user + system, all threads) process ``pid`` has used, in
    seconds (``/proc/<pid>/stat`` fields 14 and 15; 0.0 where there is no /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout} s")


def _ready(url: str, timeout: float = 30.0) -> None:
    """A router is ready once a completion goes through (smg registers workers after /health)."""
    import urllib.error
    import urllib.request

    body = json.dumps({"model": "sim-base", "prompt": "ready?", "max_tokens": 1}).encode()
    deadline = time.monotonic() + timeout
    while True:
        request = urllib.request.Request(
            url + "/v1/completions", data=body, headers={"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.HTTPError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} answered no completion in {timeout} s")
        time.sleep(0.2)


# --- workloads (asyncio + aiohttp, in this process) ---------------------------------


def _text(tag: str, n: int) -> str:
    """``n`` characters (= tokens for the simulated engine) unique to ``tag``."""
    unit = f"[{tag}] "
    return (unit * (n // len(unit) + 1))[:n]


class _Run:
    def __init__(self, session: Any, url: str, headers: bool, max_tokens: int) -> None:
        self.session = session
        self.url = url + "/v1/completions"
        self.headers = headers
        self.max_tokens = max_tokens
        self.latencies: list[float] = []
        self.errors = 0

    async def complete(self, prompt: str, key: str) -> str:
        return (await self.complete_cached(prompt, key))[0]

    async def complete_cached(self, prompt: str, key: str) -> tuple[str, int]:
        """The answer's text and the prompt tokens the engine had cached
        (``usage.prompt_tokens_details.cached_tokens``, 0 when absent)."""
        body = {"model": "sim-base", "prompt": prompt, "max_tokens": self.max_tokens}
        headers = {"x-session-id": key} if self.headers else {}
        start = time.perf_counter()
        async with self.session.post(self.url, json=body, headers=headers) as response:
            data = await response.json(content_type=None)
            if response.status != 200:
                self.errors += 1
                return "", 0
        self.latencies.append(time.perf_counter() - start)
        details = data.get("usage", {}).get("prompt_tokens_details") or {}
        return str(data["choices"][0]["text"]), int(details.get("cached_tokens", 0))


async def _agentic(run: _Run, args: Any, engines: list[str], batches: list[dict[str, Any]]) -> None:
    """``args.agentic_rounds`` rounds (a trainer step each: new tasks, the same
    system prompt) of ``args.sessions`` concurrent sessions x ``args.turns``
    turns. Per round: its wall, each engine's counters, the longest chain's
    engine time (its turns' prefill of uncached tokens and decode, back to
    back: no placement finishes the round sooner) and the turns that lost
    their session's prefix (cached fewer tokens than the previous prompt's
    full blocks: the turn ran on another engine than the previous one, or the
    prefix was evicted)."""
    shared = _text("system: you are a careful agent", args.system)
    block = 16  # the simulated engine's prefix-cache block (vLLM's default)

    async def one(r: int, s: int, chains: list[float], lost: list[int]) -> None:
        prompt = shared + _text(f"task {r}.{s}", args.task)
        previous = 0  # the previous prompt's length (0: first turn)
        chain = 0.0
        for t in range(args.turns):
            answer, cached = await run.complete_cached(prompt, f"session-{r}.{s}")
            chain += ((len(prompt) - cached) * args.prefill_ms + args.max_tokens * args.decode_ms) / 1e3
            if previous and cached < previous // block * block:
                lost[0] += 1
            previous = len(prompt)
            prompt = prompt + answer + _text(f"tool output {r}.{s}.{t}", args.new_tokens)
        chains.append(chain)

    before = await _stats(run.session, engines)
    for r in range(args.agentic_rounds):
        chains: list[float] = []
        lost = [0]
        start = time.perf_counter()
        await asyncio.gather(*(one(r, s, chains, lost) for s in range(args.sessions)))
        wall = time.perf_counter() - start
        after = await _stats(run.session, engines)
        deltas = [_delta(a, b) for a, b in zip(after, before, strict=True)]
        batches.append({"wall_s": wall, "stats": deltas, "chain_s": max(chains, default=0.0),
                        "lost_turns": lost[0]})
        before = after


async def _lowload(run: _Run, args: Any, engines: list[str], batches: list[dict[str, Any]]) -> None:
    """``args.low_conversations`` conversations of ``args.low_turns`` turns, each
    with its own ``args.low_prefix``-token start, ``args.low_concurrency`` in
    flight (each worker runs its conversations one after the other): far below
    the engines' slots. One batch: its wall, each engine's counters, the turns
    that lost their conversation's prefix (as agentic's) and the conversations
    that lost it at least once (``split``: served by more than one engine)."""
    block = 16
    todo = list(range(args.low_conversations))
    lost = [0]
    split: set[int] = set()
    chains: list[float] = []

    async def worker() -> None:
        while todo:
            c = todo.pop(0)
            prompt = _text(f"conversation {c}", args.low_prefix)
            previous = 0
            chain = 0.0
            for t in range(args.low_turns):
                answer, cached = await run.complete_cached(prompt, f"conversation-{c}")
                chain += ((len(prompt) - cached) * args.prefill_ms + args.max_tokens * args.decode_ms) / 1e3
                if previous and cached < previous // block * block:
                    lost[0] += 1
                    split.add(c)
                previous = len(prompt)
                prompt = prompt + answer + _text(f"turn {c}.{t}", args.new_tokens)
            chains.append(chain)

    before = await _stats(run.session, engines)
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(args.low_concurrency)))
    wall = time.perf_counter() - start
    after = await _stats(run.session, engines)
    deltas = [_delta(a, b) for a, b in zip(after, before, strict=True)]
    batches.append({"wall_s": wall, "stats": deltas, "chain_s": max(chains, default=0.0),
                    "lost_turns": lost[0], "split_conversations": len(split)})


async def _grpo(
    run: _Run, rounds: int, groups: int, size: int, system: int, question: int,
    engines: list[str], batches: list[dict[str, Any]],
) -> None:
    shared = _text("system: solve the problem", system)
    before = await _stats(run.session, engines)
    for r in range(rounds):  # a trainer step: one batch of groups, then the next
        prompts = [shared + _text(f"question {r}.{q}", question) for q in range(groups)]
        start = time.perf_counter()
        await asyncio.gather(
            *(run.complete(prompts[q], f"group-{r}.{q}") for q in range(groups) for _ in range(size))
        )
        wall = time.perf_counter() - start
        after = await _stats(run.session, engines)
        deltas = [_delta(a, b) for a, b in zip(after, before, strict=True)]
        batches.append({"wall_s": wall, "stats": deltas})
        before = after


def _delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, int]:
    """Requests and computed prompt tokens of one engine between two ``/sim/stats``."""
    return {
        "requests": int(after["by_path"].get("/v1/completions", 0))
        - int(before["by_path"].get("/v1/completions", 0)),
        "computed": int(after["prompt_tokens_computed"]) - int(before["prompt_tokens_computed"]),
    }


async def _skewed(run: _Run, requests: int, concurrency: int, hot: int, tail: int) -> None:
    hot_prefix = _text("hot: the long shared instructions", hot)
    work = list(range(requests))

    async def worker() -> None:
        while work:
            i = work.pop()
            if i % 4:  # 3 of 4 share the hot prefix
                await run.complete(hot_prefix + _text(f"item {i}", tail), f"hot-{i}")
            else:
                await run.complete(_text(f"cold {i}", hot + tail), f"cold-{i}")

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _sample_loads(session: Any, engines: list[str], gateway: str | None, out: list[list[int]]) -> None:
    """Each engine's outstanding requests every 20 ms: running + queued on the
    engine, plus queued for it at the gateway (``gateway``: trioforward's URL,
    whose ``GET /admin/engines`` counts both; ``None`` for a router that queues
    nothing, such as smg)."""
    while True:
        if gateway is not None:
            async with session.get(gateway + "/admin/engines") as response:
                listed = (await response.json())["engines"]
            loads = [int(e["in_flight"]) + int(e["queued"]) for e in listed]
        else:
            loads = []
            for url in engines:
                async with session.get(url + "/sim/stats") as response:
                    stats = await response.json()
                loads.append(int(stats["running"]) + int(stats["queued"]))
        out.append(loads)
        await asyncio.sleep(0.02)


async def _reset(session: Any, engines: list[str]) -> None:
    for url in engines:
        async with session.post(url + "/reset_prefix_cache") as response:
            await response.read()
        async with session.post(url + "/sim/faults", json={"reset_stats": True}) as response:
            await response.read()


async def _stats(session: Any, engines: list[str]) -> list[dict[str, Any]]:
    out = []
    for url in engines:
        async with session.get(url + "/sim/stats") as response:
            out.append(await response.json())
    return out


async def _workload(name: str, target: str, url: str, engines: list[str], args: Any) -> dict[str, Any]:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=300)
    ) as session:
        await _reset(session, engines)
        run = _Run(session, url, target == "session", args.max_tokens)
        samples: list[list[int]] = []
        batches: list[dict[str, Any]] = []
        gateway = None if target.startswith("smg") else url
        sampler = asyncio.ensure_future(_sample_loads(session, engines, gateway, samples))
        start = time.perf_counter()
        try:
            if name == "agentic":
                await _agentic(run, args, engines, batches)
            elif name == "lowload":
                await _lowload(run, args, engines, batches)
            elif name == "grpo":
                await _grpo(run, args.rounds, args.groups, args.group_size, args.system, args.task,
                            engines, batches)
            else:
                await _skewed(run, args.skewed_requests, args.concurrency, args.hot, args.tail)
        finally:
            wall = time.perf_counter() - start
            sampler.cancel()
        stats = await _stats(session, engines)
    computed = sum(s["prompt_tokens_computed"] for s in stats)
    cached = sum(s["prompt_tokens_cached"] for s in stats)
    per_engine = [int(s["by_path"].get("/v1/completions", 0)) for s in stats]
    # Slot time each engine spent on the workload by the timing model: prefill
    # of the tokens it computed, decode of the answers (a close upper bound:
    # some answers stop before max_tokens).
    busy = [
        (s["prompt_tokens_computed"] * args.prefill_ms + n * args.max_tokens * args.decode_ms) / 1e3
        for s, n in zip(stats, per_engine, strict=True)
    ]
    lat = sorted(run.latencies)

    def slot_s(computed: int, requests: int) -> float:
        return (computed * args.prefill_ms + requests * args.max_tokens * args.decode_ms) / 1e3

    # Per GRPO batch: its wall, each engine's engine time, and the wall the
    # placement allows at best (the busiest engine's time over its slots).
    per_batch = []
    for b in batches:
        busy_b = [slot_s(d["computed"], d["requests"]) for d in b["stats"]]
        entry = {
            "wall_s": round(b["wall_s"], 3),
            "busy_s_per_engine": [round(x, 3) for x in busy_b],
            "computed_per_engine": [d["computed"] for d in b["stats"]],
            "placement_bound_s": round(max(busy_b) / _capacity(name, args), 3),
        }
        if "chain_s" in b:  # agentic: the longest chain bounds the round too
            entry["chain_bound_s"] = round(b["chain_s"], 3)
            entry["lost_turns"] = b["lost_turns"]
        if "split_conversations" in b:
            entry["split_conversations"] = b["split_conversations"]
        per_batch.append(entry)
    # A closed loop keeps at most `peak` requests outstanding, so at every
    # placement the bound was at most ceil(1.25 * peak / n); an engine never
    # holds more than the gateway placed on it, so engine-side samples above
    # that mean the bound was broken (for routers that keep one).
    peak = {
        "agentic": args.sessions,
        "grpo": args.groups * args.group_size,
        "lowload": args.low_concurrency,
    }.get(name, args.concurrency)
    bound = math.ceil(_load_factor(target) * peak / len(engines))
    peak_load = max((max(loads) for loads in samples), default=0)
    return {
        "target": target,
        "workload": name,
        "requests": len(run.latencies) + run.errors,
        "errors": run.errors,
        "wall_s": wall,
        "prompt_tokens_computed": computed,
        "prompt_tokens_cached": cached,
        "cached_share": cached / (computed + cached) if computed + cached else 0.0,
        "p50_ms": 1e3 * lat[len(lat) // 2] if lat else None,
        "p99_ms": 1e3 * lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else None,
        "requests_per_engine": per_engine,
        "busy_s_per_engine": [round(b, 3) for b in busy],
        "spread": max(per_engine) / (sum(per_engine) / len(per_engine)) if sum(per_engine) else None,
        "load_samples": len(samples),
        "peak_engine_load": peak_load,
        "bound": bound,
        "batches": per_batch,
    }


# --- orchestration --------------------------------------------------------------------


def _start_target(
    target: str, engines: list[str], capacity: int, extra: list[str]
) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    if target == "smg-cache_aware":
        if importlib.util.find_spec("smg") is None:
            raise RuntimeError("smg is not installed (pip install -e '.[bench]')")
        # By module: sglang-router's wheel installs a `smg` script too.
        args = [sys.executable, "-m", "smg", "launch", "--host", "127.0.0.1", "--port", str(port), "--policy",
                "cache_aware", "--log-level", "warn", "--worker-urls", *engines]
    else:
        routing = target.partition(":")[0]
        # The gateway knows each engine's max_num_seqs (engine_capacity, as
        # docs/configuration.md asks), so a burst queues at the gateway.
        args = [sys.executable, "-c", CLI, "serve", "--port", str(port), "--routing", routing,
                "--prefix-load-factor", str(_load_factor(target)),
                "--engine-capacity", str(capacity),
                "--no-access-log", "--log-level", "warning", *extra]
        for engine in engines:
            args += ["--engine", engine]
    proc = _spawn(args)
    try:
        _wait_ready(url, proc)
        _ready(url)
    except BaseException:
        _stop(proc)
        raise
    return proc, url


def _capacity(workload: str, args: Any) -> int:
    """Slots of each engine the workload runs on (the low-load case has its own)."""
    return args.low_capacity if workload == "lowload" else args.capacity


def _run_set(
    args: Any, capacity: int, gateway_capacity: int, workloads: list[str], extra: list[str],
    rows: list[dict[str, Any]], skipped: dict[str, str],
) -> None:
    """Start ``args.engines`` simulated engines of ``capacity`` slots, then each
    target in turn in front of them, and run ``workloads`` on each."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        engines = []
        for _ in range(args.engines):
            port = _free_port()
            proc = _spawn([
                sys.executable, "-c", CLI, "sim-engine", "--port", str(port),
                "--capacity", str(capacity),
                "--prefill-ms-per-token", str(args.prefill_ms),
                "--decode-ms-per-token", str(args.decode_ms),
                "--prefix-cache-tokens", str(args.cache_tokens),
            ])
            procs.append(proc)
            engines.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(engines, procs, strict=True):
            _wait_ready(url, proc)
        for target in args.targets:
            try:
                proc, url = _start_target(target, engines, gateway_capacity, extra)
            except (RuntimeError, OSError) as exc:
                skipped[target] = str(exc)
                print(f"{target}: skipped ({exc})", file=sys.stderr, flush=True)
                continue
            try:
                for name in workloads:
                    cpu = _cpu_s(proc.pid)
                    row = asyncio.run(_workload(name, target, url, engines, args))
                    row["router_cpu_s"] = round(_cpu_s(proc.pid) - cpu, 3)
                    print(json.dumps(row), file=sys.stderr, flush=True)
                    rows.append(row)
            finally:
                _stop(proc)
    finally:
        for proc in procs:
            _stop(proc)


def run(args: Any) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    loaded = [w for w in args.workloads if w != "lowload"]
    if loaded:
        _run_set(args, args.capacity, args.gateway_capacity or args.capacity, loaded, [], rows, skipped)
    if "lowload" in args.workloads:
        # Its own engines (more slots than the load ever takes) and the gateway's
        # prefix_tokens of the case: a conversation's start is its anchor.
        _run_set(args, args.low_capacity, args.low_capacity, ["lowload"],
                 ["--prefix-tokens", str(args.low_prefix_tokens)], rows, skipped)
    return {
        "benchmark": "prefix_routing",
        "cpus": os.cpu_count(),
        "engines": args.engines,
        "engine": f"sim-engine --capacity {args.capacity} --prefill-ms-per-token {args.prefill_ms} "
        f"--decode-ms-per-token {args.decode_ms} --prefix-cache-tokens {args.cache_tokens}",
        "workloads": f"agentic {args.agentic_rounds} rounds of {args.sessions} sessions x {args.turns} turns (system {args.system}, "
        f"task {args.task}, +{args.new_tokens} tokens a turn); grpo {args.rounds} batches of "
        f"{args.groups} groups x {args.group_size}; skewed {args.skewed_requests} requests at concurrency "
        f"{args.concurrency}, 3/4 on a {args.hot}-token hot prefix; lowload {args.low_conversations} "
        f"conversations x {args.low_turns} turns, {args.low_concurrency} in flight, on engines of "
        f"{args.low_capacity} slots, each starting with its own {args.low_prefix} tokens "
        f"(prefix_tokens {args.low_prefix_tokens}); max_tokens {args.max_tokens}",
        "gateway": f"trioforward serve --engine-capacity {args.gateway_capacity or args.capacity}",
        "note": "2 cores shared with other work: compare within this run. smg cache_aware with its "
        "defaults (cache_threshold 0.3, balance_abs_threshold 64, balance_rel_threshold 1.5). "
        "busy_s_per_engine: engine time by the timing model (prefill of computed tokens + "
        "max_tokens decode steps per request).",
        "skipped": skipped,
        "results": rows,
        "ratios": _ratios(rows),
    }


def _floor(batches: list[dict[str, Any]]) -> float | None:
    """Sum over the batches (rounds) of the wall their placement allows at best:
    the busiest engine's time over its slots, or for agentic the longest
    chain's engine time if that is longer (``None`` without batches)."""
    if not batches:
        return None
    return sum(max(b["placement_bound_s"], b.get("chain_bound_s", 0.0)) for b in batches)


def _ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per workload and target: cached share vs session's, wall time vs least-outstanding's."""
    by = {(r["workload"], r["target"]): r for r in rows}
    out = []
    for r in rows:
        session = by.get((r["workload"], "session"))
        least = by.get((r["workload"], "least-outstanding"))
        entry: dict[str, Any] = {"workload": r["workload"], "target": r["target"]}
        if session and session["cached_share"]:
            entry["cached_share_vs_session"] = r["cached_share"] / session["cached_share"]
        if least:
            entry["wall_vs_least_outstanding"] = r["wall_s"] / least["wall_s"]
            entry["work_vs_least_outstanding"] = sum(r["busy_s_per_engine"]) / sum(
                least["busy_s_per_engine"]
            )
            floor, least_floor = _floor(r["batches"]), _floor(least["batches"])
            if floor and least_floor:
                entry["floor_vs_least_outstanding"] = floor / least_floor
        out.append(entry)
    return out


def format_table(report: dict[str, Any]) -> str:
    """The results as a Markdown table (used by ``bench/run_all.py`` for docs/performance.md)."""
    ratios = {(r["workload"], r["target"]): r for r in report.get("ratios", [])}

    def fmt(value: Any, spec: str) -> str:
        return format(value, spec) if isinstance(value, (int, float)) else "–"

    lines = [
        "| workload | router | errors | computed | cached | cached share | vs session | wall s "
        "| vs least-outst. | work vs least-outst. | floor s | walls per round s | lost turns | router CPU s "
        "| p50 ms | p99 ms | requests per engine | busy s per engine | peak engine load | bound |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    for r in report["results"]:
        ratio = ratios.get((r["workload"], r["target"]), {})
        batches = r.get("batches") or []
        floor = _floor(batches)
        lost = sum(b["lost_turns"] for b in batches) if batches and "lost_turns" in batches[0] else None
        split = sum(b.get("split_conversations", 0) for b in batches)
        walls = " ".join(format(b["wall_s"], ".2f") for b in batches) or "–"
        lines.append(
            f"| {r['workload']} | {r['target']} | {r['errors']} | {r['prompt_tokens_computed']} | "
            f"{r['prompt_tokens_cached']} | {fmt(r['cached_share'], '.2f')} | "
            f"{fmt(ratio.get('cached_share_vs_session'), '.2f')} | {fmt(r['wall_s'], '.2f')} | "
            f"{fmt(ratio.get('wall_vs_least_outstanding'), '.2f')} | "
            f"{fmt(ratio.get('work_vs_least_outstanding'), '.2f')} | {fmt(floor, '.2f')} | {walls} | "
            f"{fmt(lost, 'd')}{f' ({split} split)' if 'split_conversations' in (batches or [{}])[0] else ''} | "
            f"{fmt(r.get('router_cpu_s'), '.2f')} | "
            f"{fmt(r['p50_ms'], '.0f')} | "
            f"{fmt(r['p99_ms'], '.0f')} | {' '.join(map(str, r['requests_per_engine']))} | "
            f"{' '.join(format(b, '.1f') for b in r.get('busy_s_per_engine', []))} | "
            f"{r['peak_engine_load']} | {r['bound']} |"
        )
    for target, why in report.get("skipped", {}).items():
        lines.append(f"\n{target} did not run: {why}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description="Prefix routing vs other routers on cached prefill.")
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--capacity", type=int, default=4, help="requests each engine runs at once")
    p.add_argument("--gateway-capacity", type=int, default=0,
                   help="trioforward's engine_capacity (default: --capacity, the engines' own)")
    p.add_argument("--prefill-ms", type=float, default=0.5, help="prefill per uncached token (ms)")
    p.add_argument("--decode-ms", type=float, default=5.0, help="per decode step (ms)")
    p.add_argument("--cache-tokens", type=int, default=1 << 16, help="prefix cache per engine")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--sessions", type=int, default=64, help="agentic sessions per round")
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--system", type=int, default=512, help="shared system prompt (tokens)")
    p.add_argument("--task", type=int, default=256, help="per-session task / question (tokens)")
    p.add_argument("--new-tokens", type=int, default=96, help="new tokens a turn")
    p.add_argument("--agentic-rounds", type=int, default=2, help="agentic rounds, one after the other")
    p.add_argument("--rounds", type=int, default=2, help="GRPO batches, one after the other")
    p.add_argument("--groups", type=int, default=64, help="GRPO groups per batch")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--skewed-requests", type=int, default=480)
    p.add_argument("--concurrency", type=int, default=24)
    p.add_argument("--hot", type=int, default=1536, help="hot prefix (tokens)")
    p.add_argument("--tail", type=int, default=64, help="unique tail of a hot request (tokens)")
    p.add_argument("--low-conversations", type=int, default=40, help="lowload: conversations")
    p.add_argument("--low-turns", type=int, default=5, help="lowload: turns per conversation")
    p.add_argument("--low-concurrency", type=int, default=8, help="lowload: requests in flight")
    p.add_argument("--low-capacity", type=int, default=16, help="lowload: slots per engine")
    p.add_argument("--low-prefix", type=int, default=128,
                   help="lowload: a conversation's own start (tokens = characters)")
    p.add_argument("--low-prefix-tokens", type=int, default=32,
                   help="lowload: the gateway's prefix_tokens (its text anchor: 4 x as many bytes)")
    p.add_argument("--targets", default=",".join(POLICIES))
    p.add_argument("--workloads", default="agentic,grpo,skewed,lowload")
    p.add_argument("--out", default=str(RESULTS / "prefix_routing.json"))
    args = p.parse_args(argv)
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    report = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(format_table(report))
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
