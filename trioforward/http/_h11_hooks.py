"""The pool's one private hook into h11 (0.16): response headers as a list, in C.

h11's ``Headers`` (``h11._headers.Headers``) is a ``Sequence`` whose iteration
goes through ``__getitem__`` once per header. Its ``_full_items`` list holds
``(raw name, lower-case name, value)`` triples, so ``map(itemgetter(1, 2))``
copies the same pairs without a Python-level call per header: 0.5-1.0 µs instead
of 1.4-2.3 µs for a typical five-header engine answer (docs/performance.md,
"Private hooks"), on every response the pool reads.

Relies on: ``Headers._full_items`` being a list of 3-tuples whose items 1 and 2
are what iterating the ``Headers`` yields. ``tests/http/test_h11_hooks.py``
fails when the installed h11 no longer has that layout; there is no fallback
here, so a changed h11 raises at once instead of silently costing more.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

__all__ = ["header_list"]

_NAME_VALUE = itemgetter(1, 2)


def header_list(headers: Any) -> list[tuple[bytes, bytes]]:
    """h11 response headers (an ``h11._headers.Headers``) as ``[(lower-case name,
    value), ...]`` bytes pairs."""
    return list(map(_NAME_VALUE, headers._full_items))
