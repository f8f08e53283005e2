"""Counted nouns in log lines and command output: ``count_of(1, "retries")`` is
``"1 retry"``, ``count_of(4, "retries")`` is ``"4 retries"``."""

from __future__ import annotations

__all__ = ["count_of"]


def count_of(count: int, noun: str) -> str:
    """``"<count> <noun>"`` with the last word of ``noun`` (given in the plural, an
    English count noun such as ``"consecutive failures"`` or ``"processes"``) made
    singular when ``count`` is 1."""
    if count != 1:
        return f"{count} {noun}"
    head, _, last = noun.rpartition(" ")
    if last.endswith("ies"):
        last = last[:-3] + "y"
    elif last.endswith(("sses", "xes", "ches", "shes")):
        last = last[:-2]
    elif last.endswith("s") and not last.endswith("ss"):
        last = last[:-1]
    return f"{count} {head} {last}" if head else f"{count} {last}"
