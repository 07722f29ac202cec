"""`least_kv`: the candidate with the lowest KV-cache use in the last routing table.

Ties (e.g. every replica idle) go to the fewest in flight from this router, then at random.
Between two tables every request sees the same KV figures, so a burst herds onto one replica:
that is the known weakness of routing on a periodic KV metric, and the reason to measure it.
"""

from __future__ import annotations

import random

from tidegate.policy.pick import Pick
from tidegate.policy.registry import PoolSnapshot, RequestFeatures, make_pick


class LeastKv:
    name = "least_kv"

    def pick(self, snapshot: PoolSnapshot, request: RequestFeatures, rng: random.Random) -> Pick | None:
        cands = snapshot.candidates()
        if not cands:
            return None
        key = {e.replica_id: (round(e.kv_usage, 6), snapshot.load(e.replica_id)) for e in cands}
        low = min(key.values())
        best = [e for e in cands if key[e.replica_id] == low]
        chosen = best[rng.randrange(len(best))] if len(best) > 1 else best[0]
        return make_pick(chosen, "least_kv", 1.0 - low[0], len(cands))
