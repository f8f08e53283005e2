"""Prefix-affinity routing with bounded loads (``routing = "prefix"``; docs/dispatch.md).

Engines keep the KV of prompts they have computed (vLLM's automatic prefix
caching, SGLang's radix cache), so a request is cheapest on the engine that
already holds the longest prefix of its prompt. Three rules choose it:

1. **Continuation affinity (local, bounded).** A table remembers, for the last
   ``table_size`` prompts routed, the hash of the prompt's full blocks and the
   engine it went to. A request whose prompt *extends* a remembered prompt —
   the next turn of an agentic rollout (prompt + answer + new tokens), or
   another member of a GRPO group (the same prompt) — goes to that engine.
   The request's chain hashes are computed once, O(prompt blocks); the table
   is probed from the deepest block back and holds one entry per prompt.
2. **Consistent hashing with bounded loads** (Mirrokni, Thorup & Zadimoghaddam,
   "Consistent Hashing with Bounded Loads", SODA 2018; arXiv 1608.01350).
   Otherwise — a new prefix, or the remembered engine is full or gone — the
   engines are ranked by rendezvous score of a stable hash of the prompt's
   first ``prefix_tokens`` tokens (the *anchor*, the same in every process),
   and the first engine with room takes it. *Room* (``_affinity.has_room``):
   outstanding requests (in flight — or what the engine itself reports
   running and waiting, if more — plus queued) below
   ``ceil(load_factor * (m + 1) / n)``, ``m`` the outstanding total and ``n``
   the eligible engines; or, with a known capacity, a free slot and fewer than
   ``floor`` (``affinity_floor``, 8) outstanding. The floor matters at low
   load: the bound alone (3 with 8 requests in flight on 4 engines of 16
   slots) split conversations over engines that all had idle slots, and the
   cache was the whole gain. Above the floor a hot prefix spreads: 24
   requests of one prefix on two engines run at most ceil(1.25 * 12) = 15 on
   one. No engine queues above ``load_factor`` times the mean, and some engine
   always has room.

3. **Work conservation.** A request that would queue on the chosen engine
   (no free slot: all of this process's share of its capacity is taken)
   while another engine has a free slot goes to the first such engine in the
   anchor's order. The
   other half — a slot that frees takes a request queued elsewhere — is the
   dispatcher's (``_queueing.conserve``), since only it sees slots free; it
   tells the table (:meth:`PrefixRouter.moved`), so the moved prompt's
   continuations follow it to the engine that now holds it.

With ``table_size = 0`` only rules 2 and 3 apply and the choice is a pure function
of the prompt, the engine list and the loads: every gateway of a fleet makes
the same first choice for the same prompt, with no shared state. The table only
adds affinity for continuations this process has seen; removing, pausing or
ejecting an engine moves only the prompts that were on it (rendezvous order).

Rendering (:func:`prefix_key`): a prompt becomes bytes that extend when the
prompt extends — token ids as their JSON text, each followed by a comma
(``1,2,3,``), text as UTF-8, chat messages as the JSON of each ``[role,
content]`` pair in order — read in blocks of ``BLOCK_BYTES`` (about 45 ids or
64 tokens of text), the model name first (adapters do not share KV). The
anchor covers the first ``prefix_tokens`` ids, or ``4 * prefix_tokens`` bytes
of text. Blocks are hashed with Python's ``hash`` (salted per process: it only
keys the local table); the anchor with BLAKE2b (the same everywhere).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import orjson

from trioforward.dispatch.engines._affinity import FLOOR, bounded_choice, has_room, load_bound
from trioforward.dispatch.engines._routing import Routable, rendezvous_score

__all__ = ["PrefixKey", "PrefixRouter", "prefix_key", "request_prefix_key", "BLOCK_BYTES"]

#: One routing block of the rendered prompt, in bytes.
BLOCK_BYTES = 256
_TEXT_BYTES_PER_TOKEN = 4  # for the anchor of text and chat prompts
_NUMPY = orjson.OPT_SERIALIZE_NUMPY

E = TypeVar("E", bound=Routable)


@dataclass(frozen=True, slots=True)
class PrefixKey:
    """What prefix routing knows of one prompt.

    ``anchor``: stable 64-bit hash of the model and the first ``prefix_tokens``
    tokens (the whole prompt if shorter); ``chain``: local hashes of the
    prompt's full blocks, ``chain[d]`` covering blocks ``0..d`` (empty for a
    prompt shorter than one block).
    """

    anchor: int
    chain: tuple[int, ...]


def _render(body: dict[str, Any], prefix_tokens: int) -> tuple[bytes, bytes] | None:
    """``(rendering, anchor bytes)`` of the first prompt of a completion or chat body."""
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        parts = []
        for m in messages:
            if not isinstance(m, dict):
                return None
            parts.append(orjson.dumps([m.get("role"), m.get("content")], option=_NUMPY))
        data = b"".join(parts)
        return data, data[: prefix_tokens * _TEXT_BYTES_PER_TOKEN]
    prompt = body.get("prompt")
    if prompt is None:  # the token routes: SGLang /generate, vLLM /inference/v1/generate
        prompt = body.get("input_ids", body.get("token_ids"))
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str, np.ndarray)):
        prompt = prompt[0]  # a batch: its first prompt
    if isinstance(prompt, str):
        data = prompt.encode()
        return (data, data[: prefix_tokens * _TEXT_BYTES_PER_TOKEN]) if data else None
    if isinstance(prompt, (list, np.ndarray)) and len(prompt):
        try:
            # orjson writes ints one way only; a list and an int array render alike.
            data = orjson.dumps(prompt, option=_NUMPY)[1:-1] + b","
            head = orjson.dumps(prompt[:prefix_tokens], option=_NUMPY)
        except orjson.JSONEncodeError:
            return None
        return data, head
    return None


def prefix_key(body: Any, prefix_tokens: int) -> PrefixKey | None:
    """The :class:`PrefixKey` of a ``/v1/completions`` or ``/v1/chat/completions``
    body (a parsed JSON object), or ``None`` when it has no prompt to route by.

    Cost: O(prompt length) — one rendering (orjson), one hash per block.
    """
    if not isinstance(body, dict):
        return None
    rendered = _render(body, prefix_tokens)
    if rendered is None:
        return None
    data, head = rendered
    model = body.get("model")
    seed = (model if isinstance(model, str) else "").encode() + b"\0"
    anchor = int.from_bytes(hashlib.blake2b(seed + head, digest_size=8).digest(), "little")
    h = hash(seed)
    chain = []
    for start in range(0, len(data) - BLOCK_BYTES + 1, BLOCK_BYTES):
        h = hash((h, data[start : start + BLOCK_BYTES]))
        chain.append(h)
    return PrefixKey(anchor, tuple(chain))


_PROMPT_KEYS = frozenset({"prompt", "messages", "input_ids", "token_ids"})


def request_prefix_key(json: Any, content: bytes, prefix_tokens: int) -> PrefixKey | None:
    """:func:`prefix_key` of a forwarded request: from ``json`` (the parsed body)
    when it holds the prompt, else from the body bytes ``content``."""
    if not (isinstance(json, dict) and _PROMPT_KEYS.intersection(json)):
        try:
            json = orjson.loads(content) if content else None
        except orjson.JSONDecodeError:
            return None
    return prefix_key(json, prefix_tokens)


class PrefixRouter:
    """Rules 1 and 2 of the module docstring over one engine list.

    ``load_factor`` (>= 1): the bound, a multiple of the mean outstanding load;
    ``table_size``: prompts remembered for continuation affinity (0 = none).
    """

    __slots__ = ("load_factor", "table_size", "floor", "_table")

    def __init__(self, load_factor: float, table_size: int, *, floor: int = FLOOR) -> None:
        if not load_factor >= 1.0:
            raise ValueError(f"load_factor must be >= 1, got {load_factor}")
        self.load_factor = load_factor
        self.table_size = table_size
        self.floor = floor
        self._table: OrderedDict[int, Routable] = OrderedDict()

    def __len__(self) -> int:
        return len(self._table)

    def room(self, engines: Sequence[Routable]) -> int:
        """The load bound: an engine takes a request only while its outstanding
        count is below ``ceil(load_factor * (m + 1) / n)`` (0 with no eligible engine)."""
        return load_bound(engines, self.load_factor)

    def pick(self, engines: Sequence[E], key: PrefixKey, avoid: E | None) -> E | None:
        """The engine for ``key``, or ``None`` if none is eligible. ``avoid`` (an
        engine that just failed) is chosen only if it is the sole eligible one."""
        room = self.room(engines)
        if room == 0:
            return None
        chosen = self._remembered(key, avoid, room)
        if chosen is None:
            chosen = bounded_choice(engines, key.anchor, avoid, room, self.floor)
        if chosen is not None and not chosen.free_slot:
            # Work conservation: a request that would queue while another engine
            # has a free slot (and room) goes there instead.
            chosen = _spare(engines, key.anchor, avoid, room) or chosen
        if chosen is not None and key.chain and self.table_size:
            self._remember(key.chain[-1], chosen)
        return chosen  # type: ignore[return-value]

    def moved(self, key: PrefixKey, engine: Routable) -> None:
        """``key``'s request left the engine :meth:`pick` chose for ``engine``
        (work conservation took it from a queue): its continuations follow it
        there, where its prompt will be cached (O(1))."""
        if key.chain and self.table_size:
            self._remember(key.chain[-1], engine)

    def _remembered(self, key: PrefixKey, avoid: Routable | None, room: int) -> Routable | None:
        table = self._table
        for h in reversed(key.chain):
            engine = table.get(h)
            if engine is not None:
                table.move_to_end(h)
                if engine.eligible and engine is not avoid and has_room(engine, room, self.floor):
                    return engine
                return None  # the deepest match is full or gone: rank by anchor
        return None

    def _remember(self, h: int, engine: Routable) -> None:
        table = self._table
        table[h] = engine
        table.move_to_end(h)
        if len(table) > self.table_size:
            table.popitem(last=False)


def _spare(engines: Sequence[E], anchor: int, avoid: E | None, room: int) -> E | None:
    """The first engine in ``anchor``'s preference order with a free slot."""
    best: E | None = None
    best_score = -1
    for e in engines:
        if e.eligible and e is not avoid and e.free_slot:
            score = rendezvous_score(anchor, e.seed)
            if score > best_score:
                best, best_score = e, score
    return best
