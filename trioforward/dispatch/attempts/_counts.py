"""What ``replay="continue"`` did for one client (docs/operations.md, "Continue after an abort pause").

Kept by the dispatcher (``Dispatcher.continued``) and counted by the rollout
package's continuation code, so it lives below both.
"""

from __future__ import annotations

from collections import Counter

__all__ = ["ContinueCounts"]


class ContinueCounts:
    """What continuation did for one client: ``answers`` continued, ``continuations``
    sent, ``tokens_kept`` (generated tokens a whole replay would have decoded again),
    ``whole`` (aborted answers replayed whole instead: no token ids, or none generated);
    ``migrations``: generations moved to another engine after theirs failed
    mid-answer, by (route, reason)."""

    __slots__ = ("answers", "continuations", "tokens_kept", "whole", "warned", "migrations")

    def __init__(self) -> None:
        self.answers = self.continuations = self.tokens_kept = self.whole = 0
        # Generations moved to another engine after theirs failed, by (route, reason)
        # (docs/operations.md, "Migration").
        self.migrations: Counter[tuple[str, str]] = Counter()
        self.warned: set[str] = set()  # engines logged for abort answers without token ids
