"""One engine's capacity and its queue: weighted fair between tenants, priority
classes first, FIFO within a tenant (docs/dispatch.md, "Tenants and fair queueing").

:class:`FairQueue` replaces a ``trio.CapacityLimiter`` as each engine's capacity:
``total_tokens`` requests run at once; a request that finds no free token parks
in its tenant's *flow* (one FIFO per tenant on this engine) and a token coming
back is handed straight to the next request by the fair order.

The order is start-time fair queueing (SFQ; Goyal, Vin and Cheng, "Start-time
Fair Queueing", SIGCOMM 1996) with every request costing 1 (a slot, whatever its
length: nobody knows a generation's length before it ends). Each backlogged
flow has a start tag; the next token goes to the flow with the smallest tag
(ties: the flow backlogged first), whose tag then grows by ``1 / weight``. A
flow that becomes backlogged starts at ``max(virtual time, its last finish
tag)``, the virtual time being the tag of the request dispatched last, so a
tenant that was idle gets no credit for it and one that floods gets no more
than its weight while others wait. Tags live on flows, not on requests: a
heap of at most one entry per backlogged tenant, O(log tenants) per grant, no
scan of queued requests. Priority classes are a key above the tag: a class is
served only while no higher class has a request queued here (each class has its
own virtual time). Within a flow requests leave in arrival order.

Why SFQ and not deficit round robin: with unit costs DRR is weighted round
robin, which hands a weight-3 tenant three slots in a row and needs integral
weights; SFQ interleaves by any real weight and needs no quantum. Why not
finish-time WFQ: it orders by finish tags, which need the cost at arrival —
unit costs make the two the same, and SFQ stays fair if costs ever become
measured (its tags need the cost only once the request is served).

:class:`FairOrder` is that order on its own (any items, no tasks): the Tinker
sample runner queues samples by it before they reach an engine queue.

Cancellation: a parked request that is cancelled (queue deadline, drain, re-route,
its caller) leaves its flow at once (O(1)); the flow's heap entry is dropped when
it reaches the top. ``hand_over`` gives a parked request a token of *another*
queue directly (work conservation): it wakes holding that token, so no third
request can take the slot between the decision and the wake-up.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import outcome
import trio

if TYPE_CHECKING:
    from trioforward.dispatch._request import Request
    from trioforward.dispatch._tenants import Tenant

__all__ = ["FairOrder", "FairQueue"]

K = TypeVar("K", bound=Hashable)


class _Class:
    """One priority class of one order: its virtual time (the start tag of the
    item of this class served last)."""

    __slots__ = ("vtime",)

    def __init__(self) -> None:
        self.vtime = 0.0


class _Flow:
    """One tenant's items, oldest first (key -> value)."""

    __slots__ = ("items", "finish", "tag", "in_heap", "rank", "cost", "cls")

    def __init__(self, tenant: Tenant, cls: _Class) -> None:
        self.items: OrderedDict[Any, Any] = OrderedDict()
        self.finish = 0.0  # finish tag of this flow's item served last
        self.tag = 0.0  # start tag of its head while it has a heap entry
        self.in_heap = False
        self.rank = -tenant.priority  # heap key: a higher class first
        self.cost = 1.0 / tenant.weight
        self.cls = cls


class FairOrder(Generic[K]):
    """Items of many tenants, served in start-time fair order (module docstring):
    :meth:`push` O(log tenants), :meth:`pop` O(log tenants), :meth:`discard` O(1).
    ``len()``: items held; iterating yields their keys (a snapshot)."""

    __slots__ = ("_flows", "_classes", "_heap", "_seq", "_count")

    def __init__(self) -> None:
        self._flows: dict[Tenant, _Flow] = {}
        self._classes: dict[int, _Class] = {}
        self._heap: list[tuple[int, float, int, _Flow]] = []
        self._seq = itertools.count()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[K]:
        return iter([key for flow in self._flows.values() for key in flow.items])

    def push(self, tenant: Tenant, key: K, value: Any) -> None:
        """Append ``key`` (with ``value``) to ``tenant``'s flow."""
        flow = self._flows.get(tenant)
        if flow is None:
            cls = self._classes.get(tenant.priority)
            if cls is None:
                cls = self._classes[tenant.priority] = _Class()
            flow = self._flows[tenant] = _Flow(tenant, cls)
        flow.items[key] = value
        self._count += 1
        if not flow.in_heap:
            # Backlogged again: no credit for the time it was idle.
            tag = flow.tag = max(flow.cls.vtime, flow.finish)
            heapq.heappush(self._heap, (flow.rank, tag, next(self._seq), flow))
            flow.in_heap = True

    def discard(self, tenant: Tenant, key: K) -> None:
        """Remove ``key`` unserved (its flow's heap entry goes when it reaches the top)."""
        del self._flows[tenant].items[key]
        self._count -= 1

    def remove_where(self, pred: Callable[[K, Any], bool]) -> list[tuple[K, Any]]:
        """Remove every ``(key, value)`` for which ``pred(key, value)`` holds, unserved,
        and return them (per tenant oldest first). O(items held): for rare calls
        such as an abort, never on a request's path."""
        out: list[tuple[K, Any]] = []
        for flow in self._flows.values():
            for key in [k for k, v in flow.items.items() if pred(k, v)]:
                out.append((key, flow.items.pop(key)))
                self._count -= 1
        return out

    def _top(self) -> _Flow:
        heap = self._heap
        while True:
            flow = heap[0][3]
            if flow.items:
                return flow
            heapq.heappop(heap)  # emptied by discards
            flow.in_heap = False

    def pop(self) -> tuple[K, Any]:
        """The next ``(key, value)``, charged to its tenant. ``IndexError`` when empty."""
        if not self._count:
            raise IndexError("pop from an empty FairOrder")
        flow = self._top()
        key, value = flow.items.popitem(last=False)
        self._charge(flow)
        return key, value

    def pop_first(self, may: Callable[[K], bool]) -> tuple[K, Any] | None:
        """The next ``(key, value)`` for which ``may(key)`` holds: the top flow's
        first such item, else the next flow's in heap order (almost always the
        top flow's head: O(1) in practice); ``None`` if there is none."""
        if not self._count:
            return None
        top = self._top()
        for flow in (top, *(e[3] for e in sorted(self._heap) if e[3] is not top)):
            for key in flow.items:
                if may(key):
                    value = flow.items.pop(key)
                    if flow is top:
                        self._charge(flow)
                    else:
                        self._count -= 1  # a later flow's: its tag is left as it was
                    return key, value
        return None

    def _charge(self, flow: _Flow) -> None:
        """One item of ``flow``, the top flow, was served: advance its tag."""
        self._count -= 1
        tag = flow.tag
        flow.cls.vtime = tag
        finish = flow.finish = tag + flow.cost
        if flow.items:
            flow.tag = finish
            heapq.heapreplace(self._heap, (flow.rank, finish, next(self._seq), flow))
        else:
            heapq.heappop(self._heap)
            flow.in_heap = False


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
        self._order: FairOrder[Request] = FairOrder()

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

    def take_nowait(self) -> bool:
        """Take a token if one is free and nobody is parked (nobody is passed over)."""
        if self.borrowed_tokens < self._total and not len(self._order):
            self.borrowed_tokens += 1
            return True
        return False

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

    def give_back(self) -> None:
        """Return one token; the next parked request (fair order) gets it."""
        self.borrowed_tokens -= 1
        if len(self._order):
            self._grant()

    def _grant(self) -> None:
        order = self._order
        while len(order) and self.borrowed_tokens < self._total:
            _, task = order.pop()
            self.borrowed_tokens += 1
            trio.lowlevel.reschedule(task, outcome.Value(self))

    def hand_over(self, to: FairQueue, may: Callable[[Request], bool] | None = None) -> Request | None:
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
        trio.lowlevel.reschedule(task, outcome.Value(to))
        return req
