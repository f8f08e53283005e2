"""trioforward: a Trio-based sampling gateway for reinforcement-learning trainers.

Embedded use (docs/design.md, "Two ways to use it")::

    async with trioforward.open_client(engines=["http://127.0.0.1:8001"]) as client:
        completion = await client.complete(model="base", prompt=[1, 2, 3], max_tokens=16)

Server use: ``trioforward serve --engine http://127.0.0.1:8001``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trioforward._phase import Phase
from trioforward._settings import RENAMED_KNOBS, Knob, Settings, SettingsError, knobs
from trioforward._tenant_spec import TenantSpec

__version__ = "0.1.0"

__all__ = [
    "Phase",
    "Settings",
    "SettingsError",
    "TenantSpec",
    "Knob",
    "knobs",
    "RENAMED_KNOBS",
    "open_client",
    "Client",
    "__version__",
]

if TYPE_CHECKING:
    from trioforward.dispatch import Client, open_client


def __dir__() -> list[str]:
    """The module's names plus the lazily imported ``open_client`` and ``Client``
    (``help()``, ``dir()`` and completion list them)."""
    return sorted({*globals(), *__all__})


def __getattr__(name: str) -> Any:
    # The dispatch core is imported lazily so `import trioforward.http` stays light.
    if name in ("open_client", "Client"):
        from trioforward import dispatch

        return getattr(dispatch, name)
    raise AttributeError(f"module 'trioforward' has no attribute {name!r}")
