"""The engine model's KV cache: a budget of blocks shared by running sequences
and the prefix cache (docs/sim.md, "Engine model").

vLLM v1 (``vllm/v1/core/kv_cache_manager.py``) allocates KV in blocks of
``block_size`` tokens as a sequence grows; a full block it has hashed stays in
the prefix cache when its sequence ends and is evicted (least recently used)
only when a new allocation needs room; a block a running sequence uses is
never evicted. Here the budget counts two kinds of blocks:

- *private*: blocks only one running sequence holds (its partial last prompt
  block and its generated tokens), counted by :class:`KVBudget`;
- *cached*: blocks in the :class:`~trioforward.sim.physics._prefix_cache.PrefixCache`
  (full prompt blocks, shared by every sequence with that prefix; pinned while
  one runs, evictable otherwise).

``total_blocks == 0`` is the unlimited budget (today's sim without
``--kv-cache-tokens``): every reservation succeeds. Pure: no I/O, no trio.
"""

from __future__ import annotations

from trioforward.sim.physics._prefix_cache import PrefixCache

__all__ = ["KVBudget"]


class KVBudget:
    """``tokens`` of KV (0 = unlimited) in blocks of ``block_size``, shared with ``cache``.

    Raises ``ValueError`` if ``tokens`` is positive but below one block.
    """

    __slots__ = ("block_size", "total_blocks", "private", "cache")

    def __init__(self, tokens: int, block_size: int, cache: PrefixCache | None) -> None:
        if 0 < tokens < block_size:
            raise ValueError(f"kv_cache_tokens ({tokens}) must hold one block of {block_size}")
        self.block_size = block_size
        self.total_blocks = tokens // block_size
        self.private = 0
        self.cache = cache

    @property
    def limited(self) -> bool:
        return self.total_blocks > 0

    def free(self) -> int:
        """Blocks neither private nor cached (evictable cached blocks not included)."""
        cached = self.cache.blocks if self.cache is not None else 0
        return self.total_blocks - self.private - cached

    def room(self, n: int) -> bool:
        """Make ``n`` blocks free, evicting unpinned cached blocks if needed;
        False if even that is not enough (nothing is evicted then)."""
        if not self.limited:
            return True
        short = n - self.free()
        if short <= 0:
            return True
        cache = self.cache
        if cache is None or cache.blocks - cache.pinned < short:
            return False
        cache.evict(short)
        return True

    def reserve(self, n: int) -> bool:
        """Take ``n`` private blocks; False (nothing taken) if they do not fit."""
        if not self.room(n):
            return False
        self.private += n
        return True

    def release(self, n: int) -> None:
        """Give ``n`` private blocks back."""
        self.private -= n

    def trim(self) -> None:
        """Evict unpinned cached blocks until the budget holds again (after an insert)."""
        if self.limited and self.cache is not None and self.free() < 0:
            self.cache.evict(-self.free())

    def usage(self) -> float:
        """Fraction of blocks in use by running sequences (private + pinned),
        as ``vllm:kv_cache_usage_perc`` reports it (evictable cached blocks count
        as free); 0.0 when unlimited."""
        if not self.limited:
            return 0.0
        pinned = self.cache.pinned if self.cache is not None else 0
        return (self.private + pinned) / self.total_blocks
