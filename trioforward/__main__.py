"""``python -m trioforward`` is the ``trioforward`` command."""

from trioforward.cli import main

main()
