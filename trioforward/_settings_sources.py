"""The checks on where knobs come from, a TOML file and ``TRIOFORWARD_*`` variables
(docs/configuration.md): what the reader would otherwise drop without a word."""

from __future__ import annotations

import dataclasses
import difflib
import warnings
from collections.abc import Mapping
from typing import Any

from trioforward._settings import ENV_PREFIX, RENAMED_KNOBS, Settings, SettingsError

__all__ = ["knob_table", "warn_unknown_variables"]

# TRIOFORWARD_* variables that are not knobs: the config file, the process's h11
# (trioforward/_h11.py), the server's worker hand-over (and slot), the real-engine suite's switches.
_OTHER_VARIABLES = ("CONFIG", "H11", "WORKER_SETTINGS", "WORKER_FD", "WORKER_INDEX", "REAL_ENGINE", "RECORD_FIXTURES")


def _knob_names() -> list[str]:
    return [*(f.name for f in dataclasses.fields(Settings)), *RENAMED_KNOBS]


def warn_unknown_variables(env: Mapping[str, str]) -> None:
    """Warn (``UserWarning``) about each ``TRIOFORWARD_*`` variable in ``env`` that is
    neither a knob nor one of the project's own, naming the nearest known one."""
    known = [ENV_PREFIX + n.upper() for n in _knob_names()] + [ENV_PREFIX + n for n in _OTHER_VARIABLES]
    for key in env:
        if key.startswith(ENV_PREFIX) and key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {near[0]}?" if near else ""
            warnings.warn(f"{key} is not a trioforward setting and is ignored{hint}", UserWarning, stacklevel=3)


def knob_table(data: dict[str, Any]) -> dict[str, Any]:
    """The knobs of a parsed TOML file: its ``[trioforward]`` table if it has one
    (other tables may belong to other programs), else its top level. Raises
    :class:`SettingsError` for a knob left at the top level beside a ``[trioforward]``
    table (it would be ignored) and for a ``trioforward`` key that is not a table."""
    if "trioforward" not in data:
        return data
    table = data["trioforward"]
    if not isinstance(table, dict):
        raise SettingsError("trioforward", table, "must be a table of knobs ([trioforward])")
    names = _knob_names()
    for key, value in data.items():
        if key.replace("-", "_") in names:
            raise SettingsError(
                key, value, "is outside the [trioforward] table, so it would be ignored: move it under [trioforward]"
            )
    return table
