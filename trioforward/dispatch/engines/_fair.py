"""One engine's capacity and its queue: weighted fair between tenants, priority
classes first, FIFO within a tenant (docs/dispatch.md, "Tenants and fair queueing").

:class:`FairQueue` replaces a ``trio.CapacityLimiter`` as each engine's capacity:
``total_tokens`` requests run at once; a request that finds no free token parks
in its tenant's *flow* (one FIFO per tenant on this engine) and a token coming
back is handed straight to the next request by the fair order
(:class:`~trioforward.dispatch.engines._fair_order.FairOrder`, counted: start-time fair
queueing whose virtual time counts the requests running as not yet served, so
a tenant arriving behind a flood takes the flood's held slots' worth first).
The queue counts each tenant's requests holding one of *this engine's* slots:
every take and every give-back names the tenant.

Cancellation: a parked request that is cancelled (queue deadline, drain, re-route,
its caller) leaves its flow at once (O(1)). ``hand_over`` gives a parked request
a token of *another* queue directly (work conservation): it wakes holding that
token, counted running there, so no third request can take the slot between the
decision and the wake-up.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import outcome
import trio

from trioforward.dispatch.engines._fair_order import FairOrder

if TYPE_CHECKING:
    from trioforward.dispatch.attempts._request import Request
    from trioforward.dispatch.engines._tenants import Tenant

__all__ = ["FairOrder", "FairQueue"]


def _movable(req: Request) -> bool:
    return req.session is None and not req.rerouted


class FairQueue:
    """``total_tokens`` slots of one engine and the requests waiting for them.

    The interface of the ``trio.CapacityLimiter`` it replaces, for what the
    dispatch core uses: ``total_tokens`` (settable: a fleet share; raising it
    wakes waiters at once), ``borrowed_tokens``, ``available_tokens``; plus
    :meth:`take_nowait`, :meth:`take`, :meth:`give_back`, :meth:`hand_over`.
    ``len()`` is the number of requests parked; iterating yields them.
    """

    __slots__ = ("owner", "_total", "borrowed_tokens", "_order")

    def __init__(self, total_tokens: float, owner: Any = None) -> None:
        self.owner = owner  # the engine whose slots these are
        self._total = total_tokens
        self.borrowed_tokens = 0
        self._order: FairOrder[Request] = FairOrder(counted=True)

    @property
    def total_tokens(self) -> float:
        return self._total

    @total_tokens.setter
    def total_tokens(self, value: float) -> None:
        if not (value == math.inf or (isinstance(value, int) and value >= 1)):
            raise ValueError(f"total_tokens must be an integer >= 1 or math.inf (got {value!r})")
        self._total = value
        self._grant()

    @property
    def available_tokens(self) -> float:
        return self._total - self.borrowed_tokens

    def __len__(self) -> int:
        return len(self._order)

    def __iter__(self) -> Iterator[Request]:
        """The parked requests (a snapshot: the caller may cancel them)."""
        return iter(self._order)

    def take_nowait(self, tenant: Tenant) -> bool:
        """Take a token for a request of ``tenant`` if one is free and nobody is
        parked (nobody is passed over)."""
        if self.borrowed_tokens < self._total and not len(self._order):
            self.borrowed_tokens += 1
            self._order.started(tenant)
            return True
        return False

    def running(self, tenant: Tenant) -> int:
        """``tenant``'s requests holding one of these tokens now."""
        return self._order.running(tenant)

    async def take(self, req: Request) -> FairQueue:
        """Park ``req`` in its tenant's flow until a token is handed to it.

        Returns the queue whose token ``req`` now holds: this one, or another
        engine's (:meth:`hand_over`). Cancellation: ``req`` leaves the flow and
        holds nothing (``trio.Cancelled`` propagates).
        """
        order = self._order
        tenant = req.tenant
        order.push(tenant, req, trio.lowlevel.current_task())

        def abort(_: object) -> trio.lowlevel.Abort:
            order.discard(tenant, req)
            return trio.lowlevel.Abort.SUCCEEDED

        got: FairQueue = await trio.lowlevel.wait_task_rescheduled(abort)
        return got

    def give_back(self, tenant: Tenant) -> None:
        """Return the token of a request of ``tenant``; the next parked request
        (fair order) gets it."""
        self.borrowed_tokens -= 1
        self._order.ended(tenant)
        if len(self._order):
            self._grant()

    def _grant(self) -> None:
        order = self._order
        while len(order) and self.borrowed_tokens < self._total:
            _, task = order.pop()
            self.borrowed_tokens += 1
            trio.lowlevel.reschedule(task, outcome.Value(self))

    def hand_over(
        self, to: FairQueue, may: Callable[[Request], bool] | None = None
    ) -> Request | None:
        """Work conservation: take a token of ``to`` (which has one free) for the
        next movable request parked here (no session key: those stay where their
        session is; and ``may(request)``, when given: it may run on ``to``'s
        engine) and wake it holding that token. Returns the request, or ``None``
        when none may move."""
        if to.borrowed_tokens >= to._total:
            return None
        found = self._order.pop_first(_movable if may is None else lambda r: _movable(r) and may(r))
        if found is None:
            return None
        req, task = found
        to.borrowed_tokens += 1
        to._order.started(req.tenant)
        trio.lowlevel.reschedule(task, outcome.Value(to))
        return req
