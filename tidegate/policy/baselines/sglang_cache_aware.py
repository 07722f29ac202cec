"""`sglang_cache_aware`: the SGLang router's cache-aware policy (sgl-router, policies/cache_aware.rs).

    load(w)     = requests in flight from this router on w
    imbalanced  = max_load - min_load > 64  and  max_load > 1.5 * min_load
    imbalanced  -> the least-loaded worker (the tree still learns the request)
    otherwise   -> w* = worker with the longest prefix match in its approximate tree;
                   match_rate = matched blocks / request blocks;
                   match_rate > 0.3 -> w*, else the worker with the smallest tree
    then insert the request's blocks into the chosen worker's tree.

The real router keeps a radix tree of request *text* per worker; here the tree holds chained
prefix-block keys (prefix_blocks.py) weighted by tokens. A request without prefix hashes counts as
one unique block of its prompt (it matches nothing but grows the tree by its size, as unique
text would). Trees are capped at max_tree_size (2**26 characters ~ 2**24 tokens) by LRU on insert
rather than by the real router's periodic eviction thread.
"""

from __future__ import annotations

import random

from tidegate.policy.baselines.prefix_blocks import LruBlocks, chained_keys, leading_matches
from tidegate.policy.pick import Pick
from tidegate.policy.registry import PoolSnapshot, RequestFeatures, make_pick

CACHE_THRESHOLD = 0.3
BALANCE_ABS_THRESHOLD = 64
BALANCE_REL_THRESHOLD = 1.5
MAX_TREE_TOKENS = 2**26 // 4


class SglangCacheAware:
    name = "sglang_cache_aware"
    uses_prefix_hashes = True  # the router computes RequestFeatures.prefix_hashes only for such policies

    def __init__(self, cache_threshold: float = CACHE_THRESHOLD, balance_abs_threshold: int = BALANCE_ABS_THRESHOLD,
                 balance_rel_threshold: float = BALANCE_REL_THRESHOLD) -> None:
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self._trees: dict[str, LruBlocks] = {}
        self._unique = 0

    def _tree(self, replica_id: str) -> LruBlocks:
        t = self._trees.get(replica_id)
        if t is None:
            t = self._trees[replica_id] = LruBlocks(MAX_TREE_TOKENS)
        return t

    def pick(self, snapshot: PoolSnapshot, request: RequestFeatures, rng: random.Random) -> Pick | None:
        cands = snapshot.candidates()
        if not cands:
            return None
        if request.prefix_hashes:
            keys = chained_keys(request.prefix_hashes)
            per_block = max(1.0, request.prompt_tokens / len(keys))
        else:
            self._unique += 1
            keys = [hash((-1, self._unique))]
            per_block = float(max(1, request.prompt_tokens))
        loads = {e.replica_id: snapshot.load(e.replica_id) for e in cands}
        max_load, min_load = max(loads.values()), min(loads.values())
        if max_load - min_load > self.balance_abs_threshold and max_load > min_load * self.balance_rel_threshold:
            chosen = min(cands, key=lambda e: (loads[e.replica_id], e.replica_id))
            reason, score = "imbalanced_shortest_queue", float(loads[chosen.replica_id])
        else:
            matched = {e.replica_id: leading_matches(keys, self._tree(e.replica_id).blocks) for e in cands}
            best = max(cands, key=lambda e: (matched[e.replica_id], -loads[e.replica_id]))
            rate = matched[best.replica_id] / len(keys)
            if rate > self.cache_threshold:
                chosen, reason, score = best, "cache_hit", rate
            else:
                chosen = min(cands, key=lambda e: (self._tree(e.replica_id).size_tokens, e.replica_id))
                reason, score = "smallest_tree", rate
        self._tree(chosen.replica_id).insert(keys, per_block)
        return make_pick(chosen, reason, score, len(cands))
