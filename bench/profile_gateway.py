"""Where a proxied request's CPU goes: trioforward's gateway, layer by layer, per burst size.

For each burst size the gateway (``trioforward serve`` with default knobs, in
front of 2 instant simulated engines, as in ``bench/gateway_burst.py``) runs in
a process of its own with two probes: a trio instrument (task steps and tasks
spawned per request) and ``gc.callbacks`` (collector time, per generation).
The load generator of ``bench/gateway_burst.py`` sends keep-alive bursts of
that size; after its warm-up burst (which opens the connections), ``py-spy record`` samples the gateway's
Python stacks (``--nonblocking``, 250 Hz, idle samples dropped) over the
measured bursts, while ``/proc/PID/stat`` gives the process's CPU. Each sample
is assigned to one layer by its innermost trioforward or Hypercorn frame (the
libraries below it — h11, trio, orjson, the kernel's side of a system call —
count for the layer that called them):

- front server: accept, socket reads, HTTP parse (h11 server side), Hypercorn's
  per-request stream and the ASGI hand-over (``_worker``, ``_tcpserver``, ``_appchannel``,
  ``_leanstream``, ``_h11front``, ``_listener``, ``hypercorn.*`` not under the app's ``send``);
- response write: the app's ``send`` down through Hypercorn, h11 and ``write``;
- forwarder: the OpenAI route's own frame (headers, outcome record, access log,
  metrics);
- validation/JSON: ``_validate`` (orjson parse, field checks), ``_auth``;
- dispatch: ``trioforward.dispatch`` (routing, capacity, retries, statistics);
- pool: ``trioforward.http`` (checkout, h11 client, socket I/O);
- scheduler: trio's run loop with no task running (epoll, timeouts, rescheduling,
  a task's exit), and trio code a task runs with no project frame above it;
- probes: the trio instrument's own calls (the cost of measuring);
- collector: ``gc.callbacks`` time (py-spy does not see it; its share is
  taken off the others' total first).

With the compiled h11 (``h11-mypyc``, the default when installed) h11 has no
Python frames: its time is charged to the frame that called it, so the "h11"
parts are empty and their time is in "Hypercorn stream", "Hypercorn + ASGI
send" and the pool's "checkout" part; ``--gateway-env TRIOFORWARD_H11=pure``
profiles the pure one, whose h11 frames py-spy sees.

µs per request of a layer = its share of the samples × (process CPU − collector)
/ requests. The probes add a little (two counters per task step; py-spy reads
memory without stopping the process).

    python bench/profile_gateway.py --sizes 64,8192

Writes ``bench/results/profile_gateway.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import linecache
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

try:  # `python bench/profile_gateway.py`, or bench/ on sys.path (bench/run_all.py)
    import _targets as targets
    import gateway_burst as burst
except ImportError:  # `python -m bench.profile_gateway`
    from bench import _targets as targets  # type: ignore[no-redef]
    from bench import gateway_burst as burst  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
LAYERS = ("front server", "response write", "forwarder", "validation/JSON", "dispatch", "pool",
          "scheduler", "probes", "other", "collector")


# --- the gateway process with its probes --------------------------------------------


def _serve(argv: list[str], dump: str) -> None:
    """``trioforward serve argv`` with a trio instrument and gc callbacks; SIGUSR1
    zeroes the counters, SIGUSR2 writes them to ``dump`` (JSON)."""
    import gc

    import trio

    counters: Counter[str] = Counter()
    gc_started = [0.0]

    class Probe(trio.abc.Instrument):
        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            counters["task_steps"] += 1

        def task_spawned(self, task: trio.lowlevel.Task) -> None:
            counters["tasks_spawned"] += 1

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_started[0] = time.thread_time()
        else:
            counters["gc_cpu_us"] += round(1e6 * (time.thread_time() - gc_started[0]))
            counters[f"gc_gen{info['generation']}"] += 1

    gc.callbacks.append(on_gc)
    signal.signal(signal.SIGUSR1, lambda *_: counters.clear())
    signal.signal(signal.SIGUSR2, lambda *_: Path(dump).write_text(json.dumps(counters)))
    run = trio.run
    trio.run = lambda *a, **kw: run(*a, instruments=[Probe()], **kw)  # type: ignore[assignment]
    from trioforward.cli import main

    sys.argv = ["trioforward", "serve", *argv]
    main()


# --- classifying py-spy's samples -----------------------------------------------------


def _syscall(frame: str) -> bool:
    """Whether ``frame``'s line is a read, write or poll on a socket (the time of a
    C call is charged to the line that made it)."""
    where = frame[frame.rfind("(") + 1:-1]
    path, _, line = where.rpartition(":")
    if not line.isdigit() or "\x00" in path:  # a frame py-spy read torn (--nonblocking)
        return False
    text = linecache.getline(path, int(line))
    return any(call in text for call in ("_read(", "_write(", "os.read(", "os.write(", ".poll("))


def _part(layer: str, stack: list[str]) -> str:
    """The part of a front-server, response-write or pool sample."""
    syscall = bool(stack) and _syscall(stack[-1])
    h11 = any("/h11/" in f for f in stack)
    if layer == "front server":
        if any("/trioforward/_listener.py" in f or f.startswith("serve_listeners ") for f in stack):
            return "accept + connection setup"
        if syscall:
            return "read (system call)"
        return "HTTP parse (h11)" if h11 else "Hypercorn stream + ASGI hand-over"
    if layer == "response write":
        if syscall:
            return "write (system call)"
        return "h11 serialize" if h11 else "Hypercorn + ASGI send"
    if layer == "pool":
        if syscall:
            return "socket I/O (system calls)"
        return "h11 client" if h11 else "checkout, slots, phases, waits"
    return ""


def classify(stack: list[str]) -> tuple[str, str]:
    """``(layer, part)`` of one sample; ``stack``: py-spy's raw frames, root first
    (``"function (path:line)"``). Only the frames above trio's run loop count
    (a task's coroutine frames sit on ``unrolled_run``)."""
    for at in range(len(stack) - 1, -1, -1):
        if stack[at].startswith("unrolled_run "):
            stack = stack[at + 1:]
            break
    else:
        if any(f.startswith("run (") and "/trio/_core/_run.py" in f for f in stack):
            return "scheduler", ""  # trio.run's own frame: waiting for and taking I/O events
        # else a sample whose root py-spy could not read (--nonblocking): by its frames
    if any(f.startswith("Instruments.call ") for f in stack):
        return "probes", ""
    innermost: str | None = None
    under_send = False
    for frame in stack:
        path = frame[frame.rfind("(") + 1:]
        if "/trioforward/" in path or "/hypercorn/" in path:
            innermost = path
            if "/server/proxy/_forward.py" in path or "/server/front/_asgi.py" in path:
                under_send = frame.startswith(("respond ", "_relay_stream "))
    layer = "other"
    if innermost is None:  # the run loop itself, trio's own code in a task, or a truncated sample
        layer = "scheduler" if not stack or any("/trio/" in f for f in stack) else "other"
    elif "/trioforward/http/" in innermost:
        layer = "pool"
    elif "/trioforward/dispatch/" in innermost:
        layer = "dispatch"
    elif "/server/base/_validate.py" in innermost or "/server/front/_auth.py" in innermost:
        layer = "validation/JSON"
    elif any(f"/server/{m}.py" in innermost for m in ("_forward", "_asgi", "_outcome", "_metrics", "_gc")):
        layer = "forwarder"
    elif "/hypercorn/" in innermost or any(
        m in innermost for m in ("/server/front/_worker.py", "/server/front/_tcpserver.py", "/server/front/_appchannel.py",
                                 "/server/front/_leanstream.py", "/server/front/_h11front.py",
                                 "/trioforward/_listener.py")
    ):
        layer = "response write" if under_send else "front server"
    return layer, _part(layer, stack)


def _layers(raw: Path) -> tuple[Counter[str], Counter[str], int]:
    """Samples per layer, per ``"layer: part"``, and in all."""
    counts: Counter[str] = Counter()
    parts: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack_text, _, count_text = line.rpartition(" ")
        if not stack_text or not count_text.isdigit():
            continue
        frames = [f for f in stack_text.split(";") if f and not f.startswith(("process ", "thread "))]
        n = int(count_text)
        layer, part = classify(frames)
        counts[layer] += n
        if part:
            parts[f"{layer}: {part}"] += n
        total += n
    return counts, parts, total


# --- orchestration ------------------------------------------------------------------


def profile_size(
    size: int, engines: list[str], rate: int, min_requests: int, keep_raw: Path | None,
    extra: list[str] = [],  # noqa: B006 - never mutated
    gateway_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One fresh gateway profiled at bursts of ``size``; ``keep_raw``: the JSON
    path beside which py-spy's samples are kept (``NAME_SIZE.txt``), or None."""
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        dump, raw = Path(tmp) / "counters.json", Path(tmp) / "samples.txt"
        host = targets.HOSTS["trioforward"]
        port = targets.free_port(host)
        argv = ["--host", host, "--port", str(port), "--no-access-log", "--log-level", "warning", *extra]
        for url in engines:
            argv += ["--engine", url]
        proc = targets.spawn([sys.executable, __file__, "--serve", json.dumps(argv), "--dump", str(dump)],
                             env=gateway_env)
        procs.append(proc)
        try:
            url = f"http://{host}:{port}"
            targets.wait_serving(url, engines, proc)
            target = {"name": "trioforward", "urls": [url], "pid": proc.pid, "keep_alive": 75.0}
            rounds = max(1, -(-min_requests // size))
            plan = {"sizes": [size], "targets": [target], "engines": engines, "min_requests": size * rounds,
                    "handshake": True}
            loadgen = subprocess.Popen([sys.executable, burst.__file__, "--loadgen", json.dumps(plan)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            assert loadgen.stdin is not None and loadgen.stderr is not None
            if loadgen.stderr.readline().strip() != b"warm":  # the warm-up burst opened the connections
                raise RuntimeError("load generator failed during the warm-up burst")
            os.kill(proc.pid, signal.SIGUSR1)
            spy = subprocess.Popen(["py-spy", "record", "--pid", str(proc.pid), "--rate", str(rate), "--nonblocking",
                                    "--full-filenames", "--format", "raw", "--output", str(raw)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # py-spy attaches
            cpu0 = burst.process_cpu(proc.pid)
            stdout, _ = loadgen.communicate(b"go\n")
            cpu = burst.process_cpu(proc.pid) - cpu0
            os.kill(proc.pid, signal.SIGUSR2)
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=30)
            if loadgen.returncode:
                raise RuntimeError(f"load generator exited with {loadgen.returncode}")
            rows = json.loads(stdout)
            deadline = time.monotonic() + 5
            while not dump.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            counters = json.loads(dump.read_text())
            counts, parts, samples = _layers(raw)
            if keep_raw is not None:
                keep_raw.with_name(f"{keep_raw.stem}_{size}.txt").write_text(raw.read_text())
        finally:
            for p in procs:
                targets.stop(p)
    requests = rows[-1]["requests"]
    gc_us = counters.get("gc_cpu_us", 0) / requests
    rest_us = 1e6 * cpu / requests - gc_us
    layers = {name: rest_us * counts.get(name, 0) / samples for name in LAYERS if name != "collector"}
    layers["collector"] = gc_us
    details = {name: rest_us * n / samples for name, n in sorted(parts.items())}
    return {
        "size": size,
        "requests": requests,
        "cpu_per_request_us": 1e6 * cpu / requests,
        "samples": samples,
        "layers_us": layers,
        "parts_us": details,
        "task_steps_per_request": counters.get("task_steps", 0) / requests,
        "tasks_per_request": counters.get("tasks_spawned", 0) / requests,
        "collections": {k: v for k, v in counters.items() if k.startswith("gc_gen")},
        "throughput_rps": rows[-1]["throughput_rps"],
    }


def format_table(report: dict[str, Any]) -> str:
    """Markdown: one row per layer (and the parts of the front server, the response
    write and the pool), one column per burst size."""
    runs = report["results"]
    head = "| layer | " + " | ".join(f"µs/req at {r['size']}" for r in runs) + " |"
    lines = [head, "|---|" + "---:|" * len(runs)]
    parts = sorted({p for r in runs for p in r.get("parts_us", {})})
    for name in LAYERS:
        lines.append(f"| {name} | " + " | ".join(f"{r['layers_us'].get(name, 0):.0f}" for r in runs) + " |")
        for part in (p for p in parts if p.startswith(name + ": ")):
            lines.append(f"| &nbsp;&nbsp;{part.split(': ', 1)[1]} | "
                         + " | ".join(f"{r['parts_us'].get(part, 0):.0f}" for r in runs) + " |")
    lines.append("| **total (process CPU)** | " + " | ".join(f"**{r['cpu_per_request_us']:.0f}**" for r in runs) + " |")
    lines.append("| task steps per request | " + " | ".join(f"{r['task_steps_per_request']:.1f}" for r in runs) + " |")
    lines.append("| tasks spawned per request | " + " | ".join(f"{r['tasks_per_request']:.2f}" for r in runs) + " |")
    lines.append("| py-spy samples | " + " | ".join(str(r["samples"]) for r in runs) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,8192")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--min-requests", type=int, default=16384)
    parser.add_argument("--keep-raw", action="store_true",
                        help="keep py-spy's samples beside --out (profile_gateway_SIZE.txt)")
    parser.add_argument("--gateway-args", default="",
                        help="extra `trioforward serve` flags, e.g. '--engine-capacity 0'")
    parser.add_argument("--gateway-env", default="",
                        help="VAR=VALUE[,VAR=VALUE] for the gateway process, e.g. TRIOFORWARD_H11=pure")
    parser.add_argument("--out", default=str(RESULTS / "profile_gateway.json"))
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--dump", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _serve(json.loads(args.serve), args.dump)
        return None
    burst._raise_nofile()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        engines = targets.start_engines(2, procs)
        results = [profile_size(int(s), engines, args.rate, args.min_requests,
                                Path(args.out) if args.keep_raw else None, args.gateway_args.split(),
                                dict(kv.split("=", 1) for kv in args.gateway_env.split(",") if kv) or None)
                   for s in args.sizes.split(",")]
    finally:
        for p in procs:
            targets.stop(p)
    report = {
        "benchmark": "profile_gateway",
        "method": "per size: fresh gateway, warm-up burst (not measured), then py-spy (--nonblocking, idle dropped) over "
        "bursts of that size; layer µs = sample share × (process CPU − gc callback time) / requests",
        "rate_hz": args.rate,
        "gateway_args": args.gateway_args,
        "gateway_env": args.gateway_env,
        "results": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(format_table(report))
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
