"""The fair order between tenants on its own: who goes next (docs/dispatch.md,
"Tenants and fair queueing").

Items (requests, Tinker samples) of many tenants wait in one *flow* per tenant,
oldest first. Priority classes come first (a class is served only while no
higher class has an item here); within a class, **start-time fair queueing**
(SFQ; Goyal, Vin and Cheng, "Start-time Fair Queueing", SIGCOMM 1996) picks
the next flow. Every item costs 1 (a slot, whatever its length: nobody knows a
generation's length before it ends). Each backlogged flow has a start tag; the
smallest goes (ties: the flow backlogged first) and its tag grows by ``1 /
weight``. A flow that becomes backlogged starts at ``max(virtual time, its last
finish tag)``, so a tenant that was idle gets no credit for it.

**The virtual time counts running items as not yet served** (only when the
order counts them, as an engine's queue does: ``counted``; each flow knows how
many of its items hold a slot now, ``running``): it is the start tag of the
flow at the head of the order minus its running items' cost, ``tag -
running / weight``, the work that flow has *finished*. Plain SFQ takes the
head's tag itself, which charges a flood for every slot it holds the moment it
takes it: a tenant that arrives behind the flood then starts level with it and
gets every other freed slot, although each slot the flood holds at that moment
is service the flood gets in the newcomer's time. Counted from the newcomer's
arrival instead, the flood's held slots are its lead: the newcomer takes every
slot that frees until it has been granted as many as the flood held (weighted),
and from then on the two alternate by weight. On requests of one length, whose
slots all free together once per request time, that is the whole wave after
the one the newcomer waited for, which makes up for that wait (nothing running
is taken back). The lead a newcomer can take is bounded by what the head flow
holds, at most the engine's slots, per time it becomes backlogged; one that
still has a finish tag ahead of the virtual time (it was served lately) gets
none.

Why SFQ and not deficit round robin: with unit costs DRR is weighted round
robin, which hands a weight-3 tenant three slots in a row and needs integral
weights; SFQ interleaves by any real weight and needs no quantum. Why not
finish-time WFQ: it needs each item's cost at arrival.

Cost: one heap of flows, not of items (an entry made stale by a change is
dropped when it reaches the top, and the heap is rebuilt once it holds more
than twice the live entries plus a few): O(log tenants) per item, no scan of
queued items. Cancellation (:meth:`FairOrder.discard`) is O(1).
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from trioforward.dispatch.engines._tenants import Tenant

__all__ = ["FairOrder"]

K = TypeVar("K", bound=Hashable)
_SLACK = 8  # stale heap entries tolerated beyond twice the live ones


class _Class:
    """One priority class of one order: its virtual time as of its last grant
    (module docstring)."""

    __slots__ = ("vtime",)

    def __init__(self) -> None:
        self.vtime = 0.0


class _Flow:
    """One tenant's items, oldest first (key -> value), and its running count."""

    __slots__ = ("items", "finish", "tag", "entry", "rank", "cost", "cls", "running")

    def __init__(self, tenant: Tenant, cls: _Class) -> None:
        self.items: OrderedDict[Any, Any] = OrderedDict()
        self.finish = 0.0  # finish tag of this flow's item served last
        self.tag = 0.0  # start tag of its head while it is backlogged
        self.entry = -1  # sequence number of its live heap entry; -1: not backlogged
        self.rank = -tenant.priority  # heap key: a higher class first
        self.cost = 1.0 / tenant.weight
        self.cls = cls
        self.running = 0  # its items holding a slot now (counted orders)


_Entry = tuple[int, float, int, _Flow]  # (rank, key, sequence number, flow)


class FairOrder(Generic[K]):
    """Items of many tenants in fair order (module docstring): :meth:`push`,
    :meth:`pop` and :meth:`pop_first` O(log tenants), :meth:`discard` O(1).
    ``len()``: items held; iterating yields their keys (a snapshot).

    ``counted``: the virtual time counts running items as not yet served, with
    the running counts kept by :meth:`pop`, :meth:`started` and :meth:`ended`
    (an engine's slots); without it, plain SFQ (a counted order whose running
    counts stay 0 is plain SFQ).
    """

    __slots__ = ("_flows", "_classes", "_heap", "_seq", "_count", "_live", "counted")

    def __init__(self, counted: bool = False) -> None:
        self._flows: dict[Tenant, _Flow] = {}
        self._classes: dict[int, _Class] = {}
        self._heap: list[_Entry] = []  # (rank, start tag, seq, flow)
        self._seq = itertools.count()
        self._count = 0
        self._live = 0  # backlogged flows (each with one live heap entry)
        self.counted = counted

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[K]:
        return iter([key for flow in self._flows.values() for key in flow.items])

    def _flow(self, tenant: Tenant) -> _Flow:
        flow = self._flows.get(tenant)
        if flow is None:
            cls = self._classes.get(tenant.priority)
            if cls is None:
                cls = self._classes[tenant.priority] = _Class()
            flow = self._flows[tenant] = _Flow(tenant, cls)
        return flow

    # -- running counts (counted orders) --------------------------------------

    def started(self, tenant: Tenant) -> None:
        """One more item of ``tenant`` holds a slot, taken without queueing here
        (nothing was queued, or another order's item was handed this slot: a
        slot is free only while nothing is queued, so ``tenant`` is not
        backlogged here): it is charged to the tenant like a grant."""
        flow = self._flow(tenant)
        flow.running += 1
        flow.finish += flow.cost

    def ended(self, tenant: Tenant) -> None:
        """One item of ``tenant`` gave its slot back."""
        flow = self._flows[tenant]
        flow.running -= 1
        if flow.entry >= 0:
            return
        cls = flow.cls
        if self.counted and (not self._count or self._top().cls is not cls):
            # Nothing of its class is queued (or only behind another class):
            # the virtual time follows the work finished, so that a tenant
            # arriving later gets no credit for what this one ran uncontested,
            # only for what it holds then.
            cls.vtime = max(cls.vtime, flow.finish - flow.running * flow.cost)
        if not flow.running and flow.finish <= cls.vtime:
            # Idle, and its finish tag is no credit: forgotten (a request built
            # without a tenant has a tenant of its own; they must not pile up).
            del self._flows[tenant]

    def running(self, tenant: Tenant) -> int:
        """``tenant``'s items holding a slot now."""
        flow = self._flows.get(tenant)
        return 0 if flow is None else flow.running

    # -- items -----------------------------------------------------------------

    def push(self, tenant: Tenant, key: K, value: Any) -> None:
        """Append ``key`` (with ``value``) to ``tenant``'s flow."""
        flow = self._flow(tenant)
        if flow.entry < 0:
            # Backlogged again: no credit for the time it was idle.
            flow.tag = max(self._vtime(flow.cls), flow.finish)
            self._live += 1
            self._push(flow)
        flow.items[key] = value
        self._count += 1

    def discard(self, tenant: Tenant, key: K) -> None:
        """Remove ``key`` unserved (its flow's entries go when they reach the top)."""
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

    def pop(self) -> tuple[K, Any]:
        """The next ``(key, value)``, charged to its tenant (and counted running in a
        counted order). ``IndexError`` when empty."""
        if not self._count:
            raise IndexError("pop from an empty FairOrder")
        flow = self._top()
        key, value = flow.items.popitem(last=False)
        self._charge(flow, started=True)
        return key, value

    def pop_first(self, may: Callable[[K], bool]) -> tuple[K, Any] | None:
        """The next ``(key, value)`` for which ``may(key)`` holds, not counted running
        here (it runs elsewhere): the chosen flow's first such item, else the next
        flow's in SFQ order (almost always the chosen flow's head: O(1) in
        practice); ``None`` if there is none."""
        if not self._count:
            return None
        chosen = self._top()
        rest = (e[3] for e in sorted(self._heap) if e[2] == e[3].entry and e[3] is not chosen)
        for flow in (chosen, *rest):
            for key in flow.items:
                if may(key):
                    value = flow.items.pop(key)
                    if flow is chosen:
                        self._charge(flow, started=False)
                    else:
                        self._count -= 1  # a later flow's: its tag is left as it was
                    return key, value
        return None

    # -- the heap ---------------------------------------------------------------

    def _push(self, flow: _Flow) -> None:
        seq = flow.entry = next(self._seq)
        heapq.heappush(self._heap, (flow.rank, flow.tag, seq, flow))
        if len(self._heap) > 2 * self._live + _SLACK:
            kept = [e for e in self._heap if e[2] == e[3].entry]
            heapq.heapify(kept)
            self._heap = kept

    def _top(self) -> _Flow:
        """The flow of the heap's first live entry (the order holds items),
        dropping stale entries and flows emptied by discards on the way."""
        heap = self._heap
        while True:
            _, _, seq, flow = heap[0]
            if seq == flow.entry:
                if flow.items:
                    return flow
                self._retire(flow)
            heapq.heappop(heap)

    def _retire(self, flow: _Flow) -> None:
        """``flow`` has no items left: it is no longer backlogged (its entry goes stale)."""
        flow.entry = -1
        self._live -= 1

    def _finished(self, flow: _Flow) -> float:
        """``flow``'s start tag less its running items' cost (counted orders)."""
        return flow.tag - flow.running * flow.cost if self.counted else flow.tag

    def _vtime(self, cls: _Class) -> float:
        """``cls``'s virtual time now: what its head flow has finished, or, when
        the order's head is of another class (or the order is empty), as of
        ``cls``'s last grant."""
        if self._count:
            top = self._top()
            if top.cls is cls:
                cls.vtime = self._finished(top)
        return cls.vtime

    def _charge(self, flow: _Flow, *, started: bool) -> None:
        """One item of ``flow``, the head flow (the smallest start tag), was served."""
        flow.cls.vtime = self._finished(flow)
        self._count -= 1
        finish = flow.finish = flow.tag + flow.cost
        if started:
            flow.running += 1
        if flow.items:
            flow.tag = finish
            seq = flow.entry = next(self._seq)  # its entry is the heap's first: replace it
            heapq.heapreplace(self._heap, (flow.rank, finish, seq, flow))
        else:
            self._retire(flow)
