"""The retry rules (docs/design.md, "Retry rules") as pure functions: no I/O, no trio, no clock.

Every decision is a function of the facts one attempt produced — the phase it
failed in, whether the connection was reused, how many response bytes arrived,
or the engine's status and body — plus the per-request retry counters. The
dispatch loop (``_dispatch.py``) carries the decision out.

| Failure                                                  | Decision                          |
|----------------------------------------------------------|-----------------------------------|
| CONNECT error or timeout                                 | retry ``connect_retries`` times,  |
|                                                          | jittered backoff, other engine    |
| SEND/AWAIT_HEADERS, reused, 0 response bytes, not timeout | retry once, at once, fresh conn.  |
| same on a fresh connection                               | fail: UpstreamBroken              |
| 429/502/503/504                                          | retry ``rejection_retries`` times |
|                                                          | after Retry-After or backoff      |
| other 4xx, 500                                           | return verbatim                   |
| AWAIT_HEADERS timeout, any READ_BODY failure             | fail: DispatchTimeout/UpstreamBroken |
| adapter not loaded (404, 400 "does not exist")           | load, retry (adapter backoff)     |
| same for a base model                                    | return verbatim                   |
"""

from __future__ import annotations

import email.utils
import enum
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from trioforward import Phase

__all__ = [
    "Action",
    "Decision",
    "RetryCounts",
    "RetryPolicy",
    "decide_error",
    "decide_status",
    "backoff_delay",
    "adapter_delay",
    "parse_retry_after",
    "is_adapter_missing",
    "REJECTION_STATUSES",
]

REJECTION_STATUSES = frozenset((429, 502, 503, 504))


class Action(enum.Enum):
    """What the dispatch loop does with an attempt's outcome."""

    RETURN = "return"  # give the engine's response to the caller
    FAIL = "fail"  # raise the gateway error for the failure
    RETRY = "retry"  # another attempt (see Decision fields for how)


@dataclass(frozen=True, slots=True)
class Decision:
    """One decision. ``reason`` names the rule (``retries`` statistics key)."""

    action: Action
    reason: str
    delay: float = 0.0  # seconds to wait before the next attempt
    other_engine: bool = False  # re-route, avoiding the engine that failed
    fresh_connection: bool = False  # the next attempt must not reuse a connection
    load_adapter: bool = False  # load the request's adapter before retrying


@dataclass(slots=True)
class RetryCounts:
    """Retries already made for one request, by rule."""

    connect: int = 0
    rejection: int = 0
    keepalive: int = 0
    adapter: int = 0


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The knobs the decisions read (a projection of :class:`Settings`)."""

    connect_retries: int = 4
    rejection_retries: int = 1
    backoff_initial: float = 0.1
    backoff_max: float = 5.0
    adapter_max_attempts: int = 6
    adapter_backoff_initial: float = 0.1
    adapter_backoff_max: float = 2.0


def backoff_delay(
    retry: int, initial: float, cap: float, rand: Callable[[], float] = random.random
) -> float:
    """Jittered exponential backoff before retry number ``retry`` (0-based), seconds.

    "Equal jitter": the nominal delay ``b = min(cap, initial * 2**retry)`` is
    drawn uniformly from ``[b/2, b]``. Half of it is guaranteed, so successive
    delays grow (the bounds double), and the random half de-synchronises many
    requests that failed together (AWS architecture blog, "Exponential Backoff
    and Jitter").
    """
    base = min(cap, initial * (2.0 ** min(retry, 62)))
    return base * (0.5 + 0.5 * rand())


def adapter_delay(retry: int, initial: float, cap: float) -> float:
    """Backoff before adapter retry number ``retry`` (0-based): ``initial * 2**retry``, capped."""
    return min(cap, initial * (2.0 ** min(retry, 62)))


def parse_retry_after(value: bytes | None, now_epoch: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header (RFC 9110 §10.2.3): delay-seconds or an HTTP-date.

    Returns ``None`` if absent or unreadable; never negative.
    """
    if value is None:
        return None
    text = value.decode("latin-1").strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if now_epoch is None:
            import time

            now_epoch = time.time()
        seconds = when.timestamp() - now_epoch
    if math.isnan(seconds):
        return None
    return max(0.0, seconds)


# vLLM: "The model `NAME` does not exist."; SGLang's /generate: "Got LoRA adapter
# that has never been loaded: NAME" (tokenizer_manager.py, 0.5.23).
_MISSING_MARKERS = (b"does not exist", b"not found", b"never been loaded")


def is_adapter_missing(status: int, body: bytes) -> bool:
    """True if an engine answer means "this model is not loaded" (docs/compatibility.md, "vLLM engines").

    vLLM answers 404 ``The model `NAME` does not exist.``; some versions answer
    400 with the same message. Only meaningful for a model that is an adapter.
    """
    if status == 404:
        return True
    if status == 400:
        lowered = body[:4096].lower()
        return any(marker in lowered for marker in _MISSING_MARKERS)
    return False


def decide_error(
    phase: Phase,
    *,
    reused: bool,
    response_bytes: int,
    timeout: bool,
    counts: RetryCounts,
    policy: RetryPolicy,
    rand: Callable[[], float] = random.random,
) -> Decision:
    """Decide after an attempt raised a pool error (no HTTP status was received).

    ``timeout`` is true for a deadline/read-timeout expiry (not for a connect
    timeout, which is a CONNECT failure like any other).
    """
    if phase is Phase.CONNECT:
        # No request byte was sent: always safe to try again, elsewhere if possible.
        if counts.connect < policy.connect_retries:
            delay = backoff_delay(counts.connect, policy.backoff_initial, policy.backoff_max, rand)
            return Decision(Action.RETRY, "connect_error", delay=delay, other_engine=True)
        return Decision(Action.FAIL, "connect_error")
    if timeout:
        # The engine may be working on it; closing the connection aborts it there.
        return Decision(Action.FAIL, f"{phase.value}_timeout")
    if phase is Phase.READ_BODY:
        return Decision(Action.FAIL, "read_body_broken")
    # SEND or AWAIT_HEADERS. A reused connection that never produced a response
    # byte was most likely closed by the server's keep-alive expiry just as we
    # wrote to it (RFC 9112 §9.6): the request never reached the application.
    if reused and response_bytes == 0 and counts.keepalive == 0:
        return Decision(Action.RETRY, "keepalive_race", fresh_connection=True)
    return Decision(Action.FAIL, "fresh_connection_broken" if not reused else "upstream_broken")


def decide_status(
    status: int,
    *,
    body: bytes,
    retry_after: float | None,
    is_adapter: bool,
    counts: RetryCounts,
    policy: RetryPolicy,
    rand: Callable[[], float] = random.random,
) -> Decision:
    """Decide after the engine answered ``status`` with ``body``.

    ``retry_after`` is the parsed ``Retry-After`` header (seconds) or ``None``;
    it is capped by ``backoff_max``. ``is_adapter``: the request's model is a
    registered LoRA adapter.
    """
    if status < 400:
        return Decision(Action.RETURN, "ok")
    if status in REJECTION_STATUSES:
        if counts.rejection < policy.rejection_retries:
            if retry_after is not None:
                delay = min(retry_after, policy.backoff_max)
            else:
                delay = backoff_delay(
                    counts.rejection, policy.backoff_initial, policy.backoff_max, rand
                )
            return Decision(Action.RETRY, f"rejection_{status}", delay=delay, other_engine=True)
        return Decision(Action.RETURN, f"rejection_{status}")
    if is_adapter and is_adapter_missing(status, body):
        # counts.adapter retries made so far; attempts = retries + 1.
        if counts.adapter + 1 < policy.adapter_max_attempts:
            delay = 0.0
            if counts.adapter > 0:
                # The first retry follows a load we just confirmed; later ones mean
                # the engine still does not serve it (lazy resolver still loading).
                delay = adapter_delay(
                    counts.adapter - 1, policy.adapter_backoff_initial, policy.adapter_backoff_max
                )
            return Decision(Action.RETRY, "adapter_not_loaded", delay=delay, load_adapter=True)
        return Decision(Action.RETURN, "adapter_not_loaded")
    # Any other 4xx, 500 and the rest: permanent; the caller gets it verbatim.
    return Decision(Action.RETURN, f"status_{status}")
