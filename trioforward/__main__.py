"""``python -m trioforward`` is the ``trioforward`` command."""

from trioforward._command import main

main()
