"""Prefix affinity for the `tidegate` pick: where a prompt's prefix is (probably) cached, and
where it should live when it is cached nowhere yet. Pure apart from the index's own state.

- `PrefixIndex`: per replica, the chained prefix-block keys this router recently sent there,
  bounded to the replica's KV capacity in tokens and evicted as the engine's prefix cache evicts
  (`_ReplicaCache`): the blocks of requests in flight there are pinned, and the others leave
  least recently released first. Expected cached tokens = leading blocks found x tokens per
  block.
- `home_order`: rendezvous (highest-random-weight) hashing of the prompt's first blocks over
  the candidates. Every router computes the same order from the same prompt and the same
  candidate ids, with no shared state, so a new prefix lands on the same replica whichever
  router sees it, and its later requests find it there.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from itertools import groupby, repeat

from tidegate.policy.baselines.prefix_blocks import chained_keys, leading_matches

# The home is chosen by the chained key of the block that covers the first HOME_TOKENS prompt
# tokens (or the prompt's last block when shorter): deep enough that different documents or
# conversations get different homes, shallow enough that a conversation's later turns, which
# extend its prompt, keep the same one.
HOME_TOKENS = 1024
# Index capacity when the table does not say how much KV a replica has.
DEFAULT_CAPACITY_TOKENS = 400_000
# Sets of replicas (bitmasks) whose ids PrefixIndex keeps listed; past this it starts over (a pool
# of n replicas has at most 2^n, the picks meet only those its prompts' prefixes are held by).
_MAX_NAMED_MASKS = 4096
_MASK = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a stable, well-spread 64-bit hash of an integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def id_hash(replica_id: str) -> int:
    # Process-independent (str.__hash__ is salted per process; routers must agree).
    return int.from_bytes(hashlib.blake2b(replica_id.encode(), digest_size=8).digest(), "big")


class _ReplicaCache:
    """One replica's prefix cache as the engine keeps it (vLLM's KV cache manager;
    simulator/engine.py): a block used by a running request cannot be evicted, and one no request
    uses stays resident until an allocation needs room, oldest released first.

    An LRU by dispatch time alone (this index before) drops the blocks of a request dispatched
    long ago that is still decoding, which the engine must keep, and keeps as many tokens of
    finished requests' blocks as the whole KV holds, where the engine keeps only what the running
    ones leave. Under load, running requests hold most of a replica's KV, and the router then
    predicted whole prompts cached that the engine had evicted (Mooncake at 1.5x capacity: 7 % of
    requests, 4.0M of 18.5M predicted cached tokens; docs/BENCHMARKS.md), so it opened replicas
    over their prefill budget for prefills that were in truth far larger and missed TPOT."""

    __slots__ = ("capacity_tokens", "free", "held", "refs", "size_tokens")

    def __init__(self, capacity_tokens: float) -> None:
        self.capacity_tokens = capacity_tokens
        self.held: dict[int, float] = {}            # every block resident: key -> its tokens
        self.refs: dict[int, int] = {}              # blocks in use: key -> requests in flight using it
        self.free: OrderedDict[int, None] = OrderedDict()   # the others, least recently released first
        self.size_tokens = 0.0

    @property
    def blocks(self) -> dict[int, float]:
        return self.held

    def insert(self, keys: Sequence[int], tokens_per_block: float, pin: bool) -> tuple[list[int], list[int]]:
        """The blocks are resident now: pinned by a request in flight (`pin`), or released at
        once (a peer's report: its completions are not seen here), tail first as `release` does,
        so that room made later takes their tail and leaves their head reusable. Returns the keys
        added and the keys evicted to make room."""
        held, refs, free = self.held, self.refs, self.free
        added = []
        for k in (keys if pin else reversed(keys)):
            if k not in held:
                held[k] = tokens_per_block
                self.size_tokens += tokens_per_block
                added.append(k)
            elif k in free:
                if pin:
                    del free[k]
                else:
                    free.move_to_end(k)
                    continue
            elif not pin:
                continue    # in use: stays pinned
            if pin:
                refs[k] = refs.get(k, 0) + 1
            else:
                free[k] = None
        if not pin:
            added.reverse()
        evicted = []
        while self.size_tokens > self.capacity_tokens and free:
            k, _ = free.popitem(last=False)
            self.size_tokens -= held.pop(k)
            evicted.append(k)
        return added, evicted

    def release(self, keys: Sequence[int]) -> None:
        """A request that pinned `keys` finished: blocks no other request uses become evictable,
        its tail first (the engine frees a request's blocks tail first)."""
        refs, free = self.refs, self.free
        for k in reversed(keys):
            r = refs.get(k)
            if r is None:
                continue
            if r > 1:
                refs[k] = r - 1
            else:
                del refs[k]
                free[k] = None


class PrefixBlocks:
    """A request's chained block keys and the prompt tokens each block stands for."""

    __slots__ = ("home_key", "keys", "tokens_per_block")

    def __init__(self, prefix_hashes: Sequence, prompt_tokens: int, block_tokens: int = 0) -> None:
        """`block_tokens`: prompt tokens per hash, when known; else the hashes cover the prompt
        evenly. The router hashes at most a bounded number of blocks, so a long prompt's hashes
        cover only its head: dividing its whole length by their number would overstate them."""
        self.keys = chained_keys(prefix_hashes)
        if not self.keys:
            self.tokens_per_block = 0.0
        elif block_tokens > 0:
            self.tokens_per_block = float(block_tokens)
        else:
            self.tokens_per_block = max(1.0, prompt_tokens / len(self.keys))
        if self.keys:
            depth = max(1, min(len(self.keys), round(HOME_TOKENS / self.tokens_per_block)))
            self.home_key: int | None = self.keys[depth - 1] & _MASK
        else:
            self.home_key = None


class PrefixIndex:
    """Approximate prefix caches of the replicas, learned from this router's own dispatches.

    Alongside each replica's LRU, every key held anywhere maps to a bitmask of the replicas that
    hold it (one bit per replica), so that `cached_tokens_all` answers for the whole pool in one
    walk of the prompt's keys instead of one walk per replica (a shared system prompt makes those
    walks long, and the pick asks for every candidate on every request)."""

    def __init__(self) -> None:
        self._lru: dict[str, _ReplicaCache] = {}
        self._ids: dict[str, int] = {}
        self._holders: dict[int, int] = {}     # key -> bits of the replicas whose LRU holds it
        self._bit: dict[str, int] = {}         # replica id -> its bit
        self._by_bit: dict[int, str] = {}
        # bitmask -> the ids of its replicas, lowest bit first (a bit never changes hands).
        self._names: dict[int, tuple[str, ...]] = {}

    def cached_tokens(self, replica_id: str, blocks: PrefixBlocks) -> int:
        idx = self._lru.get(replica_id)
        if idx is None or not blocks.keys:
            return 0
        return int(leading_matches(blocks.keys, idx.blocks) * blocks.tokens_per_block)

    def cached_tokens_all(self, blocks: PrefixBlocks) -> dict[str, int]:
        """`cached_tokens` of every replica whose count is not 0 (absent: 0)."""
        keys = blocks.keys
        if not keys or not self._bit:
            return {}
        # The replicas that hold each of the first i keys: a running AND of the keys' holders. The
        # holders come in runs of equal values (a prompt's blocks are learned together), which
        # itertools finds in C; the AND changes at most once per run, where the replicas that
        # lack that run's keys drop out with the count of keys before it. Once none is left, the
        # rest of the keys are not looked up (map and groupby are lazy).
        alive = (1 << len(self._bit)) - 1
        tpb, names = blocks.tokens_per_block, self._names_of
        out: dict[str, int] = {}
        n = 0      # keys before the current run
        for mask, run in groupby(map(self._holders.get, keys, repeat(0))):
            lost = alive & ~mask
            if lost:
                if n:
                    out.update(dict.fromkeys(names(lost), int(n * tpb)))
                alive &= mask
                if not alive:
                    return out
            n += len(list(run))
        out.update(dict.fromkeys(names(alive), int(n * tpb)))   # those left hold every key
        return out

    def _names_of(self, mask: int) -> tuple[str, ...]:
        ids = self._names.get(mask)
        if ids is None:
            if len(self._names) >= _MAX_NAMED_MASKS:
                self._names.clear()
            found, m = [], mask
            while m:
                bit = m & -m
                found.append(self._by_bit[bit])
                m ^= bit
            ids = self._names[mask] = tuple(found)
        return ids

    def learn(self, replica_id: str, blocks: PrefixBlocks, capacity_tokens: float, pin: bool = False) -> list[int]:
        """The request's blocks are now cached on the replica; returns the keys new there. `pin`:
        the request is in flight there and holds them until `release`."""
        return self.learn_keys(replica_id, blocks.keys, blocks.tokens_per_block, capacity_tokens, pin)

    def release(self, replica_id: str, blocks: PrefixBlocks) -> None:
        """A request `learn`ed with `pin` is done there: its blocks may be evicted from now on."""
        self.release_keys(replica_id, blocks.keys)

    def release_keys(self, replica_id: str, keys: Sequence[int]) -> None:
        """`release` from the keys themselves (a peer's finished requests, peer_load.PeerPins)."""
        idx = self._lru.get(replica_id)
        if idx is not None and keys:
            idx.release(keys)

    def learn_keys(self, replica_id: str, keys: Sequence[int], tokens_per_block: float,
                   capacity_tokens: float, pin: bool = False) -> list[int]:
        """`learn` from the keys themselves (a peer router's report); returns the keys new there."""
        if not keys:
            return []
        idx = self._lru.get(replica_id)
        cap = capacity_tokens if capacity_tokens > 0 else DEFAULT_CAPACITY_TOKENS
        if idx is None:
            idx = self._lru[replica_id] = _ReplicaCache(cap)
            bit = self._bit[replica_id] = 1 << len(self._bit)
            self._by_bit[bit] = replica_id
        idx.capacity_tokens = cap
        added, evicted = idx.insert(keys, tokens_per_block, pin)
        bit, holders = self._bit[replica_id], self._holders
        for k in added:   # (a key added and evicted at once is in both: it ends without the bit)
            holders[k] = holders.get(k, 0) | bit
        for k in evicted:
            rest = holders[k] & ~bit
            if rest:
                holders[k] = rest
            else:
                del holders[k]
        return added

    def rank(self, replica_id: str, home_key: int) -> int:
        """Rendezvous score of `replica_id` for `home_key`: higher = more at home."""
        h = self._ids.get(replica_id)
        if h is None:
            h = self._ids[replica_id] = id_hash(replica_id)
        return _mix64(home_key ^ h)


def home_order(replica_ids: Sequence[str], blocks: PrefixBlocks) -> list[str]:
    """The candidates in rendezvous order for the prompt's home key (best first); the input order
    when the prompt has no blocks."""
    if blocks.home_key is None:
        return list(replica_ids)
    key = blocks.home_key
    return sorted(replica_ids, key=lambda r: (-_mix64(key ^ id_hash(r)), r))
