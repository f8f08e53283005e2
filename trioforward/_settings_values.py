"""One knob's value (docs/configuration.md): its kind, read from the annotation of
its :class:`~trioforward.Settings` field, a TOML, environment or CLI value
coerced to that kind, and the checks every value of the kind passes. Raises
:class:`SettingsError` naming the knob and the value.
"""

from __future__ import annotations

import difflib
import math
from types import NoneType, UnionType
from typing import Any, Union, get_args, get_origin

from trioforward._tenant_spec import TenantSpec, TenantSpecError, parse_tenants

__all__ = ["FIELD_KINDS", "RENAMED_KNOBS", "TYPE_NAMES", "SettingsError", "coerce", "kind_of", "validate"]


class SettingsError(ValueError):
    """A knob has a bad value. ``.knob`` names it, ``.value`` is what was given."""

    def __init__(self, knob: str, value: object, reason: str, *, show: bool = True) -> None:
        """``show`` false: ``reason`` already names what was given (a tenant
        table's errors do, without its keys), so no ``(got ...)`` is added."""
        super().__init__(f"setting {knob!r}: {reason}" + (f" (got {value!r})" if show else ""))
        self.knob = knob
        self.value = value


# Knobs renamed, old name -> new: the old name still works for one release (in
# Settings.replace/load, open_client, TOML, TRIOFORWARD_* and `serve --old-name`),
# with a FutureWarning (shown to operators by default, unlike DeprecationWarning).
RENAMED_KNOBS = {"max_queued": "max_outstanding"}

TYPE_NAMES: dict[type, str] = {tuple: "list of strings", dict: "table name = path", TenantSpec: "tenant table"}
_KINDS = (bool, int, float, str, tuple, dict)


def kind_of(name: str, hint: Any) -> tuple[type, bool]:
    """``(kind, optional)`` of a field's annotation: ``int | None`` -> ``(int, True)``,
    ``tuple[str, ...]`` -> ``(tuple, False)``. Raises ``TypeError`` for any other shape."""
    optional = False
    if get_origin(hint) in (Union, UnionType):
        args = [a for a in get_args(hint) if a is not NoneType]
        optional = len(args) < len(get_args(hint))
        if len(args) != 1:
            raise TypeError(f"setting {name!r}: unsupported annotation {hint!r}")
        hint = args[0]
    kind = get_origin(hint) or hint
    if kind not in _KINDS:
        raise TypeError(f"setting {name!r}: unsupported annotation {hint!r}")
    if kind is tuple and get_args(hint) != (str, ...):
        raise TypeError(f"setting {name!r}: only tuple[str, ...] is supported")
    if kind is dict and get_args(hint) == (str, TenantSpec):
        return TenantSpec, optional  # the tenant table: a kind of its own
    if kind is dict and get_args(hint) != (str, str):
        raise TypeError(f"setting {name!r}: only dict[str, str] is supported")
    return kind, optional


# Each knob's (kind, optional), read from the Settings annotations once, at import
# (trioforward/_settings.py fills it: the annotations are Settings').
FIELD_KINDS: dict[str, tuple[type, bool]] = {}


_UNSET_WORDS = ("", "none", "null", "inf", "unlimited")


def coerce(name: str, value: Any, *, toml: bool = False) -> Any:
    """Turn a TOML value or an environment/CLI string into the knob's type.

    ``toml``: ``value`` is from a TOML file, whose values have types of their own:
    a string where the knob is a number, a boolean or a list (``engine_capacity =
    "8"``) is refused naming the knob and the type wanted, as a tenant table's
    string ``keys`` is (``keys = "k1"``), instead of read as text."""
    if name not in FIELD_KINDS:
        near = difflib.get_close_matches(name, [*FIELD_KINDS, *RENAMED_KNOBS], n=1)
        raise SettingsError(name, value, f"unknown setting; did you mean {near[0]!r}?" if near else "unknown setting")
    kind, optional = FIELD_KINDS[name]
    if kind is TenantSpec:
        try:
            return parse_tenants(value, typed=toml)
        except TenantSpecError as exc:
            raise SettingsError(name, "<not shown: it holds API keys>", str(exc), show=False) from None
    unset = optional and isinstance(value, str) and value.strip().lower() in _UNSET_WORDS
    if toml and isinstance(value, str) and kind not in (str, dict) and not unset:
        raise SettingsError(name, value, f"must be {_toml_type(kind)} in TOML, not a string")
    try:
        if isinstance(value, str):
            text = value.strip()
            if optional and text.lower() in _UNSET_WORDS:
                return None
            if kind is tuple:
                return tuple(p.strip() for p in text.split(",") if p.strip())
            if kind is dict:
                pairs = (p.split("=", 1) for p in text.split(",") if p.strip())
                return {k.strip(): v.strip() for k, v in pairs}
            if kind is bool:
                if text.lower() in ("1", "true", "yes", "on"):
                    return True
                if text.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError("expected true or false")
            if kind is int:
                return int(text)
            if kind is float:
                return float(text)
            return text
        if kind is tuple and isinstance(value, (list, tuple)):
            return tuple(value)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        return value
    except ValueError as exc:
        raise SettingsError(name, value, f"cannot read as {_describe(kind, optional)}: {exc}") from None


def _toml_type(kind: type) -> str:
    names = {bool: "a boolean (true/false)", int: "an integer", float: "a number", tuple: "a list of strings"}
    return names.get(kind, kind.__name__)


def _describe(kind: type, optional: bool) -> str:
    return f"{TYPE_NAMES.get(kind, kind.__name__)}{' or unset' if optional else ''}"


def validate(name: str, value: Any) -> None:
    kind, optional = FIELD_KINDS[name]
    if value is None:
        if not optional:
            raise SettingsError(name, value, "must be set")
        return
    if kind is bool:
        if not isinstance(value, bool):
            raise SettingsError(name, value, "must be true or false")
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SettingsError(name, value, "must be an integer")
        if value < 0:
            raise SettingsError(name, value, "must be >= 0")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise SettingsError(name, value, "must be a number")
        if value < 0:
            raise SettingsError(name, value, "must be >= 0")
    elif kind is tuple:
        if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
            raise SettingsError(name, value, "must be a list or tuple of strings")
    elif kind is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise SettingsError(name, value, "must map names to paths")
    elif kind is TenantSpec:
        if not isinstance(value, dict) or not all(isinstance(v, TenantSpec) for v in value.values()):
            raise SettingsError(name, "<not shown>", "must map tenant names to TenantSpec (or be a [tenants.NAME] table)")
    elif kind is str and not isinstance(value, str):
        raise SettingsError(name, value, "must be a string")
