"""The peers of bench/pool_cpu.py: one peer, one size, in its own process.

Each worker makes N tasks; each task sends one warm-up request (opening the N
keep-alive connections), then all of them start the steady phase together and
send requests until the quota is met. The figure is ``time.process_time()``
(user + system CPU of the whole worker process) over the steady phase divided
by the requests completed.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import threading
import time
from typing import Any

BODY = json.dumps(
    {"model": "sim-base", "prompt": [1, 2, 3, 4], "max_tokens": 1, "temperature": 1.0}
).encode()
HEADERS = [(b"content-type", b"application/json")]
TIMEOUT = 300.0  # every peer runs with a 300 s request timeout (aiohttp's default total)


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _quotas(n: int, total: int) -> list[int]:
    """Split ``total`` requests over ``n`` tasks (at least one each)."""
    base, extra = divmod(max(total, n), n)
    return [base + (1 if i < extra else 0) for i in range(n)]


class _Progress:
    """Requests completed in the current phase, and where its CPU clock started.

    A wall-clock cap (``--max-seconds``, for peers whose cost grows with N) may end
    a run early: the figure is then CPU over the requests completed so far
    (a lower bound: the cost per request was still growing) and ``capped`` is set.
    """

    def __init__(self, max_seconds: float) -> None:
        self.phase = "cold"
        self.done = 0
        self.cpu0 = time.process_time()
        self.wall0 = time.perf_counter()
        self.cold_us: float | None = None
        # The cap is a timer thread that reports and ends the process at once: a
        # graceful unwind of thousands of cancelled requests costs O(N) per
        # request in a pool that scans (httpx), i.e. minutes, and measures nothing.
        self._cap = threading.Timer(max_seconds, self._bail)
        self._cap.daemon = True
        self._cap.start()

    def _bail(self) -> None:
        print(json.dumps(self.result(True)), flush=True)
        os._exit(0)

    def finish(self) -> dict[str, Any]:
        """The figure of a run that met its quota (stops the cap)."""
        result = self.result(False)
        self._cap.cancel()
        return result

    def start_steady(self, n: int) -> None:
        self.cold_us = (time.process_time() - self.cpu0) / max(self.done, 1) * 1e6
        # Start the steady phase with no collector debt from the warm-up (every peer).
        gc.collect()
        self.phase, self.done = "steady", 0
        self.cpu0, self.wall0 = time.process_time(), time.perf_counter()

    def result(self, capped: bool) -> dict[str, Any]:
        cpu = time.process_time() - self.cpu0
        return {
            "requests": self.done,
            "cpu_s": cpu,
            "wall_s": time.perf_counter() - self.wall0,
            "cpu_per_request_us": cpu / max(self.done, 1) * 1e6,
            "cold_cpu_per_request_us": self.cold_us,
            "capped": capped,
            "capped_in": self.phase if capped else None,
        }


async def _trio_phases(one: Any, n: int, total: int, max_seconds: float) -> dict[str, Any]:
    """N tasks: each makes one warm-up request (opening the N connections), then all
    start the steady phase together. The same tasks run both phases, so task
    creation is not in the steady figure. ``one()`` is a peer's request coroutine.
    """
    import trio

    progress = _Progress(max_seconds)
    warm, go = trio.Event(), trio.Event()
    left = [n]

    async def run(quota: int) -> None:
        await one()
        progress.done += 1
        left[0] -= 1
        if not left[0]:
            warm.set()
        await go.wait()
        for _ in range(quota):
            await one()
            progress.done += 1

    async with trio.open_nursery() as nursery:
        for quota in _quotas(n, total):
            nursery.start_soon(run, quota)
        await warm.wait()
        progress.start_steady(n)
        go.set()
    return progress.finish()


async def _trioforward(url: str, n: int, total: int, max_seconds: float) -> dict[str, Any]:
    import trio

    from trioforward.http import open_pool

    current_time = trio.current_time
    async with open_pool(idle_expiry=600.0) as pool:
        request = pool.request
        headers: Any = HEADERS

        async def one() -> None:
            response = await request(
                "POST", url, headers=headers, content=BODY, deadline=current_time() + TIMEOUT
            )
            if response.status != 200:
                raise RuntimeError(f"status {response.status}")

        result = await _trio_phases(one, n, total, max_seconds)
        result["opened"] = pool.statistics().opened_total
        return result


async def _httpx(url: str, n: int, total: int, max_seconds: float) -> dict[str, Any]:
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=TIMEOUT) as client:

        async def one() -> None:
            response = await client.post(url, content=BODY, headers=HEADERS)
            if response.status_code != 200:
                raise RuntimeError(f"status {response.status_code}")

        return await _trio_phases(one, n, total, max_seconds)


async def _aiohttp(url: str, n: int, total: int, max_seconds: float) -> dict[str, Any]:
    import asyncio

    import aiohttp

    headers = {"content-type": "application/json"}
    progress = _Progress(max_seconds)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        warm, go = asyncio.Event(), asyncio.Event()
        left = [n]

        async def one() -> None:
            async with session.post(url, data=BODY, headers=headers) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"status {response.status}")
            progress.done += 1

        async def run(quota: int) -> None:
            await one()
            left[0] -= 1
            if not left[0]:
                warm.set()
            await go.wait()
            for _ in range(quota):
                await one()

        async def phases() -> None:
            tasks = [asyncio.ensure_future(run(q)) for q in _quotas(n, total)]
            await warm.wait()
            progress.start_steady(n)
            go.set()
            await asyncio.gather(*tasks)

        await phases()
        return progress.finish()


GC_MODES: dict[str, tuple[int, int, int] | None] = {
    # CPython's defaults: (700, 10, 10).
    "default": None,
    # What `trioforward serve` sets at start-up (trioforward/server/app/_serve.py,
    # tune_gc: gc.freeze() then these thresholds). With thousands of requests in
    # flight, every object a request keeps across an await survives the
    # 700-allocation young collections and is promoted, so under CPython's
    # defaults the collector's share grows with N for any pool
    # (docs/performance.md). Applied to every peer alike.
    "gateway": (20_000, 1_000, 100),
}


def run_worker(peer: str, url: str, n: int, total: int, max_seconds: float, gc_mode: str) -> None:
    raise_fd_limit()
    thresholds = GC_MODES[gc_mode]
    if thresholds is not None:
        gc.collect()
        gc.freeze()
        gc.set_threshold(*thresholds)
    if peer == "aiohttp":
        import asyncio

        result = asyncio.run(_aiohttp(url, n, total, max_seconds))
    else:
        import trio

        fn = _trioforward if peer == "trioforward" else _httpx
        result = trio.run(fn, url, n, total, max_seconds)
    print(json.dumps(result), flush=True)
