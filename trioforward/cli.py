"""The ``trioforward`` command: ``serve``, ``sim-engine`` and ``demo``.

Each subcommand lives beside the layer it runs and is imported only when used,
so ``trioforward --help`` stays fast.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

import click

# name -> (module, attribute, one-line help)
_COMMANDS = {
    "serve": ("trioforward.server.app._cli", "serve", "Run the gateway under Hypercorn."),
    "sim-engine": ("trioforward.sim.engine._cli", "sim_engine", "Run a simulated vLLM-compatible engine."),
    "demo": ("trioforward._demo", "demo", "Run the gateway on a simulated fleet and drive it with real clients."),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(_COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in _COMMANDS:
            return None
        module, attr, _ = _COMMANDS[name]
        try:  # every command speaks HTTP/1.1 through it (a bad TRIOFORWARD_H11: exit 2)
            importlib.import_module("trioforward._h11")
        except (ValueError, ImportError) as error:
            raise click.UsageError(str(error)) from None
        command: click.Command = getattr(importlib.import_module(module), attr)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help) for name, (_, _, help) in _COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="trioforward")
def main(**_: Any) -> None:
    """trioforward: a Trio-based sampling gateway for RL trainers."""
    # A warning to an operator (a misspelt TRIOFORWARD_* variable, a renamed
    # knob) is one line naming the problem, not Python's "file:line: UserWarning"
    # followed by a line of our source.
    warnings.formatwarning = _one_line_warning


def _one_line_warning(
    message: Warning | str, category: type[Warning], filename: str, lineno: int, line: str | None = None
) -> str:
    return f"warning: {message}\n"
