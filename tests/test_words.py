"""Counted nouns in log lines and command output (trioforward/_words.py)."""

from __future__ import annotations

import pytest

from trioforward._words import count_of


@pytest.mark.parametrize(
    ("count", "noun", "expected"),
    [
        (1, "retries", "1 retry"),
        (4, "retries", "4 retries"),
        (0, "retries", "0 retries"),
        (1, "successes", "1 success"),
        (1, "processes", "1 process"),
        (1, "consecutive failures", "1 consecutive failure"),
        (1, "requests", "1 request"),
        (2, "started streams", "2 started streams"),
    ],
)
def test_one_is_singular_every_other_count_plural(count: int, noun: str, expected: str) -> None:
    assert count_of(count, noun) == expected
