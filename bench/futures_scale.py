"""Tinker futures at scale: N outstanding samples through ``/api/v1/asample`` + ``retrieve_future``.

Processes (all on loopback, each its own process):

- ``--engines`` simulated engines (``trioforward sim-engine``, instant by default);
- the gateway (``trioforward serve``, default knobs, no access log);
- an SDK-shaped load generator (aiohttp, one keep-alive session): it creates a
  session and a sampling session, submits N ``asample`` requests (distinct
  ``seq_id``; 429 -> back off 1 s and resubmit the same ``seq_id``, 408/5xx or a
  connection error -> resubmit at once, as the SDK does), and only then retrieves
  every future like the SDK's poll loop: ``retrieve_future`` with a 45 s client
  timeout, re-polled on 408, 5xx or a timeout.

Measured:

- lost: polls answered 404 or 410 for ids the gateway issued (must be 0), and
  results that are not a well-formed ``SampleResponse`` with one sequence of
  ``max_tokens`` tokens;
- memory per outstanding sample: gateway RSS after all N are submitted (none
  retrieved yet: every one is outstanding, pending or finished-undelivered)
  minus RSS before, divided by N (target <= 8 KiB);
- gateway CPU per sample: its user+system time over submit + drain, / N;
- time to submit, time to drain (last result retrieved after submission ended).

    python bench/futures_scale.py --samples 131072

Writes ``bench/results/futures_scale.json``; prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gateway_burst import (  # noqa: E402  (sibling module: spawn, readiness, /proc CPU)
    CLI,
    _free_port,
    _raise_nofile,
    _spawn,
    _stop,
    _wait_ready,
    process_cpu,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
GATEWAY_HOST = "127.0.0.4"
HEADERS = {"content-type": "application/json", "X-API-Key": "tml-bench"}


def process_rss(pid: int) -> tuple[int, int]:
    """``(VmRSS, VmHWM)`` of ``pid`` in bytes."""
    rss = hwm = 0
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    return rss, hwm


# --- load generator (its own process) ---------------------------------------------


class _Loadgen:
    def __init__(self, session: Any, url: str, plan: dict[str, Any]) -> None:
        self.session = session
        self.url = url
        self.plan = plan
        self.counts: dict[str, int] = {
            "asample_429": 0,
            "asample_retries": 0,
            "poll_408": 0,
            "poll_retries": 0,
            "lost_404": 0,
            "lost_410": 0,
            "bad_results": 0,
            "errors": 0,
        }

    async def post(
        self, path: str, body: dict[str, Any], limit_s: float | None = None
    ) -> tuple[int, bytes, str]:
        import aiohttp

        async with self.session.post(
            self.url + path,
            data=json.dumps(body),
            headers=HEADERS,
            timeout=aiohttp.ClientTimeout(total=limit_s),
        ) as response:
            return response.status, await response.read(), response.headers.get("content-type", "")

    async def sampler(self) -> str:
        _, raw, _ = await self.post(
            "/api/v1/create_session", {"tags": [], "user_metadata": {}, "sdk_version": "bench"}
        )
        session_id = json.loads(raw)["session_id"]
        body = {"session_id": session_id, "sampling_session_seq_id": 0, "base_model": "sim-base"}
        _, raw, _ = await self.post("/api/v1/create_sampling_session", body)
        return str(json.loads(raw)["sampling_session_id"])

    async def asample(self, sampler: str, seq: int) -> str:
        tokens = self.plan["max_tokens"]
        body = {
            "type": "sample",
            "num_samples": 1,
            "sampling_session_id": sampler,
            "seq_id": seq,
            "prompt": {
                "chunks": [
                    {
                        "type": "encoded_text",
                        "tokens": [seq % 30000 + j for j in range(self.plan["prompt_tokens"])],
                    }
                ]
            },
            "sampling_params": {
                "max_tokens": tokens,
                "seed": seq,
                "temperature": 1.0,
                "top_k": -1,
                "top_p": 1.0,
            },
            "prompt_logprobs": False,
            "topk_prompt_logprobs": 0,
        }
        while True:
            try:
                status, raw, _ = await self.post("/api/v1/asample", body, limit_s=60)
            except Exception:  # noqa: BLE001 - connection errors: the SDK resubmits
                self.counts["asample_retries"] += 1
                await asyncio.sleep(0.5)
                continue
            if status == 200:
                return str(json.loads(raw)["request_id"])
            if status == 429:
                self.counts["asample_429"] += 1
                await asyncio.sleep(1.0)
            elif status == 408 or status >= 500:
                self.counts["asample_retries"] += 1
            else:
                raise RuntimeError(f"asample answered {status}: {raw[:200]!r}")

    async def retrieve(self, request_id: str) -> None:
        from tinker.proto import tinker_public_pb2 as pb

        while True:
            try:
                status, raw, ctype = await self.post(
                    "/api/v1/retrieve_future",
                    {"request_id": request_id, "allow_metadata_only": True},
                    limit_s=45,
                )
            except Exception:  # noqa: BLE001 - timeouts/connection errors: the SDK re-polls
                self.counts["poll_retries"] += 1
                continue
            if status == 200:
                if "application/x-protobuf" not in ctype:
                    self.counts["errors"] += 1
                    return
                msg = pb.SampleResponse.FromString(raw)
                if (
                    len(msg.sequences) != 1
                    or len(msg.sequences[0].tokens) != 4 * self.plan["max_tokens"]
                ):
                    self.counts["bad_results"] += 1
                return
            if status == 408:
                self.counts["poll_408"] += 1
            elif status in (404, 410):
                self.counts[f"lost_{status}"] += 1
                return
            elif status >= 500:
                self.counts["poll_retries"] += 1
            else:
                self.counts["errors"] += 1
                return


async def _run_loadgen(plan: dict[str, Any]) -> dict[str, Any]:
    import aiohttp

    n, pid = plan["samples"], plan["gateway_pid"]
    connector = aiohttp.TCPConnector(limit=plan["connections"], keepalive_timeout=60)
    async with aiohttp.ClientSession(connector=connector) as session:
        gen = _Loadgen(session, plan["url"], plan)
        sampler = await gen.sampler()

        async def phase(count: int, offset: int, width: int) -> list[str]:
            ids = [""] * count

            async def submitter(k: int) -> None:
                for i in range(k, count, width):
                    ids[i] = await gen.asample(sampler, offset + i)

            await asyncio.gather(*(submitter(k) for k in range(min(width, count))))
            return ids

        async def drain(ids: list[str], width: int) -> None:
            async def poller(k: int) -> None:
                for i in range(k, len(ids), width):
                    await gen.retrieve(ids[i])

            await asyncio.gather(*(poller(k) for k in range(min(width, len(ids)))))

        # Warm-up: connections, code paths and allocator arenas of the gateway.
        await drain(await phase(plan["warmup"], 10**9, plan["connections"]), plan["pollers"])
        await asyncio.sleep(1.0)
        rss0, _ = process_rss(pid)
        cpu0 = process_cpu(pid)
        t0 = time.perf_counter()
        ids = await phase(n, 0, plan["connections"])
        t1 = time.perf_counter()
        rss1, _ = process_rss(pid)
        await drain(ids, plan["pollers"])
        t2 = time.perf_counter()
        cpu2 = process_cpu(pid)
        rss2, hwm = process_rss(pid)
    lost = gen.counts["lost_404"] + gen.counts["lost_410"]
    return {
        "samples": n,
        "distinct_request_ids": len(set(ids)),
        "lost": lost,
        "bad_results": gen.counts["bad_results"] + gen.counts["errors"],
        "submit_s": t1 - t0,
        "drain_s": t2 - t1,
        "total_s": t2 - t0,
        "submit_rate_per_s": n / (t1 - t0),
        "rss_before_mib": rss0 / 2**20,
        "rss_outstanding_mib": rss1 / 2**20,
        "rss_after_drain_mib": rss2 / 2**20,
        "rss_peak_mib": hwm / 2**20,
        "memory_per_outstanding_kib": (rss1 - rss0) / n / 1024,
        "gateway_cpu_s": cpu2 - cpu0,
        "cpu_per_sample_us": 1e6 * (cpu2 - cpu0) / n,
        "counts": gen.counts,
    }


# --- orchestration ------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    _raise_nofile()
    py = sys.executable
    procs = []
    try:
        engine_urls = []
        for _ in range(args.engines):
            port = _free_port("127.0.0.1")
            proc = _spawn(
                [
                    py,
                    "-c",
                    CLI,
                    "sim-engine",
                    "--port",
                    str(port),
                    "--capacity",
                    str(args.engine_capacity),
                    "--decode-ms-per-token",
                    str(args.decode_ms),
                ]
            )
            procs.append(proc)
            engine_urls.append((f"http://127.0.0.1:{port}", proc))
        for url, proc in engine_urls:
            _wait_ready(url, proc)
        port = _free_port(GATEWAY_HOST)
        gw_args = [
            py,
            "-c",
            CLI,
            "serve",
            "--host",
            GATEWAY_HOST,
            "--port",
            str(port),
            "--no-access-log",
            "--log-level",
            "warning",
            "--engine-capacity",
            str(args.engine_capacity),
        ]
        for url, _ in engine_urls:
            gw_args += ["--engine", url]
        gateway = _spawn(gw_args)
        procs.append(gateway)
        url = f"http://{GATEWAY_HOST}:{port}"
        _wait_ready(url, gateway)
        plan = {
            "url": url,
            "gateway_pid": gateway.pid,
            "samples": args.samples,
            "warmup": args.warmup,
            "connections": args.connections,
            "pollers": args.pollers,
            "max_tokens": args.max_tokens,
            "prompt_tokens": args.prompt_tokens,
        }
        import subprocess

        done = subprocess.run(
            [py, __file__, "--loadgen", json.dumps(plan)],
            cwd=ROOT,
            check=True,
            stdout=subprocess.PIPE,
        )
        row = json.loads(done.stdout)
    finally:
        for proc in reversed(procs):
            _stop(proc)
    return {
        "benchmark": "futures_scale",
        "engines": args.engines,
        "engine_capacity": args.engine_capacity,
        "decode_ms_per_token": args.decode_ms,
        "max_tokens": args.max_tokens,
        "prompt_tokens": args.prompt_tokens,
        "client_connections": args.connections,
        "pollers": args.pollers,
        "cpus": os.cpu_count(),
        "target_memory_per_outstanding_kib": 8,
        "results": [row],
    }


def _table(report: dict[str, Any]) -> str:
    r = report["results"][0]
    rows = [
        ("samples", f"{r['samples']:,}"),
        ("lost (404/410)", f"{r['lost']}"),
        ("bad results", f"{r['bad_results']}"),
        ("memory / outstanding sample", f"{r['memory_per_outstanding_kib']:.2f} KiB (target <= 8)"),
        (
            "gateway RSS before / outstanding / peak",
            f"{r['rss_before_mib']:.0f} / {r['rss_outstanding_mib']:.0f} / {r['rss_peak_mib']:.0f} MiB",
        ),
        ("gateway CPU / sample", f"{r['cpu_per_sample_us']:.0f} us"),
        ("submit time", f"{r['submit_s']:.1f} s ({r['submit_rate_per_s']:.0f}/s)"),
        ("drain time", f"{r['drain_s']:.1f} s"),
        (
            "asample 429 / retries",
            f"{r['counts']['asample_429']} / {r['counts']['asample_retries']}",
        ),
        ("poll 408 / retries", f"{r['counts']['poll_408']} / {r['counts']['poll_retries']}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(
        description="Outstanding Tinker futures at scale through the gateway."
    )
    parser.add_argument("--samples", type=int, default=131072, help="outstanding samples to submit")
    parser.add_argument(
        "--warmup", type=int, default=2048, help="samples submitted and drained first"
    )
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--engine-capacity", type=int, default=256)
    parser.add_argument(
        "--decode-ms", type=float, default=0.0, help="simulated decode time per token (ms)"
    )
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument(
        "--connections", type=int, default=256, help="client keep-alive connections"
    )
    parser.add_argument("--pollers", type=int, default=256, help="concurrent retrieve_future polls")
    parser.add_argument("--out", default=str(RESULTS / "futures_scale.json"))
    parser.add_argument("--loadgen", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.loadgen:
        _raise_nofile()
        print(json.dumps(asyncio.run(_run_loadgen(json.loads(args.loadgen)))))
        return None
    report = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(_table(report))
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
