"""The fair order between tenants on its own: who goes next (docs/dispatch.md,
"Tenants and fair queueing").

Items (requests, Tinker samples) of many tenants wait in one *flow* per tenant,
oldest first. Two rules pick the next flow, priority classes above both (a
class is served only while no higher class has an item here):

1. **Fewest running first** (only when the order counts running items, as an
   engine's queue does: ``counted``). Each flow knows how many of its items
   hold a slot now (``running``). When the flow with the fewest running
   relative to its weight (``M``) would still be at or below the SFQ choice
   (``T``) with one more — ``(running_M + 1) / weight_M <= running_T /
   weight_T`` — ``M`` goes first. A tenant that arrives behind a flood thus
   takes every freed slot until it runs as many as the flood relative to the
   weights (its share of the slots, at once), and from then on each tenant
   keeps its own freed slots: nobody is preempted, nothing is cancelled.
2. **Start-time fair queueing** (SFQ; Goyal, Vin and Cheng, "Start-time Fair
   Queueing", SIGCOMM 1996) otherwise — for the shares rule 1 cannot state in
   whole slots (weights 3:1 on 2 slots) and between tenants running alike.
   Every item costs 1 (a slot, whatever its length: nobody knows a
   generation's length before it ends). Each backlogged flow has a start tag;
   the smallest goes (ties: the flow backlogged first) and its tag grows by
   ``1 / weight``. A flow that becomes backlogged starts at ``max(virtual
   time, its last finish tag)``, the virtual time being the smallest start tag
   at the last grant, so a tenant that was idle gets no credit for it. A grant
   by rule 1 advances the tag too, so over a long backlog the grants still
   split by weight.

Together the running counts of two backlogged tenants stay within one slot of
their weights' proportion, and rule 2 shares out what whole slots cannot.

Why SFQ and not deficit round robin: with unit costs DRR is weighted round
robin, which hands a weight-3 tenant three slots in a row and needs integral
weights; SFQ interleaves by any real weight and needs no quantum. Why not
finish-time WFQ: it needs each item's cost at arrival. Why the running rule
on top: SFQ alone gives a newcomer every other freed slot, so it reaches its
share only after its share's worth of the others' slots have freed twice over.

Cost: two heaps of flows, not of items (one per rule; an entry made stale by a
change is dropped when it reaches the top, and a heap is rebuilt once it holds
more than twice the live entries plus a few): O(log tenants) per item, no scan
of queued items. Cancellation (:meth:`FairOrder.discard`) is O(1).
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from trioforward.dispatch._tenants import Tenant

__all__ = ["FairOrder"]

K = TypeVar("K", bound=Hashable)
_SLACK = 8  # stale heap entries tolerated beyond twice the live ones


class _Class:
    """One priority class of one order: its virtual time (the smallest start tag
    of this class's backlogged flows at its last grant)."""

    __slots__ = ("vtime",)

    def __init__(self) -> None:
        self.vtime = 0.0


class _Flow:
    """One tenant's items, oldest first (key -> value), and its running count."""

    __slots__ = ("items", "finish", "tag", "entry", "run_entry", "rank", "cost", "cls", "running")

    def __init__(self, tenant: Tenant, cls: _Class) -> None:
        self.items: OrderedDict[Any, Any] = OrderedDict()
        self.finish = 0.0  # finish tag of this flow's item served last
        self.tag = 0.0  # start tag of its head while it is backlogged
        self.entry = -1  # sequence number of its live SFQ heap entry; -1: not backlogged
        self.run_entry = -1  # sequence number of its live running-heap entry
        self.rank = -tenant.priority  # heap key: a higher class first
        self.cost = 1.0 / tenant.weight
        self.cls = cls
        self.running = 0  # its items holding a slot now (counted orders)


_Entry = tuple[int, float, int, _Flow]  # (rank, key, sequence number, flow)


class FairOrder(Generic[K]):
    """Items of many tenants in fair order (module docstring): :meth:`push`,
    :meth:`pop` and :meth:`pop_first` O(log tenants), :meth:`discard` O(1).
    ``len()``: items held; iterating yields their keys (a snapshot).

    ``counted``: the order applies rule 1 (fewest running first) with the
    running counts kept by :meth:`started` / :meth:`ended` (an engine's slots);
    without it, SFQ alone (a counted order whose running counts stay 0 is SFQ).
    """

    __slots__ = ("_flows", "_classes", "_heap", "_run_heap", "_seq", "_count", "_live", "counted")

    def __init__(self, counted: bool = False) -> None:
        self._flows: dict[Tenant, _Flow] = {}
        self._classes: dict[int, _Class] = {}
        self._heap: list[_Entry] = []  # SFQ: (rank, start tag, seq, flow)
        self._run_heap: list[_Entry] = []  # rule 1: (rank, running / weight, seq, flow)
        self._seq = itertools.count()
        self._count = 0
        self._live = 0  # backlogged flows (each with one live entry per heap)
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
        """One more item of ``tenant`` holds a slot (taken without queueing here)."""
        flow = self._flow(tenant)
        flow.running += 1
        if flow.entry >= 0 and self.counted:
            self._push_run(flow)

    def ended(self, tenant: Tenant) -> None:
        """One item of ``tenant`` gave its slot back."""
        flow = self._flows[tenant]
        flow.running -= 1
        if flow.entry >= 0:
            if self.counted:
                self._push_run(flow)
        elif not flow.running and flow.finish <= flow.cls.vtime:
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
        flow.items[key] = value
        self._count += 1
        if flow.entry < 0:
            # Backlogged again: no credit for the time it was idle.
            flow.tag = max(flow.cls.vtime, flow.finish)
            self._live += 1
            self._push_sfq(flow)
            if self.counted:
                self._push_run(flow)

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
        top = self._top(self._heap, "entry")
        flow = self._choose(top)
        key, value = flow.items.popitem(last=False)
        self._charge(flow, top, started=True)
        return key, value

    def pop_first(self, may: Callable[[K], bool]) -> tuple[K, Any] | None:
        """The next ``(key, value)`` for which ``may(key)`` holds, not counted running
        here (it runs elsewhere): the chosen flow's first such item, else the next
        flow's in SFQ order (almost always the chosen flow's head: O(1) in
        practice); ``None`` if there is none."""
        if not self._count:
            return None
        top = self._top(self._heap, "entry")
        chosen = self._choose(top)
        rest = (e[3] for e in sorted(self._heap) if e[2] == e[3].entry and e[3] is not chosen)
        for flow in (chosen, *rest):
            for key in flow.items:
                if may(key):
                    value = flow.items.pop(key)
                    if flow is chosen:
                        self._charge(flow, top, started=False)
                    else:
                        self._count -= 1  # a later flow's: its tag is left as it was
                    return key, value
        return None

    # -- the heaps --------------------------------------------------------------

    def _push_sfq(self, flow: _Flow) -> None:
        seq = flow.entry = next(self._seq)
        heapq.heappush(self._heap, (flow.rank, flow.tag, seq, flow))
        if len(self._heap) > 2 * self._live + _SLACK:
            self._heap = self._rebuilt(self._heap, "entry")

    def _push_run(self, flow: _Flow) -> None:
        seq = flow.run_entry = next(self._seq)
        heapq.heappush(self._run_heap, (flow.rank, flow.running * flow.cost, seq, flow))
        if len(self._run_heap) > 2 * self._live + _SLACK:
            self._run_heap = self._rebuilt(self._run_heap, "run_entry")

    @staticmethod
    def _rebuilt(heap: list[_Entry], live: str) -> list[_Entry]:
        kept = [e for e in heap if e[2] == getattr(e[3], live)]
        heapq.heapify(kept)
        return kept

    def _top(self, heap: list[_Entry], live: str) -> _Flow:
        """The flow of ``heap``'s first live entry (the heap is non-empty of items),
        dropping stale entries and flows emptied by discards on the way."""
        while True:
            _, _, seq, flow = heap[0]
            if seq == getattr(flow, live):
                if flow.items:
                    return flow
                self._retire(flow)
            heapq.heappop(heap)

    def _retire(self, flow: _Flow) -> None:
        """``flow`` has no items left: it is no longer backlogged (its entries go stale)."""
        flow.entry = flow.run_entry = -1
        self._live -= 1

    def _choose(self, top: _Flow) -> _Flow:
        """Rule 1 against rule 2's ``top`` (module docstring)."""
        if not self.counted:
            return top
        fewest = self._top(self._run_heap, "run_entry")
        if fewest is not top and (fewest.running + 1) * fewest.cost <= top.running * top.cost:
            return fewest
        return top

    def _charge(self, flow: _Flow, top: _Flow, *, started: bool) -> None:
        """One item of ``flow`` was served (``top``: the flow of the smallest start tag)."""
        self._count -= 1
        flow.cls.vtime = top.tag
        finish = flow.finish = flow.tag + flow.cost
        if started:
            flow.running += 1
        if flow.items:
            flow.tag = finish
            if flow is top:  # its entry is the SFQ heap's first: replace it
                seq = flow.entry = next(self._seq)
                heapq.heapreplace(self._heap, (flow.rank, finish, seq, flow))
            else:
                self._push_sfq(flow)
            if self.counted:
                self._push_run(flow)
        else:
            self._retire(flow)
