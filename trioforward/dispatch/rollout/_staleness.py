"""Weight versions in order, and which of them a request accepts (docs/operations.md,
"Which weights a request accepts").

Versions are ordered as the gateway resumed them: index 0 is the weights before
any ``resume(weight_version=...)`` (spans name them ``"default"``), the first
version resumed is 1, the next new one 2, and so on; resuming a version already
seen makes it current again without a new index (a rollback). An engine runs the
version it was last resumed with or reported (``Engine.reported_version``; one
never told any runs index 0, one with a name the gateway never resumed is read
as index 0 too).

A request's :class:`WeightPolicy` (the ``X-Weight-Policy`` header, or
``weight_policy=`` of the embedded client) is one of

| policy | engines it may go to |
|---|---|
| ``latest`` | those on the current version (during a rolling update it waits for updated ones) |
| ``min_version=V`` | those on ``V`` or a later version (it waits until ``V`` is resumed) |
| ``max_staleness=k`` | those at most ``k`` versions behind the current one |

None (the default) keeps today's rule: any eligible engine. A request no
engine satisfies waits in QUEUED, as behind a pause, bounded by ``queue_timeout``
only (``_queueing.acquire``). An answer's staleness is the number of versions the
version it ended on is behind the current one when it ends (``X-Weight-Staleness``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trioforward.dispatch.engines._engines import Engine
from trioforward.dispatch.rollout._pause_args import bad_version_reason

__all__ = [
    "WeightPolicy",
    "VersionOrder",
    "parse_policy",
    "ended_on",
    "POLICY_HEADER",
    "STALENESS_HEADER",
]

POLICY_HEADER = "x-weight-policy"
STALENESS_HEADER = b"x-weight-staleness"
#: Largest ``max_staleness`` accepted (a bigger bound would mean "any").
MAX_STALENESS = 1_000_000


@dataclass(frozen=True, slots=True)
class WeightPolicy:
    """Which weights a request accepts: ``kind`` is ``"latest"``, ``"min_version"``
    (``version`` set) or ``"max_staleness"`` (``staleness`` >= 0 set)."""

    kind: str
    version: str | None = None
    staleness: int = 0

    def __str__(self) -> str:
        if self.kind == "min_version":
            return f"min_version={self.version}"
        if self.kind == "max_staleness":
            return f"max_staleness={self.staleness}"
        return self.kind


LATEST = WeightPolicy("latest")


def parse_policy(text: str) -> WeightPolicy:
    """``"latest"``, ``"min_version=V"`` or ``"max_staleness=k"`` (spaces around the
    parts ignored) as a :class:`WeightPolicy`; raises ``ValueError`` saying what
    is wrong (the gateway answers it 400, param ``X-Weight-Policy``)."""
    name, eq, value = (part.strip() for part in text.partition("="))
    if name == "latest" and not eq:
        return LATEST
    if name == "min_version" and eq:
        reason = bad_version_reason(value)
        if reason is not None:
            raise ValueError(f"weight policy min_version: the version {reason}")
        return WeightPolicy("min_version", version=value)
    if name == "max_staleness" and eq:
        if not value.isdigit() or int(value) > MAX_STALENESS:
            raise ValueError(
                f"weight policy max_staleness must be a whole number of versions"
                f" 0..{MAX_STALENESS} (got {value!r})"
            )
        return WeightPolicy("max_staleness", staleness=int(value))
    raise ValueError(
        f"weight policy must be 'latest', 'min_version=V' or 'max_staleness=k' (got {text!r})"
    )


def ended_on(engine: Engine | None, current: str | None) -> str | None:
    """The version an answer of ``engine`` ended on: the engine's own (a rolling
    update leaves some engines on an older one), else the recorded ``current``."""
    runs = None if engine is None else engine.reported_version
    return current if runs is None else runs


class VersionOrder:
    """The versions of one client in the order they were resumed (see the module).

    ``on_advance``: called (synchronously) each time the current version
    changes, after it changed: the admission gate and the engines' waiters
    (``Registry.notify_changed``) hang on it."""

    __slots__ = ("_index", "current", "current_index", "on_advance")

    def __init__(self) -> None:
        self._index: dict[str, int] = {}
        self.current: str | None = None
        self.current_index = 0
        self.on_advance: list[Callable[[], None]] = []

    def record(self, version: str) -> None:
        """``version`` was resumed: it is current (a new one gets the next index)."""
        index = self._index.get(version)
        if index is None:
            index = self._index[version] = len(self._index) + 1
        if version == self.current:
            return
        self.current, self.current_index = version, index
        for hook in self.on_advance:
            hook()

    def index(self, version: str | None) -> int | None:
        """The index of ``version`` (0 for ``None``: the weights before any resume;
        ``None`` for a name never resumed)."""
        if version is None:
            return 0
        return self._index.get(version)

    def behind(self, version: str | None) -> int:
        """How many versions ``version`` is behind the current one (>= 0; a name
        never resumed counts as index 0)."""
        index = self.index(version)
        return max(0, self.current_index - (index or 0))

    def engine_index(self, engine: Engine) -> int:
        """The index of the version ``engine`` runs (see the module)."""
        return self.index(engine.reported_version) or 0

    def accepts(self, policy: WeightPolicy) -> Callable[[Engine], bool]:
        """The engine filter of ``policy``, read at each routing (versions move)."""
        if policy.kind == "latest":
            return lambda engine: self.engine_index(engine) >= self.current_index
        if policy.kind == "max_staleness":
            k = policy.staleness
            return lambda engine: self.current_index - self.engine_index(engine) <= k
        wanted = policy.version

        def at_least(engine: Engine) -> bool:
            floor = self.index(wanted)
            return floor is not None and self.engine_index(engine) >= floor

        return at_least
