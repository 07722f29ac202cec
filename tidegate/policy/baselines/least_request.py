"""`least_request`: the candidate with the fewest requests in flight from this router; ties at random."""

from __future__ import annotations

import random

from tidegate.policy.pick import Pick
from tidegate.policy.registry import PoolSnapshot, RequestFeatures, make_pick


class LeastRequest:
    name = "least_request"

    def pick(self, snapshot: PoolSnapshot, request: RequestFeatures, rng: random.Random) -> Pick | None:
        cands = snapshot.candidates()
        if not cands:
            return None
        low = min(snapshot.load(e.replica_id) for e in cands)
        best = [e for e in cands if snapshot.load(e.replica_id) == low]
        chosen = best[rng.randrange(len(best))] if len(best) > 1 else best[0]
        return make_pick(chosen, "least_request", float(low), len(cands))
