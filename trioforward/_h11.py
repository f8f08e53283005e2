"""Which h11 the process speaks HTTP/1.1 with: the compiled one (``h11-mypyc``) when it
is importable, else the pure-Python ``h11`` (docs/performance.md, "Per-request CPU").

``h11-mypyc`` (PyPI; the ``trioforward[speedups]`` extra) is h11's own code with
annotations exact enough for mypyc, compiled: the same API and h11's test suite,
importable as ``h11_mypyc`` beside ``h11`` (source: its README). Its events, states
and sentinels are its own objects, not h11's, so one implementation must be used
end to end by each party that exchanges them: the pool, the simulated engine and
the gateway's front each take :data:`h11` from here.

``TRIOFORWARD_H11`` (read once, at import): unset or ``auto`` — compiled when
importable; ``pure`` — always ``h11``; ``compiled`` — ``h11_mypyc`` or an
``ImportError`` naming the extra. Any other value raises ``ValueError``.

The front server is Hypercorn, whose ``H11Protocol`` imports ``h11`` by name:
:func:`use_for_front` makes that name this choice, before Hypercorn is imported
(``trioforward serve`` and the demo call it first; see docs/server.md).
"""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import TYPE_CHECKING

__all__ = ["ENV", "COMPILED", "PURE", "h11", "name", "use_for_front", "front_h11"]

ENV = "TRIOFORWARD_H11"
COMPILED = "h11_mypyc"
PURE = "h11"
_CHOICES = ("auto", "pure", "compiled")


def _choose(value: str | None) -> ModuleType:
    wanted = (value or "auto").strip().lower()
    if wanted not in _CHOICES:
        raise ValueError(f"{ENV}={value!r}: must be one of {', '.join(_CHOICES)}")
    if wanted != "pure":
        try:
            import h11_mypyc
        except ImportError:
            if wanted == "compiled":
                raise ImportError(
                    f"{ENV}=compiled but h11-mypyc is not installed: "
                    "pip install 'trioforward[speedups]'"
                ) from None
        else:
            return h11_mypyc
    import h11 as pure

    return pure


if TYPE_CHECKING:  # both have h11's API; type-check against h11's
    import h11
else:
    h11 = _choose(os.environ.get(ENV))
    """The chosen implementation (``h11_mypyc`` or ``h11``), a module with h11's API."""
name: str = h11.__name__
"""``"h11_mypyc"`` or ``"h11"``."""


def use_for_front() -> ModuleType:
    """Make :data:`h11` the module Hypercorn imports as ``h11``; returns the module
    Hypercorn's HTTP/1.1 protocol uses (see :func:`front_h11`).

    Works only before ``hypercorn.protocol.h11`` is imported: after that Hypercorn
    holds whatever ``h11`` it got, and this changes nothing (the front stays on it;
    the pool and the sim keep :data:`h11`, which is safe: they exchange no h11
    objects with the front). Other modules that import ``h11`` by name afterwards
    get the chosen one too."""
    if "hypercorn.protocol.h11" not in sys.modules and sys.modules.get("h11") is not h11:
        sys.modules["h11"] = h11
    return front_h11()


def front_h11() -> ModuleType:
    """The h11 module Hypercorn's ``H11Protocol`` uses (imports Hypercorn)."""
    from hypercorn.protocol import h11 as protocol

    module: ModuleType = vars(protocol)["h11"]
    return module
