"""vLLM's automatic prefix caching, as a model: which prompt tokens need no prefill.

vLLM (``--enable-prefix-caching``, the default of its V1 engine) keeps the KV of
every *full* block of ``block_size`` tokens it has computed, keyed by a hash
chain: a block's key is the hash of its parent block's key, its own token ids
and extra keys such as the LoRA adapter. A new request reuses the longest run
of leading blocks whose keys are cached and computes only the tokens after it.
The last prompt token is always computed (its logits start the decode), so a
prompt of ``L`` tokens reuses at most ``(L - 1) // block_size`` blocks. Blocks
of generated tokens are cached too, so a next turn whose prompt is this turn's
prompt plus its answer reuses both. Freed blocks are evicted least recently
used first. (vLLM docs, "Automatic Prefix Caching", design page.)

This model keeps that arithmetic and a small memory manager: a capacity in
tokens (``capacity // block_size`` blocks) and LRU over the cached blocks. A
block a running sequence uses is *pinned* (:meth:`PrefixCache.pin`) and never
evicted, as vLLM's reference counts keep it; only the engine model (a profile,
``_scheduler.py``) pins, the plain timing model does not.

Keys are Python ``hash()`` of ``(parent key, token-id tuple)``: stable within
one process, which is all one engine needs. No I/O, no trio.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trioforward.sim.core._stats import EngineStats
    from trioforward.sim.model._api import Generation
    from trioforward.sim.model._generate import Sample

__all__ = ["PrefixCache", "DEFAULT_BLOCK_SIZE", "prefill_tokens", "cache_outputs"]

#: vLLM's default KV block size on GPUs (``--block-size``), in tokens.
DEFAULT_BLOCK_SIZE = 16


class PrefixCache:
    """Full-block prefix cache of one engine, bounded by ``capacity`` tokens.

    ``capacity``: tokens kept at most (rounded down to whole blocks; must be
    >= ``block_size``); ``block_size``: tokens per block (>= 1). Raises
    ``ValueError`` for either out of range.

    Counters: ``blocks`` (cached now), ``evictions`` (blocks evicted so far).
    Cost: :meth:`match` and :meth:`insert` are O(len(tokens) / block_size).
    """

    __slots__ = ("block_size", "capacity_blocks", "_blocks", "_pins", "evictions")

    def __init__(self, capacity: int, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if capacity < block_size:
            raise ValueError(f"capacity ({capacity} tokens) must hold one block of {block_size}")
        self.block_size = block_size
        self.capacity_blocks = capacity // block_size
        # key -> None, least recently used first
        self._blocks: OrderedDict[int, None] = OrderedDict()
        # key -> running sequences using it (absent = evictable)
        self._pins: dict[int, int] = {}
        self.evictions = 0

    @property
    def blocks(self) -> int:
        return len(self._blocks)

    @property
    def pinned(self) -> int:
        """Cached blocks that running sequences use now (not evictable)."""
        return len(self._pins)

    def full_keys(self, model: str, tokens: Sequence[int]) -> list[int]:
        """The keys of every full block of ``tokens`` (what :meth:`insert` caches)."""
        return self._keys(model, tokens, len(tokens) // self.block_size)

    def pin(self, keys: list[int]) -> None:
        """Mark ``keys`` (cached) as used by one more running sequence."""
        pins = self._pins
        for key in keys:
            pins[key] = pins.get(key, 0) + 1

    def unpin(self, keys: list[int]) -> None:
        """Undo one :meth:`pin` of ``keys``; a block no sequence uses is evictable again."""
        pins = self._pins
        for key in keys:
            left = pins.get(key, 0) - 1
            if left > 0:
                pins[key] = left
            else:
                pins.pop(key, None)

    def evict(self, n: int) -> int:
        """Evict up to ``n`` unpinned blocks, least recently used first; returns how many."""
        if n <= 0:
            return 0
        blocks, pins = self._blocks, self._pins
        victims = []
        for key in blocks:
            if key not in pins:
                victims.append(key)
                if len(victims) == n:
                    break
        for key in victims:
            del blocks[key]
        self.evictions += len(victims)
        return len(victims)

    def _keys(self, model: str, tokens: Sequence[int], n_blocks: int) -> list[int]:
        size = self.block_size
        key = hash(model)  # the adapter is part of every key (vLLM's extra keys)
        keys = []
        for i in range(n_blocks):
            key = hash((key, tuple(tokens[i * size : (i + 1) * size])))
            keys.append(key)
        return keys

    def match(self, model: str, tokens: Sequence[int]) -> int:
        """Prompt tokens of ``tokens`` already cached: a multiple of ``block_size``,
        at most ``len(tokens) - 1``. Marks the matched blocks recently used."""
        if not tokens:
            return 0
        blocks = self._blocks
        hits = []
        for key in self._keys(model, tokens, (len(tokens) - 1) // self.block_size):
            if key not in blocks:
                break
            hits.append(key)
        self._touch(hits)
        return len(hits) * self.block_size

    def _touch(self, keys: list[int]) -> None:
        # Tail blocks first, so a chain is evicted from its end and a cached
        # block's parent is always cached (vLLM frees a request's blocks in
        # reverse order for the same reason).
        blocks = self._blocks
        for key in reversed(keys):
            if key in blocks:
                blocks.move_to_end(key)
            else:
                blocks[key] = None

    def insert(self, model: str, tokens: Sequence[int]) -> None:
        """Cache every full block of ``tokens`` (prompt, or prompt + generated),
        evicting the least recently used blocks beyond the capacity."""
        self._touch(self._keys(model, tokens, len(tokens) // self.block_size))
        excess = len(self._blocks) - self.capacity_blocks
        if excess > 0:
            if self._pins:
                self.evict(excess)
            else:  # the plain timing model never pins: the fast path
                blocks = self._blocks
                for _ in range(excess):
                    blocks.popitem(last=False)
                self.evictions += excess

    def clear(self) -> None:
        """Drop every unpinned block (vLLM's ``POST /reset_prefix_cache``)."""
        if self._pins:
            self.evict(len(self._blocks))
        else:
            self._blocks.clear()


def prefill_tokens(cache: PrefixCache | None, stats: EngineStats, gen: Generation) -> int:
    """Look ``gen``'s prompts up in ``cache`` (None = no cache) and cache them.

    Returns the prompt tokens to prefill (each prompt once, whatever ``n``);
    counts them in ``stats.prompt_tokens_computed`` and the cached ones in
    ``stats.prompt_tokens_cached``; sets ``gen.cached_tokens`` when there is a cache.
    """
    total = sum(map(len, gen.prompts))
    cached = 0
    if cache is not None:
        for prompt in gen.prompts:
            cached += cache.match(gen.model, prompt)
            cache.insert(gen.model, prompt)
        gen.cached_tokens = cached
    stats.prompt_tokens_cached += cached
    stats.prompt_tokens_computed += total - cached
    return total - cached


def cache_outputs(cache: PrefixCache | None, gen: Generation, samples: list[Sample]) -> None:
    """Cache the full blocks of each choice's prompt + generated tokens."""
    if cache is not None:
        for index, s in enumerate(samples):
            cache.insert(gen.model, gen.prompts[index // gen.n] + s.tokens)
