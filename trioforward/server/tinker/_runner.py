"""Running Tinker samples on the engines, in the server's lifetime nursery.

``asample`` answers at once; the sample is queued here and forwarded by a worker
task that belongs to the *server's* nursery (``GatewayState.nursery``), not to
the request: a client that abandons its poll never cancels the generation (the
opposite of the OpenAI path, where a hang-up aborts the engine's work).

Workers, not a task per sample: an outstanding sample is a ``(Future, SampleJob)``
pair in a queue (a few hundred bytes plus its prompt as JSON), and at most
``limit()`` workers run, about the engines' total capacity, so what waits beyond
that waits here, cheaply, instead of as parked tasks in the dispatch queue.
Workers start on demand and exit when the queue is empty. The queue is the
engines' fair order between tenants (``FairOrder``: weights, priority classes,
FIFO within a tenant; docs/dispatch.md, "Tenants and fair queueing"), so a
tenant's burst of samples waits here behind nobody else's share either:
O(log tenants) per sample.

Each result is decoded once (``trioforward.codec``, numpy arrays) and encoded
once (protobuf ``SampleResponse`` or the SDK's error object); the store serves
those bytes on every retrieval.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import trio

from trioforward.dispatch import FairOrder, Tenant
from trioforward.server.tinker._futures import Future, FutureStore
from trioforward.server.tinker._requests import SampleJob
from trioforward.server.tinker._wire import (
    JSON,
    LENGTH,
    PROTOBUF,
    STOP,
    encode_error,
    encode_sample_response,
)

__all__ = ["SampleRunner", "run_sample", "encode_completion"]

log = logging.getLogger("trioforward.tinker")

_HEADERS_CT = ("Content-Type", "application/json")


def encode_completion(
    body: bytes, job: SampleJob, parse: Callable[[bytes], Any] | None = None
) -> tuple[bytes, str]:
    """An engine's 2xx answer -> ``(bytes, content type)`` for the SDK; ``parse``:
    the decoder of the dialect the engine was asked in (default ``/v1/completions``)."""
    from trioforward.codec import decode_completion

    if parse is None:
        completion = decode_completion(body, require_token_ids=True)  # a sample is its tokens
    else:
        completion = parse(body)
    choices = sorted(completion.choices, key=lambda c: c.index)
    if len(choices) != job.num_samples:
        # The SDK asserts one sequence per sample_sequence_id it was given.
        message = f"engine returned {len(choices)} choices for n={job.num_samples}"
        return encode_error(message, "server"), JSON
    prompt_lp = completion.prompt_logprobs
    if prompt_lp is not None and job.prompt_logprobs_last_n is not None:
        prompt_lp = prompt_lp.copy()
        prompt_lp[: max(len(prompt_lp) - job.prompt_logprobs_last_n, 0)] = np.nan
    sequences = [
        (c.tokens, c.logprobs, STOP if c.finish_reason == "stop" else LENGTH) for c in choices
    ]
    return encode_sample_response(sequences, prompt_lp), PROTOBUF


def _engine_error_message(status: int, body: bytes) -> str:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return f"engine answered {status}: {body[:500].decode('utf-8', 'replace')}"
    if isinstance(doc, dict):
        err = doc.get("error", doc)
        if isinstance(err, dict) and err.get("message"):
            return f"engine answered {status}: {err['message']}"
        if isinstance(doc.get("detail"), str):
            return f"engine answered {status}: {doc['detail']}"
    return f"engine answered {status}"


#: The route label Tinker samples carry in the gateway's request metrics.
METRICS_ROUTE = "tinker_sample"


async def run_sample(
    client: Any, job: SampleJob, metrics: Any = None
) -> tuple[bytes, str, str | None]:
    """Forward one sample and encode its outcome: ``(body, content type, weight
    version)``, the version being the engine answer's ``X-Weight-Version``
    (``None`` when no answer came or no version was recorded; docs/operations.md).
    Raises only ``Cancelled`` and :class:`~trioforward.errors.ShuttingDown` (the
    drain ended the sample while QUEUED: no engine ran it, and the SDK is to
    resubmit it rather than fail it; :meth:`SampleRunner` abandons its future).

    ``metrics`` (the server's ``Metrics``, optional) observes the forward's
    status, queue wait and engine time, like any OpenAI-path request.

    Category (``tinker.types.RequestErrorCategory``): an engine 4xx is the user's
    request (bad parameters, unknown model), except 408/429 (capacity); anything
    else (5xx, gateway-level dispatch failures, bad bodies) is "server".
    """
    from trioforward.errors import ShuttingDown, TrioforwardError

    parse = None
    # Its X-Weight-Policy, parsed at asample, goes as the header the client reads.
    policy = () if job.policy is None else (("X-Weight-Policy", str(job.policy)),)
    try:
        if job.tokens is None:
            response = await client.post(
                "/v1/completions",
                content=job.body,
                json={"model": job.model},
                headers=[("X-Session-ID", job.session), _HEADERS_CT, *policy],
                session_implied=True,  # routing = "prefix" routes a sample by its prompt
                request_id=job.request_id,
                group=job.group,
                tenant=job.tenant,
            )
        else:  # in the dialect of the engine it goes to (docs/dispatch.md, "Engine dialects")
            response, parse = await client.sample_response(
                job.tokens,
                session=job.session,
                headers=[("X-Session-ID", job.session), *policy],
                session_implied=True,  # routing = "prefix" routes a sample by its prompt
                completions_body=job.body,
                request_id=job.request_id,
                group=job.group,
                tenant=job.tenant,
            )
    except TrioforwardError as err:
        if metrics is not None:
            metrics.observe(
                METRICS_ROUTE,
                err.status,
                queue_time=err.queue_time,
                engine_time=err.engine_time,
                tenant=job.tenant.name if job.tenant is not None else None,
            )
        if isinstance(err, ShuttingDown):
            raise
        return encode_error(f"{type(err).__name__}: {err.message}", "server"), JSON, None
    except Exception as err:  # a bug must fail one sample, not the server's nursery
        log.exception("tinker sample failed")
        return encode_error(f"gateway error: {type(err).__name__}: {err}", "server"), JSON, None
    status, version = response.status, response.weight_version
    if metrics is not None:
        metrics.observe(
            METRICS_ROUTE,
            status,
            queue_time=response.queue_time,
            engine_time=response.engine_time,
            weight_version=version,
            tenant=job.tenant.name if job.tenant is not None else None,
        )
    if not 200 <= status < 300:
        category = "user" if 400 <= status < 500 and status not in (408, 429) else "server"
        return encode_error(_engine_error_message(status, response.content), category), JSON, version
    try:
        return (*encode_completion(response.content, job, parse), version)
    except Exception as err:
        log.warning("undecodable engine answer for %s: %s", job.session, err)
        return encode_error(f"undecodable engine answer: {err}", "server"), JSON, version


class SampleRunner:
    """The outstanding samples, in fair order between tenants (FIFO within one),
    and the worker tasks that forward them.

    ``limit``: how many workers may run (read on each submit, so engines added
    at runtime raise it). ``nursery``: the server-lifetime nursery.
    """

    def __init__(
        self,
        store: FutureStore,
        client: Any,
        nursery: trio.Nursery,
        limit: Callable[[], int],
        metrics: Any = None,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.client = client
        self.nursery = nursery
        self.limit = limit
        self._queue: FairOrder[Future] = FairOrder()
        tenants = getattr(client, "tenants", None)
        self._default: Tenant = tenants.default if tenants is not None else Tenant("default")
        self._workers = 0
        self.completed_total = 0

    def submit(self, future: Future, job: SampleJob) -> None:
        """Queue a sample; start a worker if fewer than ``limit()`` run."""
        tenant = job.tenant = job.tenant or self._default
        tenant.samples += 1  # its max_outstanding counts unfinished samples (asample)
        self._queue.push(tenant, future, job)
        if self._workers < self.limit():
            self._workers += 1
            self.nursery.start_soon(self._worker)

    def take_queued(self) -> list[Future]:
        """Empty the queue: the futures of the samples no worker took (the drain
        drops them), in the order they would have run (oldest first per tenant)."""
        taken = []
        while len(self._queue):
            future, job = self._queue.pop()
            job.tenant.samples -= 1  # no longer unfinished here
            taken.append(future)
        return taken

    @property
    def queued(self) -> int:
        return len(self._queue)

    def abort(self, request_ids: list[str] | None, group: str | None, every: bool) -> int:
        """Take the matching samples still waiting here out of the queue (no engine
        sees them) and resolve each with an aborted sample: its sequences empty,
        ``stop_reason`` length (the SDK's ``StopReason`` is ``"stop"`` or
        ``"length"``; docs/tinker.md, "Request ids and rollout groups").
        Returns how many. O(queue), an abort call's cost, never a sample's."""
        wanted = set(request_ids or ())
        aborted = 0
        empty = np.zeros(0, dtype=np.int32)

        def matches(future: Future, job: SampleJob) -> bool:
            return every or (group is not None and job.group == group) or job.request_id in wanted

        for future, job in self._queue.remove_where(matches):
            job.tenant.samples -= 1  # no longer unfinished here
            body = encode_sample_response([(empty, None, LENGTH)] * job.num_samples)
            self.store.resolve(future, body, PROTOBUF, None)
            aborted += 1
        return aborted

    @property
    def workers(self) -> int:
        return self._workers

    async def _worker(self) -> None:
        from trioforward.errors import ShuttingDown

        try:
            while self._queue:
                future, job = self._queue.pop()
                try:
                    body, content_type, version = await run_sample(self.client, job, self.metrics)
                except ShuttingDown:
                    # Never ran: its polls answer 410 and the SDK resubmits it.
                    self.store.abandon(future)
                    continue
                finally:
                    job.tenant.samples -= 1
                self.store.resolve(future, body, content_type, version)
                self.completed_total += 1
        finally:
            self._workers -= 1
