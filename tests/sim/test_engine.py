"""Engine lifecycle: fleets, outages, the CLI, awaitable counters."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
import trio
import trio.testing
from click.testing import CliRunner
from simclient import Conn, request

from trioforward.sim import SimEngine, open_engine, open_fleet
from trioforward.sim.engine._cli import sim_engine


async def test_fleet_engines_are_independent(fd_baseline: int) -> None:
    async with open_fleet(3, capacity=4, models=("m",)) as engines:
        assert len({e.port for e in engines}) == 3
        for e in engines:
            assert e.capacity == 4 and e.adapters.base == ("m",)
        await request(engines[1], "POST", "/v1/completions", {"prompt": [1]})
        assert [e.stats.completed for e in engines] == [0, 1, 0]
        assert (await request(engines[0], "GET", "/v1/models")).json()["data"][0]["id"] == "m"


async def test_outage_through_the_faults_endpoint(
    fd_baseline: int, autojump_clock: trio.abc.Clock
) -> None:
    async with open_engine() as engine:
        reply = await request(engine, "POST", "/sim/faults", {"outage": 5})
        assert reply.status == 200
        await trio.testing.wait_all_tasks_blocked()
        assert not engine.listening
        with pytest.raises(OSError):
            await trio.open_tcp_stream("127.0.0.1", engine.port)
        await trio.sleep(5.5)
        assert engine.listening
        assert (await request(engine, "GET", "/health")).status == 200


async def test_wait_for_wakes_on_change_without_polling(engine: SimEngine) -> None:
    seen = []

    async def waiter() -> None:
        await engine.stats.wait_for(lambda s: s.completed >= 2)
        seen.append(engine.stats.completed)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        for _ in range(2):
            await request(engine, "POST", "/v1/completions", {"prompt": [1]})
    assert seen == [2]


async def test_expect_100_continue(engine: SimEngine) -> None:
    async with await Conn.open(engine) as conn:
        reply = await conn.request(
            "POST", "/v1/completions", {"prompt": [1]}, headers=[("expect", "100-continue")]
        )
        assert reply.status == 200


async def test_stats_snapshot_is_json_ready(engine: SimEngine) -> None:
    await request(engine, "POST", "/v1/completions", {"model": "sim-base-2", "prompt": [1]})
    snap = engine.stats.snapshot()
    assert snap["by_model"] == {"sim-base-2": 1} and snap["responses"] == {"200": 1}
    assert snap["connections_accepted"] == 1 and snap["peak_running"] == 1


def test_cli_help_lists_every_option() -> None:
    result = CliRunner().invoke(sim_engine, ["--help"])
    assert result.exit_code == 0
    for flag in (
        "--port",
        "--capacity",
        "--prefill-ms-per-token",
        "--decode-ms-per-token",
        "--model",
        "--adapter",
        "--lazy-adapters",
        "--max-model-len",
        "--keep-alive",
        "--host",
    ):
        assert flag in result.output
    assert "RANGE" not in result.output and " TEXT " not in result.output, result.output
    for option in ("--port PORT", "--host ADDRESS", "--decode-ms-per-token MS", "--keep-alive SECONDS"):
        assert option in result.output, option
    bad = CliRunner().invoke(sim_engine, ["--port", "0", "--adapter", "nopath"])
    assert bad.exit_code != 0 and "NAME=PATH" in bad.output


@pytest.mark.parametrize(
    "args",
    [["--capacity", "-3"], ["--decode-ms-per-token", "-1"], ["--keep-alive", "-1"], ["--port", "70000"]],
)
def test_cli_bad_numbers_are_usage_errors_not_tracebacks(args: list[str]) -> None:
    result = CliRunner().invoke(sim_engine, ["--port", "0", *args])
    assert result.exit_code == 2, result.output  # click's usage error, not a crash (exit 1)
    assert args[0] in result.output


async def test_cli_serves_until_terminated(fd_baseline: int) -> None:
    code = "from trioforward.cli import main; main()"
    proc = await trio.lowlevel.open_process(
        [
            sys.executable,
            "-c",
            code,
            "sim-engine",
            "--port",
            "0",
            "--model",
            "cli-model",
            "--capacity",
            "2",
        ],
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        line = b""
        with trio.fail_after(20):
            while b"\n" not in line:
                line += await proc.stderr.receive_some(1024)
        port = int(line.split(b"127.0.0.1:")[1].split(b" ")[0])
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with Conn(stream) as conn:
            models = (await conn.request("GET", "/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["cli-model"]
    finally:
        proc.terminate()
        with trio.fail_after(20):
            await proc.wait()
        await proc.stderr.aclose()  # type: ignore[union-attr]


def test_cli_on_a_taken_port_says_so_without_a_traceback() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(sim_engine, ["--port", str(port)])
    assert result.exit_code == 1, result.output
    assert f"Error: cannot listen on 127.0.0.1:{port}: " in result.output, result.output
    assert result.exception is not None and isinstance(result.exception, SystemExit)
