"""The ``tenants`` knob: the tenant table, as TOML or as one string (docs/configuration.md).

TOML, one table per tenant::

    [tenants.rollouts]
    keys = ["sk-rollouts-1", "sk-rollouts-2"]
    weight = 3
    priority = 0
    max_outstanding = 20000

    [tenants.eval]
    keys = ["sk-eval"]
    priority = 1

The same as a ``TRIOFORWARD_TENANTS`` value or a ``--tenants`` flag: tenants
separated by ``;``, each ``NAME:field=value,...``, several keys separated by
``|``::

    rollouts:keys=sk-rollouts-1|sk-rollouts-2,weight=3,max_outstanding=20000;eval:keys=sk-eval,priority=1
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TenantSpec", "parse_tenants", "TenantSpecError"]

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_FIELDS = ("keys", "weight", "priority", "max_outstanding")


class TenantSpecError(ValueError):
    """A bad tenant table; the message names the tenant and the field."""


@dataclass(frozen=True, slots=True)
class TenantSpec:
    """One row of the tenant table.

    ``keys``: the API keys that are this tenant (Bearer on ``/v1``, ``X-API-Key``
    on ``/api/v1``); ``weight`` (> 0): its share of an engine's capacity among the
    backlogged tenants of its class; ``priority`` (integer, default 0): a higher
    class is served first; ``max_outstanding``: requests (and unfinished Tinker
    samples) it may have admitted at once, 0 = unlimited, beyond which it gets 429
    ``tenant_queue_full``. ``repr`` shows how many keys, never a key.
    """

    keys: tuple[str, ...] = field(default=(), repr=False)
    weight: float = 1.0
    priority: int = 0
    max_outstanding: int = 0


def _number(value: Any, kind: type) -> Any:
    """``value`` as ``kind`` when it is a string or (for a float) a number, else as
    given, for the checks after it to name the field and the value."""
    if isinstance(value, str) or (kind is float and isinstance(value, int) and not isinstance(value, bool)):
        try:
            return kind(value)
        except ValueError:
            return value
    return value


def _spec(name: str, raw: Mapping[str, Any], typed: bool) -> TenantSpec:
    """One tenant's row; ``typed``: from a TOML table, whose values keep their types
    (a string is not read as a number or a key list, as it is in the one-string form)."""
    if not _NAME.fullmatch(name):
        raise TenantSpecError(f"tenant name {name!r} must be 1-64 letters, digits, '_', '.' or '-'")
    unknown = [k for k in raw if k.replace("-", "_") not in _FIELDS]
    if unknown:
        raise TenantSpecError(f"tenant {name!r}: unknown field {unknown[0]!r} (fields: {', '.join(_FIELDS)})")
    values = {k.replace("-", "_"): v for k, v in raw.items()}
    if typed:
        for key, value in values.items():
            if isinstance(value, str):
                wanted = "a list of strings" if key == "keys" else "a number"
                raise TenantSpecError(f"tenant {name!r}: {key} must be {wanted} in TOML, not a string")
    keys = values.get("keys", ())
    if isinstance(keys, str):
        keys = tuple(k for k in keys.split("|") if k)
    if not isinstance(keys, (list, tuple)) or not all(isinstance(k, str) and k for k in keys):
        raise TenantSpecError(f"tenant {name!r}: keys must be a list of non-empty strings")
    weight = _number(values.get("weight", 1.0), float)
    priority = _number(values.get("priority", 0), int)
    limit = _number(values.get("max_outstanding", 0), int)
    if not (isinstance(weight, float) and weight > 0 and math.isfinite(weight)):
        raise TenantSpecError(f"tenant {name!r}: weight must be a number > 0 (got {values.get('weight')!r})")
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TenantSpecError(f"tenant {name!r}: priority must be an integer (got {priority!r})")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise TenantSpecError(f"tenant {name!r}: max_outstanding must be an integer >= 0 (got {limit!r})")
    return TenantSpec(tuple(keys), weight, priority, limit)


def parse_tenants(value: Any, *, typed: bool = False) -> dict[str, TenantSpec]:
    """The tenant table from a TOML table (name -> fields), a string (module
    docstring) or an already-built mapping of :class:`TenantSpec`. ``typed``: the
    table is from a TOML file, where a string value (``keys = "k1"``,
    ``weight = "3"``) is refused naming the field and the type wanted. Raises
    :class:`TenantSpecError` naming the tenant and the field; a key listed for
    two tenants is refused (without showing the key)."""
    if isinstance(value, str):
        table: dict[str, Any] = {}
        for part in (p.strip() for p in value.split(";")):
            if not part:
                continue
            name, sep, rest = part.partition(":")
            if not sep:
                raise TenantSpecError(f"{part.split(',')[0][:40]!r}: expected NAME:field=value,...")
            fields: dict[str, str] = {}
            for item in (i.strip() for i in rest.split(",")):
                if item:
                    k, eq, v = item.partition("=")
                    if not eq:
                        raise TenantSpecError(f"tenant {name.strip()!r}: expected field=value, got {k[:40]!r}")
                    fields[k.strip()] = v.strip()
            table[name.strip()] = fields
        value, typed = table, False
    if not isinstance(value, Mapping):
        raise TenantSpecError("must be a table of tenants ([tenants.NAME])")
    out: dict[str, TenantSpec] = {}
    owner: dict[str, str] = {}
    for name, raw in value.items():
        if isinstance(raw, TenantSpec):
            spec = raw
            row = {"keys": raw.keys, "weight": raw.weight, "priority": raw.priority, "max_outstanding": raw.max_outstanding}
            _spec(str(name), row, False)
        elif isinstance(raw, Mapping):
            spec = _spec(str(name), raw, typed)
        else:
            raise TenantSpecError(f"tenant {name!r} must be a table of keys, weight, priority, max_outstanding")
        for key in spec.keys:
            if key in owner:
                raise TenantSpecError(f"a key of tenant {name!r} is also a key of tenant {owner[key]!r}")
            owner[key] = str(name)
        out[str(name)] = spec
    return out
