"""A pause's and a version's values, with no I/O: what a pause request may say
(:func:`pause_conflict`), what a weight version may be (:func:`bad_version_reason`),
the ``X-Weight-Version`` of an answer (:func:`version_label`), and a pause as the
fleet's control plane writes it (:func:`fleet_pause_value` / :func:`fleet_pause_args`;
docs/operations.md, docs/fleet.md)."""

from __future__ import annotations

from typing import Any

from trioforward.codec import span_version
from trioforward.dispatch.rollout._continue import CONTINUE, replay_mode

__all__ = [
    "MAX_VERSION_LENGTH",
    "bad_version_reason",
    "version_label",
    "fleet_pause_value",
    "fleet_pause_args",
    "pause_conflict",
]

MAX_VERSION_LENGTH = 128


def pause_conflict(mode: str, engine_mode: str | None, replay: bool | str | None) -> tuple[str, str] | None:
    """What contradicts itself in a pause request, as ``(message, param)``, or None.

    ``mode: "abort"`` is the gate-only way to end in-flight requests: beside an
    ``engine_mode`` that keeps them (``keep``, ``retract``, ``wait``) it says the
    opposite. ``replay`` re-runs requests the pause ended, so it means something
    only when the pause ends some (docs/operations.md, "What a pause does")."""
    if mode == "abort" and engine_mode not in (None, "abort"):
        return (
            f"'mode': \"abort\" ends in-flight requests, 'engine_mode': \"{engine_mode}\""
            " keeps them: send one of the two",
            "mode",
        )
    if replay and engine_mode != "abort" and not (engine_mode is None and mode == "abort"):
        return (
            "'replay' re-runs requests the pause ended: it needs 'engine_mode': \"abort\""
            " (or 'mode': \"abort\" without 'engine_mode')",
            "replay",
        )
    return None


def bad_version_reason(value: object) -> str | None:
    """Why ``value`` is not a weight version (a short phrase), or ``None`` if it is
    one: printable ASCII of 1..128 characters without a comma. A comma would make
    one version read as two in ``X-Weight-Version`` (``"step-1, step-2"``, see
    :func:`version_label`; docs/operations.md)."""
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= MAX_VERSION_LENGTH
        or not (value.isascii() and value.isprintable())
    ):
        return f"must be printable ASCII of 1..{MAX_VERSION_LENGTH} characters"
    if "," in value:
        return "may not contain a comma (X-Weight-Version separates two versions with one)"
    return None


def version_label(start: str | None, end: str | None) -> str | None:
    """``X-Weight-Version`` of an answer dispatched under ``start`` and finished under
    ``end``: one version, or both (``"step-119, step-120"``) when a keep pause
    spanned an update; ``None`` when no version was ever recorded. A side with no
    version recorded is named as its spans name it, ``"default"``
    (:data:`~trioforward.codec.UNVERSIONED`)."""
    if start == end:
        return start
    return f"{span_version(start)}, {span_version(end)}"


FLEET_PREFIX = "engine:"


def fleet_pause_value(mode: str, engine_mode: str | None, replay: bool | str | None) -> str:
    """The control plane's value for a pause (docs/fleet.md, "Control plane"):
    ``mode`` for a gate-only pause, else ``engine:<engine_mode>[+replay|+continue]``."""
    if engine_mode is None:
        return mode
    how = replay_mode(replay)
    return FLEET_PREFIX + engine_mode + {None: "", "whole": "+replay", CONTINUE: "+continue"}[how]


def fleet_pause_args(value: str) -> dict[str, Any]:
    """``client.pause`` keywords of a member applying control-plane ``value``: its own
    part only, the engines are paused once by the member that took the admin call."""
    if not value.startswith(FLEET_PREFIX):
        return {"mode": value}
    engine_mode, _, flag = value[len(FLEET_PREFIX) :].partition("+")
    replay: bool | str = CONTINUE if flag == CONTINUE else flag == "replay"
    return {"engine_mode": engine_mode, "replay": replay, "call_engines": False}
