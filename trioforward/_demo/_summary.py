"""The demo's end-of-run summary, as rich tables (the same facts as ``--json``)."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.table import Table

from trioforward._demo._tally import Tally, quantile
from trioforward._words import count_of

__all__ = ["render_summary"]


def _ms(value: float | None) -> str:
    return "-" if value is None or value != value else f"{value * 1000:.1f} ms"


def render_summary(report: dict[str, Any], tally: Tally, console: Console) -> None:
    """Print the tables: requests by API, retries, timings, scenario checks."""
    requests = Table(title="Requests by API", title_justify="left")
    requests.add_column("API")
    requests.add_column("requests", justify="right")
    requests.add_column("failed", justify="right")
    requests.add_column("latency p50", justify="right")
    requests.add_column("latency p99", justify="right")
    for api in tally.apis():
        latencies = tally.latency[api]
        failed = tally.failed[api]
        requests.add_row(
            api,
            str(tally.ok[api] + failed),
            f"[red]{failed}[/red]" if failed else "0",
            _ms(quantile(latencies, 0.5)),
            _ms(quantile(latencies, 0.99)),
        )
    style = "bold red" if report["failures"] else "bold green"
    requests.add_row(
        "[bold]total[/bold]",
        str(report["succeeded"] + report["failures"]),
        f"[{style}]{report['failures']}[/{style}]",
        "",
        "",
    )

    retries = Table(title="Gateway retries (phase / reason)", title_justify="left")
    retries.add_column("phase / reason")
    retries.add_column("retries", justify="right")
    for key, count in report["retries"].items():
        retries.add_row(key, str(count))
    if not report["retries"]:
        retries.add_row("(none)", "0")

    timing = Table(title="Gateway time split (from /metrics histograms)", title_justify="left")
    timing.add_column("")
    timing.add_column("p50", justify="right")
    timing.add_column("p99", justify="right")
    timing.add_column("requests", justify="right")
    for label, key in (("queue wait (QUEUED)", "queue_time_seconds"), ("engine time (dispatch → end)", "engine_time_seconds")):
        q = report[key]
        timing.add_row(label, _ms(q["p50"]), _ms(q["p99"]), f"{q['count']:.0f}")

    scenario = Table(title="Scenario", title_justify="left")
    scenario.add_column("step")
    scenario.add_column("result")
    pause = report["scenario"].get("pause")
    if pause:
        verdict = "[green]held[/green]" if pause["held"] else "[red]NOT held[/red]"
        ended = pause.get("ended_by_engines")
        kinds = ", ".join(pause.get("engine_kinds") or []) or "-"
        scenario.add_row(
            "weight update (engine pause abort + continue, resume with a version)",
            f"engines ({kinds}) paused {pause['held_seconds']} s; "
            + (f"{count_of(ended, 'requests')} ended by the engines; " if ended is not None else "")
            + f"{count_of(pause.get('answers_continued', 0), 'answers')} continued from the tokens so far, "
            f"saving {count_of(pause.get('tokens_kept', 0), 'tokens')} of decode; "
            + f"{count_of(pause.get('streams_resubmitted', 0), 'started streams')} ended with an error event, "
            f"resubmitted; {count_of(pause['waited'], 'requests')} waited in QUEUED (longest "
            f"{pause['longest_wait_seconds']} s); dispatch {verdict}; version "
            f"{pause.get('weight_version')} on {count_of(pause.get('answers_with_version', 0), 'answers')} since",
        )
    restart = report["scenario"].get("engine_restart")
    if restart:
        connect = sum(n for key, n in report["retries"].items() if key.startswith("connect/"))
        scenario.add_row(
            "engine drained, killed, restarted",
            f"{restart['engine']} killed at t={restart['stopped_at']} s, back at t={restart['restarted_at']} s; "
            f"{count_of(connect, 'requests')} refused at connect, retried elsewhere; it served "
            f"{count_of(restart.get('completed_after_restart', 0), 'requests')} after restart",
        )
    elif report["mode"] == "external":
        scenario.add_row("engine stopped and restarted", "skipped (real engines are never stopped by the demo)")
    else:
        scenario.add_row("engine stopped and restarted", "skipped (needs at least 2 engines)")
    b = report["scenario"].get("burst")
    if b:
        scenario.add_row("burst", f"{count_of(b['requests'], 'concurrent requests')} in {b['seconds']} s")
    loads = report["adapter_loads"]
    if report["mode"] == "external":
        scenario.add_row("LoRA adapter loads", "skipped (no adapter is known on real engines)")
    else:
        scenario.add_row(
            "LoRA adapter loads (lazy: first request 404, loaded, retried)",
            f"gateway loaded {loads['gateway']}, engines counted {loads['engines']}",
        )
    fleet = report["scenario"].get("fleet")
    if fleet:
        shares = "; ".join(f"{url.rsplit(':', 1)[-1]}: {' + '.join(map(str, parts))}"
                           for url, parts in sorted(fleet["shares"].items()))
        scenario.add_row(
            f"fleet: --workers {fleet['workers']} (one socket, a private Valkey)",
            f"{count_of(fleet['members'], 'worker processes')} in one fleet (pids "
            f"{', '.join(map(str, fleet['pids']))}); each engine's capacity split per worker "
            f"(engine port: shares) {shares or '-'}",
        )
    scenario.add_row(
        "Prometheus metrics",
        f"served at {report['metrics_url']} while the demo ran"
        + (" (the sum over the workers)" if fleet else ""),
    )

    console.print(Group(requests, retries, timing, scenario))
    for example in report["failure_examples"]:
        console.print(f"[red]failure:[/red] {example}")
    for error in report["setup_errors"]:
        console.print(f"[red]set-up error:[/red] {error}")
    failed_checks = [name for name, ok in report["checks"].items() if not ok]
    if failed_checks:
        console.print(f"[bold red]FAILED:[/bold red] {', '.join(failed_checks)}")
    else:
        console.print(
            f"[bold green]OK:[/bold green] {report['succeeded']} requests, 0 failures, "
            f"{report['duration_seconds']} s"
        )
