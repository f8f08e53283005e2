"""The retry decision table (docs/semantics.md, "Retries"), as pure functions (no sockets)."""

from __future__ import annotations

import pytest

from trioforward.dispatch.attempts._policy import (
    Action,
    RetryCounts,
    RetryPolicy,
    adapter_delay,
    backoff_delay,
    decide_error,
    decide_status,
    is_adapter_missing,
    parse_retry_after,
)
from trioforward.http import Phase

POLICY = RetryPolicy(connect_retries=4, rejection_retries=1, backoff_initial=0.1, backoff_max=5.0)


def err(
    phase: Phase,
    *,
    reused: bool = False,
    response_bytes: int = 0,
    timeout: bool = False,
    counts: RetryCounts | None = None,
):
    return decide_error(
        phase,
        reused=reused,
        response_bytes=response_bytes,
        timeout=timeout,
        counts=counts or RetryCounts(),
        policy=POLICY,
        rand=lambda: 0.5,
    )


def status(
    code: int,
    body: bytes = b"",
    *,
    retry_after: float | None = None,
    is_adapter: bool = False,
    counts: RetryCounts | None = None,
):
    return decide_status(
        code,
        body=body,
        retry_after=retry_after,
        is_adapter=is_adapter,
        counts=counts or RetryCounts(),
        policy=POLICY,
        rand=lambda: 0.5,
    )


def test_connect_error_retried_on_another_engine_until_connect_retries() -> None:
    for used in range(4):
        d = err(Phase.CONNECT, counts=RetryCounts(connect=used))
        assert d.action is Action.RETRY and d.other_engine and d.reason == "connect_error"
        assert d.delay > 0
    assert err(Phase.CONNECT, counts=RetryCounts(connect=4)).action is Action.FAIL


def test_connect_timeout_is_a_connect_failure_like_any_other() -> None:
    assert err(Phase.CONNECT, timeout=True).action is Action.RETRY


@pytest.mark.parametrize("phase", [Phase.SEND, Phase.AWAIT_HEADERS])
def test_keepalive_race_retried_once_at_once_on_fresh_connection(phase: Phase) -> None:
    d = err(phase, reused=True)
    assert (
        d.action is Action.RETRY
        and d.fresh_connection
        and d.delay == 0
        and d.reason == "keepalive_race"
    )
    assert err(phase, reused=True, counts=RetryCounts(keepalive=1)).action is Action.FAIL


@pytest.mark.parametrize("phase", [Phase.SEND, Phase.AWAIT_HEADERS])
def test_fresh_connection_failure_not_retried(phase: Phase) -> None:
    d = err(phase, reused=False)
    assert d.action is Action.FAIL and d.reason == "fresh_connection_broken"


def test_reused_connection_with_response_bytes_not_retried() -> None:
    assert err(Phase.AWAIT_HEADERS, reused=True, response_bytes=1).action is Action.FAIL


@pytest.mark.parametrize("reused", [False, True])
def test_await_headers_timeout_and_read_body_failures_never_retried(reused: bool) -> None:
    assert err(Phase.AWAIT_HEADERS, reused=reused, timeout=True).action is Action.FAIL
    assert err(Phase.READ_BODY, reused=reused).action is Action.FAIL
    assert err(Phase.READ_BODY, reused=reused, timeout=True).action is Action.FAIL
    assert err(Phase.READ_BODY, reused=reused, response_bytes=0).action is Action.FAIL


@pytest.mark.parametrize("code", [429, 502, 503, 504])
def test_rejections_retried_rejection_retries_times(code: int) -> None:
    d = status(code)
    assert d.action is Action.RETRY and d.reason == f"rejection_{code}"
    assert status(code, counts=RetryCounts(rejection=1)).action is Action.RETURN


def test_retry_after_honoured_and_capped_by_backoff_max() -> None:
    assert status(503, retry_after=1.5).delay == 1.5
    assert status(503, retry_after=600).delay == POLICY.backoff_max
    assert status(503, retry_after=0).delay == 0


@pytest.mark.parametrize("code", [400, 401, 404, 409, 422, 500])
def test_other_statuses_returned_verbatim(code: int) -> None:
    assert (
        status(code, b'{"error": {"message": "The model `x` does not exist."}}').action
        is Action.RETURN
    )


def test_success_returned() -> None:
    assert status(200).action is Action.RETURN


def test_adapter_not_loaded_triggers_load_and_bounded_retries() -> None:
    body = b'{"error": {"message": "The model `lora-a` does not exist.", "code": 404}}'
    first = status(404, body, is_adapter=True)
    assert first.action is Action.RETRY and first.load_adapter and first.delay == 0
    delays = [
        status(404, body, is_adapter=True, counts=RetryCounts(adapter=k)).delay for k in range(1, 5)
    ]
    assert delays == [0.1, 0.2, 0.4, 0.8]
    # adapter_max_attempts (6) attempts at most: after 5 retries, the answer stands.
    assert status(404, body, is_adapter=True, counts=RetryCounts(adapter=5)).action is Action.RETURN
    assert status(400, body, is_adapter=True).load_adapter
    assert status(400, b'{"error": "bad temperature"}', is_adapter=True).action is Action.RETURN


def test_adapter_backoff_capped() -> None:
    assert adapter_delay(10, 0.1, 2.0) == 2.0


def test_base_model_404_returned() -> None:
    assert status(404, b"The model `x` does not exist.", is_adapter=False).action is Action.RETURN


def test_is_adapter_missing() -> None:
    assert is_adapter_missing(404, b"")
    assert is_adapter_missing(400, b'{"message": "The model `a` does not exist."}')
    assert is_adapter_missing(400, b'{"message": "Model a NOT FOUND"}')
    assert not is_adapter_missing(400, b'{"message": "max_tokens must be positive"}')
    assert not is_adapter_missing(500, b"does not exist")


def test_backoff_grows_doubles_is_jittered_and_capped() -> None:
    lows = [backoff_delay(k, 0.1, 5.0, rand=lambda: 0.0) for k in range(8)]
    highs = [backoff_delay(k, 0.1, 5.0, rand=lambda: 1.0) for k in range(8)]
    assert lows[:4] == pytest.approx([0.05, 0.1, 0.2, 0.4])
    assert highs[:4] == pytest.approx([0.1, 0.2, 0.4, 0.8])
    assert highs[-1] == 5.0 and lows[-1] == 2.5
    # The guaranteed half doubles: every delay is at least the previous one's ceiling / 2.
    for k in range(1, 6):
        assert lows[k] >= highs[k - 1] / 2


def test_parse_retry_after() -> None:
    assert parse_retry_after(None) is None
    assert parse_retry_after(b"3") == 3.0
    assert parse_retry_after(b" 0.25 ") == 0.25
    assert parse_retry_after(b"-4") == 0.0
    assert parse_retry_after(b"soon") is None
    assert parse_retry_after(
        b"Wed, 21 Oct 2015 07:28:00 GMT", now_epoch=1445412470.0
    ) == pytest.approx(10.0)
