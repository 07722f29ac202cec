"""Prefix-block keys shared by the prefix-aware baselines.

A request's `prefix_hashes` name its prompt's blocks (Mooncake: one id per 512 tokens; equal ids
= same block content). A block can only be reused when everything before it matches too, so
each block gets a *chained* key: key_0 = hash((ROOT, h_0)), key_i = hash((key_{i-1}, h_i)). A set
of chained keys then answers "is this whole prefix cached" by membership, like a radix tree.
(Integer ids hash the same in every process, so runs are reproducible across processes.)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

ROOT = 0x5EED


def chained_keys(prefix_hashes: Iterable) -> list[int]:
    keys: list[int] = []
    prev: object = ROOT
    for h in prefix_hashes:
        prev = hash((prev, h))
        keys.append(prev)
    return keys


def leading_matches(keys: Sequence[int], held: OrderedDict[int, float] | set[int] | dict[int, float]) -> int:
    """How many of `keys`, from the first, are all present in `held`."""
    n = 0
    for k in keys:
        if k not in held:
            break
        n += 1
    return n


class LruBlocks:
    """One replica's approximate cache: chained block keys with a token weight each, LRU-evicted
    beyond `capacity_tokens`."""

    __slots__ = ("_blocks", "capacity_tokens", "size_tokens")

    def __init__(self, capacity_tokens: float) -> None:
        self._blocks: OrderedDict[int, float] = OrderedDict()
        self.capacity_tokens = capacity_tokens
        self.size_tokens = 0.0

    @property
    def blocks(self) -> OrderedDict[int, float]:
        return self._blocks

    def insert(self, keys: Sequence[int], tokens_per_block: float) -> tuple[list[int], list[int]]:
        """Add `keys` as the most recent; returns the keys it added (those not held yet) and the
        keys it evicted, for indexes kept alongside."""
        added = []
        for k in keys:
            if k in self._blocks:
                self._blocks.move_to_end(k)
            else:
                self._blocks[k] = tokens_per_block
                self.size_tokens += tokens_per_block
                added.append(k)
        evicted = []
        while self.size_tokens > self.capacity_tokens and self._blocks:
            k, t = self._blocks.popitem(last=False)
            self.size_tokens -= t
            evicted.append(k)
        return added, evicted
