"""`llmd`: the llm-d endpoint picker (EPP) with its default scheduling profile.

    score(e) = 2 * queue(e) + 2 * kv(e) + 3 * prefix(e);  pick the maximum, ties at random

- queue-scorer: min-max normalised waiting queue, (max_q - q_e) / (max_q - min_q); 1 when all equal.
- kv-cache-utilization-scorer: 1 - KV usage.
- prefix-cache-scorer: matched leading blocks / request blocks, from the router's own LRU index of
  the blocks it sent to each endpoint (capacity = the endpoint's KV cache, the "autoTune" default),
  over at most the first 256 x 16 = 4096 prompt tokens (maxPrefixBlocksToMatch 256); the index is
  updated after the pick (PreRequest).
- saturation detector (queueDepthThreshold 5, kvCacheUtilThreshold 0.8): when every candidate is
  saturated, sheddable requests (priority < 0) are rejected (None); others are still scheduled.

The real EPP scrapes every engine's queue and KV itself every 50 ms; `scrape_interval_s` asks the
simulator (fleetsim) for that view, so `llmd` runs as deployed. `llmd_table` is the same picker
reading the routing table's figures instead (the agents' reports, rewritten only when weights or
states change): the stale-metrics variant, kept to show what the scrape is worth. The live router
has no scrape; there both read the table.
"""

from __future__ import annotations

import math
import random

from tidegate.policy.baselines.prefix_blocks import LruBlocks, chained_keys, leading_matches
from tidegate.policy.pick import Pick
from tidegate.policy.registry import PoolSnapshot, RequestFeatures, make_pick

QUEUE_WEIGHT = 2.0
KV_WEIGHT = 2.0
PREFIX_WEIGHT = 3.0
QUEUE_DEPTH_THRESHOLD = 5
KV_UTIL_THRESHOLD = 0.8
MAX_PREFIX_TOKENS = 256 * 16
DEFAULT_LRU_TOKENS = 31250 * 16  # DefaultLRUCapacityPerServer blocks of 16 tokens


SCRAPE_INTERVAL_S = 0.05  # the EPP's default metrics refresh


class LlmdEndpointPicker:
    name = "llmd"
    scrape_interval_s: float | None = SCRAPE_INTERVAL_S  # read by fleetsim: the router polls the engines
    uses_prefix_hashes = True  # the router computes RequestFeatures.prefix_hashes only for such policies

    def __init__(self) -> None:
        self._index: dict[str, LruBlocks] = {}

    def _blocks(self, request: RequestFeatures) -> tuple[list[int], float]:
        hashes = request.prefix_hashes
        if not hashes:
            return [], 0.0
        per_block = max(1.0, request.prompt_tokens / len(hashes))
        limit = max(1, math.ceil(MAX_PREFIX_TOKENS / per_block))
        return chained_keys(hashes[:limit]), per_block

    def pick(self, snapshot: PoolSnapshot, request: RequestFeatures, rng: random.Random) -> Pick | None:
        cands = snapshot.candidates()
        if not cands:
            return None
        if request.priority < 0 and all(
            e.waiting >= QUEUE_DEPTH_THRESHOLD or e.kv_usage >= KV_UTIL_THRESHOLD for e in cands
        ):
            return None
        keys, _ = self._blocks(request)
        qs = [e.waiting for e in cands]
        qmin, qmax = min(qs), max(qs)
        scores = []
        for e in cands:
            queue = 1.0 if qmax == qmin else (qmax - e.waiting) / (qmax - qmin)
            kv = 1.0 - e.kv_usage
            idx = self._index.get(e.replica_id)
            prefix = leading_matches(keys, idx.blocks) / len(keys) if keys and idx is not None else 0.0
            scores.append(QUEUE_WEIGHT * queue + KV_WEIGHT * kv + PREFIX_WEIGHT * prefix)
        top = max(scores)
        best = [i for i, s in enumerate(scores) if s >= top - 1e-12]
        i = best[rng.randrange(len(best))] if len(best) > 1 else best[0]
        chosen = cands[i]
        # PreRequest: the index learns the pick at once (the real EPP does it asynchronously).
        if keys:
            idx = self._index.get(chosen.replica_id)
            if idx is None:
                cap = chosen.kv_capacity_tokens or DEFAULT_LRU_TOKENS
                idx = self._index[chosen.replica_id] = LruBlocks(cap)
            idx.insert(keys, self._blocks(request)[1])
        return make_pick(chosen, "max_score", scores[i], len(cands))


class LlmdTablePicker(LlmdEndpointPicker):
    """`llmd_table`: the same scores over the routing table's queue and KV (no scrape of its own)."""

    name = "llmd_table"
    scrape_interval_s = None
