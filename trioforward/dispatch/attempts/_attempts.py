"""Attempts on one engine: what the attempt loop does between capacity acquired and
given back (docs/design.md, "Retry rules").

:class:`AttemptLoop` is a base of :class:`~trioforward.dispatch.attempts._dispatch.Dispatcher`
(set up by its ``__init__``). ``_attempts`` sends the request, asks ``_policy``
what each outcome means and carries the decision out: return the answer, raise
the gateway error, or retry — at once on a fresh connection, after a backoff,
after loading an adapter — or hand back to the dispatcher to move to another
engine. Each retry is counted against its rule and, for the storm-prone ones,
the retry budget.

Cancellation: the caller's cancellation propagates at once (the pool closes the
upstream connection, so the engine aborts); it is never retried.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import trio

from trioforward import Phase
from trioforward.dispatch.attempts._budget import RetryBudget
from trioforward.dispatch.attempts._identity import SGLANG_RID_PATHS, IdMaker, with_rid
from trioforward.dispatch.attempts._outcome import Reply, gateway_error, retry_after
from trioforward.dispatch.attempts._policy import (
    Action,
    Decision,
    RetryCounts,
    RetryPolicy,
    decide_error,
    decide_status,
)
from trioforward.dispatch.attempts._request import Request
from trioforward.dispatch.engines._adapters import AdapterLoader, engine_body
from trioforward.dispatch.engines._engines import Engine, Registry
from trioforward.dispatch.engines._routing import Router
from trioforward.errors import TrioforwardError
from trioforward.http import ConnectionPool, PoolError, PoolTimeout, Response, StreamResponse

__all__ = ["AttemptLoop"]

_NO_COUNTS = RetryCounts()  # read-only: what a request with no retries yet has made
_STATUS_PHASE = Phase.AWAIT_HEADERS.value  # the phase in which an engine status arrives


class AttemptLoop:
    """The per-engine attempts of :class:`~trioforward.dispatch.attempts._dispatch.Dispatcher`."""

    registry: Registry
    pool: ConnectionPool
    loader: AdapterLoader
    router: Router
    policy: RetryPolicy
    rand: Callable[[], float]
    budget: RetryBudget
    read_timeout: float | None
    retries: Counter[tuple[str, str]]
    responses: Counter[tuple[str, int]]
    ids: IdMaker

    async def _attempts(
        self, req: Request, engine: Engine, deadline: float, stream: bool
    ) -> Reply | None:
        """Attempts on ``engine`` until an answer (returned), an error (raised) or a
        decision to move to another engine (``None``). A returned stream's
        ``body`` is open: the caller closes it."""
        pool = self.pool
        url = engine.url + req.url_path
        request_body = req.content
        model = req.model
        if req.is_adapter and engine.kind == "sglang" and req.render is None:
            assert model is not None  # SGLang's OpenAI routes: "<base>:<adapter>"
            request_body = engine_body(engine, req.url_path, request_body, model, self.loader.registry)
        body_sent = request_body
        ids = self.ids
        while True:
            req.attempts += 1
            # A fresh engine-side id per attempt, as the engine takes it: vLLM the
            # X-Request-Id header, SGLang the body's rid (docs/server.md, "Request
            # ids and rollout groups").
            engine_id = req.engine_request_id = ids.engine_id(req.request_id)
            req.engine_request_ids.append(engine_id)
            if req.render is not None:  # a token-level request: this engine's dialect
                path, body_sent = req.render(engine, engine_id)
                url = engine.url + path
                req.url_path = path  # what the last attempt was (continue reads it)
            elif engine.kind == "sglang" and req.url_path in SGLANG_RID_PATHS:
                body_sent = with_rid(request_body, engine_id)  # SGLang's /v1: the body's rid
            if req.on_dispatch is not None:
                req.on_dispatch(engine.url, req.attempts, req.queue_time)
            # CONNECT from here: waiting for an adapter load is part of getting the
            # attempt onto the engine (no request byte sent yet).
            req.phase = Phase.CONNECT
            epoch = 0
            if req.is_adapter:
                assert model is not None
                epoch = await self.loader.before_attempt(engine, model)
            trace = req.trace
            # Traced: the engine's traceparent names this attempt's span (_tracing.py).
            sent = req.headers if trace is None else trace.attempt(engine, req.attempts, req.headers, engine_id)
            sent = [*sent, (b"x-request-id", engine_id.encode())]
            body: StreamResponse | None = None
            try:
                if stream:
                    body = await pool.stream(
                        req.method,
                        url,
                        headers=sent,
                        content=body_sent,
                        deadline=deadline,
                        read_timeout=self.read_timeout,
                        progress=req,
                        extend=req.extended_deadline,
                    ).open()
                    req.phase = Phase.READ_BODY
                    status, headers, content = body.status, body.headers, b""
                    if status >= 400:
                        # Error bodies are small: read them for the decision, and so
                        # the connection can be reused.
                        try:
                            content = await body.aread()
                        finally:
                            body.close()
                        body = None
                else:
                    response: Response = await pool.request(
                        req.method,
                        url,
                        headers=sent,
                        content=body_sent,
                        deadline=deadline,
                        read_timeout=self.read_timeout,
                        progress=req,
                        extend=req.extended_deadline,
                    )
                    status, headers, content = response.status, response.headers, response.content
            except PoolError as exc:
                req.phase = exc.phase
                decision = self._on_error(req, engine, exc, deadline)
                if decision.action is Action.FAIL:
                    raise self._error(req, exc, deadline) from exc
                last_error: PoolError | None = exc
            else:
                self.responses[(engine.url, status)] += 1
                self.registry.record_success(engine, probe=False)
                if status < 400:
                    return Reply(engine, status, headers, content, body, deadline)
                req.phase = Phase.AWAIT_HEADERS
                decision = decide_status(
                    status,
                    body=content,
                    retry_after=retry_after(headers),
                    is_adapter=req.is_adapter,
                    counts=req.counts or _NO_COUNTS,
                    policy=self.policy,
                    rand=self.rand,
                )
                if decision.action is Action.RETURN:
                    return Reply(engine, status, headers, content, None, deadline)
                last_error = None
            # -- a retry was decided ------------------------------------------------
            if not self._may_retry(req, decision):
                if last_error is not None:
                    raise self._error(req, last_error, deadline) from last_error
                return Reply(engine, status, headers, content, None, deadline)
            phase = last_error.phase.value if last_error is not None else _STATUS_PHASE
            req.note_retry(phase, decision.reason)
            self.retries[(phase, decision.reason)] += 1
            if trace is not None:
                trace.retried(phase, decision.reason, status if last_error is None else None)
            if decision.load_adapter:
                assert model is not None
                load = self.loader.ensure_loaded(engine, model, seen_epoch=epoch)
                await (load if trace is None else trace.adapter_load(engine, model, load))
            if decision.delay > 0:
                if trio.current_time() + decision.delay >= deadline:
                    # No time left for another attempt: the last outcome stands.
                    if last_error is not None:
                        raise self._error(req, last_error, deadline) from last_error
                    return Reply(engine, status, headers, content, None, deadline)
                await trio.sleep(decision.delay)
            if decision.fresh_connection:
                pool.close_idle(engine.url)
            if decision.other_engine:
                engines = self.registry.engines
                if req.only is not None:
                    engines = [e for e in engines if req.only(e)]
                if req.accepts is not None:
                    engines = [e for e in engines if req.accepts(e)]
                alternative = self.router.pick(
                    engines, session=req.session, avoid=engine, prefix=req.prefix
                )
                if alternative is not None and alternative is not engine:
                    return None
                # Otherwise this engine is the only choice (even if just ejected: the
                # request already has attempts, it spends its retries rather than
                # waiting for a health probe).

    def _on_error(self, req: Request, engine: Engine, exc: PoolError, deadline: float) -> Decision:
        if trio.current_time() >= req.extended_deadline():
            # Our own budget ran out (possibly while waiting for a connection slot):
            # not the engine's fault, so no health failure is recorded.
            return Decision(Action.FAIL, "dispatch_deadline")
        if exc.phase is Phase.CONNECT:
            self.registry.record_failure(engine)
        return decide_error(
            exc.phase,
            reused=exc.reused,
            response_bytes=exc.response_bytes,
            timeout=isinstance(exc, PoolTimeout),
            counts=req.counts or _NO_COUNTS,
            policy=self.policy,
            rand=self.rand,
        )

    def _may_retry(self, req: Request, decision: Decision) -> bool:
        """Count the retry against its rule, and (for the storm-prone ones) the budget."""
        counts = req.retry_counts()
        reason = decision.reason
        if reason == "keepalive_race":
            counts.keepalive += 1
            return True
        if reason == "adapter_not_loaded":
            # Not a symptom of failing engines: the load resolves it. Exempt from
            # the storm budget (a new adapter meets thousands of requests at once).
            counts.adapter += 1
            return True
        if not self.budget.try_withdraw(trio.current_time()):
            return False
        if reason == "connect_error":
            counts.connect += 1
        else:
            counts.rejection += 1
        return True

    def _error(self, req: Request, exc: PoolError, deadline: float) -> TrioforwardError:
        # A keep pause moved the deadline (docs/operations.md): judge by the moved one.
        deadline = max(deadline, req.extended_deadline())
        return gateway_error(exc, req.engine_url, deadline, trio.current_time())
