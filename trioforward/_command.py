"""The ``trioforward`` console script.

The command comes with the ``server`` extra (``pip install 'trioforward[server]'``,
which brings click); the core alone is a library, and the script says what to
install instead of failing with a traceback.
"""

from __future__ import annotations

import importlib.util
import sys

__all__ = ["main"]


def main() -> None:
    """Run :func:`trioforward.cli.main`, or exit 2 naming the extra to install."""
    if importlib.util.find_spec("click") is None:
        sys.stderr.write(
            "the trioforward command needs the server extra: "
            "pip install 'trioforward[server]' (or 'trioforward[demo]' for `trioforward demo`)\n"
        )
        raise SystemExit(2)
    from trioforward.cli import main as cli

    cli()
