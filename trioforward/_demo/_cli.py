"""``trioforward demo``: the gateway on a simulated fleet, driven by real clients."""

from __future__ import annotations

import json
import logging
import os
import resource
import socket
import sys
from typing import Any

import click
import trio
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from trioforward._demo._gateway import fleet_extra_missing
from trioforward._demo._run import Options, Step, run
from trioforward._demo._summary import render_summary
from trioforward._demo._tally import Tally

__all__ = ["demo"]


def _raise_open_files_limit(needed: int) -> None:
    """A burst of N requests holds ~2N sockets in this one process (client and gateway
    side) plus the gateway's engine connections: lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, needed)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def _check_open_files(burst: int) -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 2 * burst + 512
    if soft != resource.RLIM_INFINITY and soft < needed:
        raise click.UsageError(
            f"--burst {burst} needs about {needed} open files but the limit is {soft}; "
            f"lower --burst or raise the limit (ulimit -n)"
        )


def _usage_error(exc: BaseException) -> click.ClickException | None:
    """A setup error meant for the user (a ClickException), possibly inside exception groups."""
    if isinstance(exc, click.ClickException):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        group = exc.subgroup(click.ClickException)
        while isinstance(group, BaseExceptionGroup):
            group = group.exceptions[0] if group.exceptions else None  # type: ignore[assignment]
        return group
    return None


def _check_port_free(port: int) -> None:
    """Fail before anything starts when --port is taken (not half-way through start-up)."""
    if not port:
        return
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise click.BadParameter(f"127.0.0.1:{port} is not free ({exc.strerror})", param_hint="--port") from None


def _check_json_path(json_path: str | None) -> None:
    if json_path and json_path != "-":
        parent = os.path.dirname(os.path.abspath(json_path))
        if not os.path.isdir(parent):
            raise click.BadParameter(f"directory {parent} does not exist", param_hint="--json")


def _interrupted(exc: BaseException) -> bool:
    """Ctrl-C, possibly wrapped in trio's exception groups."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    return isinstance(exc, BaseExceptionGroup) and exc.subgroup(KeyboardInterrupt) is not None


async def _main(opts: Options, tally: Tally, step: Step, bar: Progress) -> dict[str, Any]:
    task = bar.add_task("starting", total=opts.duration)

    async def ticker() -> None:
        while True:
            elapsed = tally.now()
            bar.update(
                task,
                completed=min(elapsed, opts.duration),
                description=f"{step.step:<40} ok {tally.total_ok:>6}  failed {tally.total_failed}",
            )
            await trio.sleep(0.2)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        report = await run(opts, tally, step)
        nursery.cancel_scope.cancel()
    bar.update(task, completed=opts.duration)
    return report


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--engines", "engine_count", type=click.IntRange(1, 64), default=3, show_default=True, metavar="COUNT",
              help="Simulated engines to start (ignored with --engine).")
@click.option("--duration", type=click.FloatRange(2.0), default=40.0, show_default=True, metavar="SECONDS",
              help="Seconds of traffic; the whole run takes a little longer.")
@click.option("--burst", type=click.IntRange(0), default=2000, show_default=True, metavar="REQUESTS",
              help="Concurrent requests in the burst.")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True, metavar="PORT",
              help="Gateway port on 127.0.0.1 (0 = a free port).")
@click.option("--engine", "external", multiple=True, metavar="URL",
              help="A real engine (vLLM/SGLang) to drive instead of the simulated fleet; repeatable.")
@click.option("--workers", type=click.IntRange(1, 16), default=1, show_default=True, metavar="COUNT",
              help="Run the gateway as `trioforward serve --workers COUNT` (one fleet sharing a private "
                   "Valkey; needs the fleet extra) instead of in this process.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Also write the summary as JSON to this file ('-' = stdout).")
def demo(engine_count: int, duration: float, burst: int, port: int, external: tuple[str, ...],
         workers: int, json_path: str | None) -> None:
    """Run the gateway on a simulated fleet and drive it with real clients.

    Starts the engines and the gateway (Hypercorn on loopback) in this process,
    then for --duration seconds drives it with the official tinker SDK (base
    model and a lazily loaded LoRA adapter), the openai SDK (completions, chat,
    streaming) and an httpx trainer loop, while it pauses and resumes for a
    weight update, stops and restarts one engine, and takes a burst of
    concurrent requests. Prints a summary; exits 1 if any request failed.

    With --workers 2 the gateway is `trioforward serve --workers 2` in a child
    process: two workers on one socket, one fleet through a private Valkey
    (docs/fleet.md), and the summary shows the fleet. Exits 2 if the fleet
    extra is missing.
    """
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    logging.basicConfig(level=logging.WARNING)
    if workers > 1 and fleet_extra_missing():
        raise click.UsageError(
            f"--workers {workers} needs the fleet extra: pip install 'trioforward[demo,fleet]'"
        )
    _check_port_free(port)
    _check_json_path(json_path)
    _raise_open_files_limit(2 * burst + 512)
    _check_open_files(burst)
    opts = Options(engines=engine_count, duration=duration, burst=burst, port=port, external=external, workers=workers)
    console = Console(stderr=json_path == "-")
    tally = Tally()
    step = Step()
    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, transient=False) as bar:
            report = trio.run(_main, opts, tally, step, bar)
    except BaseException as exc:
        if _interrupted(exc):
            console.print("[yellow]interrupted[/yellow]: no summary")
            raise SystemExit(130) from None
        usage = _usage_error(exc)
        if usage is not None:
            raise usage from None
        raise
    render_summary(report, tally, console)
    if json_path == "-":
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    elif json_path:
        with open(json_path, "w") as fh:
            json.dump(report, fh, indent=2)
    if not report["ok"]:
        raise SystemExit(1)
