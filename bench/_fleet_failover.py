"""Failover of ``bench/fleet.py``: Tinker samples through ``--workers 2`` (two fleet
members behind one socket, one Valkey), one member killed with SIGKILL halfway.

The load generator behaves as the Tinker SDK does: ``asample`` then
``retrieve_future`` until 200; a broken connection repeats the same call (same
``seq_id``); a 410 (the member that issued the id is gone) resubmits with a new
``seq_id``; 429/503 wait 50 ms and repeat. Every ``asample`` carries
``seed = seq_id``, so the engines' ``by_seed`` counters (``GET /sim/stats``)
count engine-side generations per ``(session, seq)``.

Reported: samples lost (never answered 200: must be 0), duplicates
(``(session, seq)`` generated more than once on the engines: must be 0), samples
run again under a new ``seq_id`` because their member died (expected: those
in flight at the kill), time from the kill to the next completed sample, to the
last sample that was pending at the kill, and to the replacement worker being a
fleet member again; samples/s before and after the kill.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _targets as targets  # noqa: E402

PROMPT = {"chunks": [{"type": "encoded_text", "tokens": [11, 12, 13, 14]}]}
HEADERS = {"content-type": "application/json", "X-API-Key": "tml-bench"}
WINDOW = 256  # samples in flight at once
DECODE_MS = "5"  # engine time per token: 4 tokens = 20 ms a sample


def start_engines(procs: list[subprocess.Popen[bytes]]) -> list[str]:
    urls = []
    for _ in range(2):
        port = targets.free_port("127.0.0.1")
        procs.append(targets.spawn([sys.executable, "-c", targets.CLI, "sim-engine", "--port", str(port),
                                    "--capacity", "0", "--decode-ms-per-token", DECODE_MS]))
        urls.append(f"http://127.0.0.1:{port}")
    for url, proc in zip(urls, procs[-2:], strict=True):
        targets.wait_health(url, proc)
    return urls


def _members(url: str) -> dict[str, Any]:
    try:
        return dict(json.loads(targets._get(url + "/health")[1])["fleet"]["members"])
    except (OSError, ValueError, KeyError):
        return {}


async def _run(url: str, samples: int, deadline: float) -> dict[str, Any]:
    import aiohttp

    seqs = itertools.count()
    attempts: dict[int, list[int]] = {i: [] for i in range(samples)}
    finished: dict[int, float] = {}
    started: set[int] = set()
    counts = {"connection_errors": 0, "gone_410": 0, "busy_429_503": 0, "other": 0}
    kill: dict[str, Any] = {}
    window = asyncio.Semaphore(WINDOW)
    halfway = asyncio.Event()

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=WINDOW)) as session:

        async def call(path: str, body: dict[str, Any]) -> tuple[int, bytes]:
            while True:
                try:
                    async with session.post(url + path, headers=HEADERS, json=body) as r:
                        return r.status, await r.read()
                except (TimeoutError, aiohttp.ClientConnectionError):
                    counts["connection_errors"] += 1
                    await asyncio.sleep(0.01)

        status, raw = await call("/api/v1/create_sampling_session", {
            "session_id": "failover", "sampling_session_seq_id": 0, "base_model": "sim-base"})
        sampler = json.loads(raw)["sampling_session_id"]

        async def one(i: int) -> None:
            async with window:
                started.add(i)
                while True:
                    seq = next(seqs)
                    attempts[i].append(seq)
                    while True:
                        status, raw = await call("/api/v1/asample", {
                            "sampling_session_id": sampler, "seq_id": seq, "num_samples": 1,
                            "prompt": PROMPT, "sampling_params": {"max_tokens": 4, "seed": seq}})
                        if status == 200:
                            break
                        counts["busy_429_503" if status in (429, 503) else "other"] += 1
                        await asyncio.sleep(0.05)
                    request_id = json.loads(raw)["request_id"]
                    while True:
                        status, raw = await call("/api/v1/retrieve_future", {"request_id": request_id})
                        if status == 200:
                            finished[i] = time.perf_counter()
                            if len(finished) >= samples // 2:
                                halfway.set()
                            return
                        if status == 410:
                            counts["gone_410"] += 1
                            break  # resubmit under a new seq_id
                        if status != 408:
                            counts["busy_429_503" if status in (429, 503) else "other"] += 1
                            await asyncio.sleep(0.05)

        async def killer() -> None:
            await halfway.wait()
            members = await asyncio.to_thread(_members, url)
            pid = int(next(iter(members.values()))["pid"])
            kill["pending"] = started - set(finished)
            kill["done_before"] = len(finished)
            kill["at"] = time.perf_counter()
            os.kill(pid, signal.SIGKILL)
            while True:  # the supervisor's replacement joins the fleet
                await asyncio.sleep(0.1)
                members = await asyncio.to_thread(_members, url)
                if len(members) == 2 and all(int(m["pid"]) != pid for m in members.values()):
                    kill["rejoined_s"] = time.perf_counter() - kill["at"]
                    return

        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(deadline):  # what is unfinished then is lost
                await asyncio.gather(killer(), *(one(i) for i in range(samples)))
        except TimeoutError:
            pass
        t1 = time.perf_counter()

    at = kill.get("at", t1)
    after = sorted(t for t in finished.values() if t > at)
    pending = kill.get("pending", set())
    return {
        "samples": samples,
        "lost": samples - len(finished),
        "seconds": t1 - t0,
        "samples_per_s_before_kill": kill.get("done_before", 0) / (at - t0),
        "samples_per_s_after_kill": len(after) / (t1 - at),
        "pending_at_kill": len(pending),
        "first_completion_after_kill_s": after[0] - at if after else None,
        "pending_at_kill_done_s": max((finished[i] for i in pending), default=at) - at,
        "replacement_member_s": kill.get("rejoined_s"),
        "resubmitted_after_410": sum(1 for seqs_ in attempts.values() if len(seqs_) > 1),
        **counts,
        "attempts": attempts,
    }


def run(url: str, engines: list[str], samples: int, deadline: float = 1200.0) -> dict[str, Any]:
    """Drive ``samples`` through the gateway at ``url`` (``--workers 2``) with a kill
    halfway; samples unfinished after ``deadline`` seconds count as lost."""
    report = asyncio.run(_run(url, samples, deadline))
    by_seed: dict[int, int] = {}
    for engine in engines:
        stats = json.loads(targets._get(engine + "/sim/stats", timeout=30)[1])
        for seed, count in stats["by_seed"].items():
            by_seed[int(seed)] = by_seed.get(int(seed), 0) + count
    attempts = report.pop("attempts")
    report["duplicates"] = sum(1 for count in by_seed.values() if count > 1)
    report["engine_generations"] = sum(by_seed.values())
    # Samples the engines generated more than once over all their seq_ids: those
    # whose first member died with the result (a new seq_id ran them again).
    report["run_again"] = sum(
        1 for seqs in attempts.values() if sum(by_seed.get(s, 0) for s in seqs) > 1
    )
    return report


def format_row(r: dict[str, Any]) -> str:
    def sec(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    return (
        "| samples | lost | duplicates | run again | pending at kill | first after kill s "
        "| pending done s | replacement member s | samples/s before / after |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
        f"| {r['samples']} | {r['lost']} | {r['duplicates']} | {r['run_again']} | {r['pending_at_kill']} "
        f"| {sec(r['first_completion_after_kill_s'])} | {sec(r['pending_at_kill_done_s'])} "
        f"| {sec(r['replacement_member_s'])} "
        f"| {r['samples_per_s_before_kill']:.0f} / {r['samples_per_s_after_kill']:.0f} |"
    )
