"""One forwarded request's state, and the header rules applied to it.

A :class:`Request` lives from ``client.post``/``client.stream`` to the answer;
it is what waits in an engine's queue (for its tenant), the handle ``pause(mode="abort")`` cancels through,
and where attempts, phases and times accumulate for errors and statistics.

Its identity is here too (docs/server.md, "Request ids and rollout groups"):
``request_id`` (the caller's ``X-Request-Id`` or one the gateway made, set
before dispatch and never changed), ``engine_request_id`` (the id the current
attempt sent the engine, fresh per attempt, also in ``engine_request_ids``)
and ``group`` (the rollout group, or ``None``). A hook that follows a request
(tracing, logging) reads them from the ``Request`` it is handed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, TypeVar

import trio

from trioforward import Phase
from trioforward.dispatch.attempts._policy import RetryCounts
from trioforward.errors import DispatchAborted, TrioforwardError

if TYPE_CHECKING:
    from trioforward.dispatch.attempts._tracing import RequestTrace
    from trioforward.dispatch.engines._engines import Engine
    from trioforward.dispatch.engines._prefix import PrefixKey
    from trioforward.dispatch.engines._tenants import Tenant
    from trioforward.http import StreamResponse

__all__ = [
    "Request",
    "OnDispatch",
    "HeaderInput",
    "HeaderIdentity",
    "prepare_headers",
    "strip_response_headers",
    "HOP_BY_HOP",
]

# RFC 9110 §7.6.1 connection-specific fields, plus Host and Content-Length which the
# pool computes for the upstream hop (and the server for the downstream one).
HOP_BY_HOP = frozenset(
    (
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"host",
        b"content-length",
    )
)

Headers = list[tuple[str | bytes, str | bytes]]
# Called as each attempt starts: (engine base URL, attempt number from 1, seconds
# queued so far). For logging what a request reached before it ended.
OnDispatch = Callable[[str, int, float], None]

HeaderInput = (
    Mapping[str, str] | Mapping[bytes, bytes] | Iterable[tuple[str | bytes, str | bytes]] | None
)

E = TypeVar("E", bound=TrioforwardError)

#: Seconds: how often a request frozen on a keep-paused engine rechecks its moved
#: deadline while the pause lasts (docs/operations.md, "Frozen time is not charged (keep)").
FROZEN_RECHECK = 0.1

_JSON_ONLY: Headers = [(b"content-type", b"application/json")]
_NO_HEADERS: Headers = []


def _b(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("latin-1")


class HeaderIdentity:
    """What :func:`prepare_headers` read from the caller's headers (text, or ``None``)."""

    __slots__ = ("session", "request_id", "group", "policy")

    def __init__(self) -> None:
        self.session: str | None = None
        self.request_id: str | None = None
        self.group: str | None = None
        self.policy: str | None = None  # X-Weight-Policy (dispatch/rollout/_staleness.py)


_NO_IDENTITY = HeaderIdentity()  # read-only: what no headers say


def prepare_headers(headers: HeaderInput, *, json_body: bool) -> tuple[Headers, HeaderIdentity]:
    """Headers to send upstream (hop-by-hop removed) and what they say of the
    request: ``X-Session-ID``, ``X-Request-Id``, ``X-Rollout-Group`` and
    ``X-Weight-Policy`` values.

    ``X-Request-Id``, ``X-Rollout-Group`` and ``X-Weight-Policy`` are not forwarded
    as they are: each attempt sends its own engine-side id (``Dispatcher``), and
    the group and the policy are the gateway's. With no caller headers the shared ``[(content-type,
    application/json)]`` list is returned (never mutated): no allocation on the
    common path.
    """
    if not headers:
        return (_JSON_ONLY if json_body else _NO_HEADERS), _NO_IDENTITY
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    out: Headers = []
    said = HeaderIdentity()
    has_type = False
    for name, value in pairs:
        lname = _b(name).lower()
        if lname in HOP_BY_HOP:
            continue
        bvalue = _b(value)
        if lname == b"x-session-id":
            said.session = bvalue.decode("latin-1")
        elif lname == b"x-request-id":
            said.request_id = bvalue.decode("latin-1")
            continue
        elif lname == b"x-rollout-group":
            said.group = bvalue.decode("latin-1")
            continue
        elif lname == b"x-weight-policy":
            said.policy = bvalue.decode("latin-1")
            continue
        elif lname == b"content-type":
            has_type = True
        out.append((lname, bvalue))
    if json_body and not has_type:
        out.append(_JSON_ONLY[0])
    return out, said


def strip_response_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The engine's response headers without hop-by-hop ones (names are lower-case)."""
    return [h for h in headers if h[0] not in HOP_BY_HOP]


def _unnamed() -> Tenant:
    from trioforward.dispatch.engines._tenants import Tenant

    return Tenant("default")


class Request:
    """Per-request dispatch state; what an engine's queue holds (``_fair.py``)."""

    __slots__ = (
        "method",
        "url_path",
        "headers",
        "content",
        "model",
        "is_adapter",
        "session",
        "prefix",
        "scope",
        "queue_scope",
        "rerouted",
        "tenant",
        "admitted",
        "abort_reason",
        "phase",
        "attempts",
        "engine",
        "queue_time",
        "engine_time",
        "dispatched_at",
        "retries",
        "counts",
        "on_dispatch",
        "streaming",
        "handed_over",
        "replay",
        "deadline",
        "frozen_since",
        "frozen_time",
        "weight_version",
        "trace",
        "asked_ids",
        "token_strings",
        "request_id",
        "group",
        "engine_request_id",
        "engine_request_ids",
        "only",
        "accepts",
        "origin",
        "last_version",
        "admission_time",
        "admission_scope",
        "render",
        "aborted_by_call",
        "left",
        "stream_body",
        "tasks",
        "migrations",
        "shunned",
    )

    def __init__(
        self,
        method: str,
        url_path: str,
        headers: Headers,
        content: bytes,
        model: str | None,
        is_adapter: bool,
        session: int | None,
        request_id: str = "",
        group: str | None = None,
        *,
        tenant: Tenant | None = None,
    ) -> None:
        self.method = method
        self.url_path = url_path
        self.headers = headers
        self.content = content
        self.model = model
        self.is_adapter = is_adapter
        self.session = session
        self.prefix: PrefixKey | None = None  # set under routing = "prefix"
        self.scope = trio.CancelScope()
        self.queue_scope: trio.CancelScope | None = None
        self.rerouted = False
        # Whose share of the engines it is served from (the client always names
        # one; a Request built on its own belongs to a tenant of its own).
        self.tenant = tenant if tenant is not None else _unnamed()
        # Counted in ``outstanding`` (the client's and its tenant's) by an outer
        # admission (Dispatcher.admission): a replay or a continuation of an
        # admitted request, which is the same request, not one more.
        self.admitted = False
        self.abort_reason: str | None = None
        self.phase = Phase.QUEUED
        self.attempts = 0
        self.engine: Engine | None = None
        self.queue_time = 0.0
        self.engine_time = 0.0
        self.dispatched_at: float | None = None  # while holding an engine's capacity
        self.retries: list[tuple[str, str]] | None = None
        self.counts: RetryCounts | None = None
        self.on_dispatch: OnDispatch | None = None
        # Weight updates (dispatch/rollout/_weights.py): a stream / its head went to the
        # caller; None, or whether an engine pause that ended it asked for a
        # replay; frozen on a keep-paused engine since (trio clock) / for (s);
        # the weight version when it was dispatched.
        self.streaming = False
        self.handed_over = False
        self.replay: bool | str | None = None
        self.deadline = math.inf  # the dispatch deadline on its current engine
        self.frozen_since: float | None = None
        self.frozen_time = 0.0
        self.weight_version: str | None = None
        # Its spans (_tracing.RequestTrace) when the client traces, else None.
        self.trace: RequestTrace | None = None
        # The gateway added return_token_ids to the body (dispatch/rollout/_continue.py):
        # the answer's token-id lists are the gateway's, not the caller's.
        self.asked_ids = False
        # vLLM's token route: the caller asked for return_tokens_as_token_ids
        # (dispatch/dialects/_routes.py, token_strings).
        self.token_strings = False
        # Identity (docs/server.md, "Request ids and rollout groups").
        self.request_id = request_id
        self.group = group
        self.engine_request_id: str | None = None  # the current attempt's
        self.engine_request_ids: list[str] = []  # every attempt's, in order
        # The dialect seam (_dialect.py): engines this request may go to (None:
        # any), and the body of each attempt made for an engine (None: ``url_path``
        # and ``content`` as they are) — a token-level request rendered in that
        # engine's dialect with the attempt's engine-side id.
        self.only: Callable[[Engine], bool] | None = None
        self.render: Callable[[Engine, str], tuple[str, bytes]] | None = None
        # Its weight policy's engine filter (None: any version; read at each
        # routing, versions move: dispatch/rollout/_staleness.py), and the
        # staleness-bounded admission: seconds it waited there, and that wait's
        # scope while it waits (dispatch/rollout/_admission.py). Neither is
        # charged to any dispatch budget.
        self.accepts: Callable[[Engine], bool] | None = None
        # The request a continuation was made for (itself if none), and the
        # version its latest dispatch (a continuation's included) ran on: an
        # answer's staleness is measured from it.
        self.origin: Request = self
        self.last_version: str | None = None
        self.admission_time = 0.0
        self.admission_scope: trio.CancelScope | None = None
        # An abort call (_abort.py) ended it: answered normally, never replayed;
        # set once it has left the client (only while an abort call waits); the
        # open body of its stream once handed over (cut from the abort's task).
        self.aborted_by_call = False
        self.left: trio.Event | None = None
        self.stream_body: StreamResponse | None = None
        # A stream's nursery while its block is open (_replay.replaying_stream):
        # where a continuation after an abort pause runs its sub-streams.
        self.tasks: trio.Nursery | None = None
        # Moved to another engine after its engine failed mid-answer
        # (dispatch/rollout/_migration.py): how many times, and the engines
        # (URLs) its continuations stay off.
        self.migrations = 0
        self.shunned: tuple[str, ...] = ()

    def abort(self, reason: str) -> None:
        """Cancel this request from outside (pause ``mode="abort"``, engine removal)."""
        if self.abort_reason is None:
            self.abort_reason = reason
        self.scope.cancel()
        if self.admission_scope is not None:
            self.admission_scope.cancel()

    def extended_deadline(self) -> float:
        """The dispatch deadline moved by the time this request was frozen on a
        keep-paused engine (so far, if it still is): the pool's ``extend`` hook."""
        if self.frozen_since is None:
            return self.deadline + self.frozen_time
        # Still frozen: the moved deadline is only known at resume. Until then it is
        # "the budget left when the freeze began, from now" — but at least
        # FROZEN_RECHECK ahead, or a freeze that began just before the deadline
        # would wake the request in ever smaller steps for the whole pause.
        now = trio.current_time()
        left = self.deadline + self.frozen_time - self.frozen_since
        return now + max(left, FROZEN_RECHECK)

    def rearm(self) -> None:
        """Ready a request an engine pause ended for its replay (a fresh cancel scope)."""
        self.scope = trio.CancelScope()
        self.abort_reason = None
        self.replay = None

    @property
    def engine_url(self) -> str | None:
        return self.engine.url if self.engine is not None else None

    def engine_time_now(self) -> float:
        """Seconds dispatched so far (s), including the engine it is on now."""
        if self.dispatched_at is None:
            return self.engine_time
        return self.engine_time + trio.current_time() - self.dispatched_at

    def stamp(self, err: E) -> E:
        """Fill in what ``err`` reports about this request: ``.attempts``,
        ``.engine``, ``.queue_time``, ``.engine_time`` (s) and ``.request_id``.
        The one place these fields are set; returns ``err``."""
        err.request_id = self.request_id
        err.attempts = self.attempts
        err.engine = self.engine_url
        err.queue_time = self.queue_time
        err.engine_time = self.engine_time_now()
        return err

    def aborted(self) -> DispatchAborted:
        """The error of a request cancelled through :meth:`abort` (not yet stamped)."""
        reason = self.abort_reason or "request aborted"
        return DispatchAborted(f"{reason}; the request was aborted", phase=self.phase)

    def retry_counts(self) -> RetryCounts:
        counts = self.counts
        if counts is None:
            counts = self.counts = RetryCounts()
        return counts

    def note_retry(self, phase: str, reason: str) -> None:
        if self.retries is None:
            self.retries = []
        self.retries.append((phase, reason))
