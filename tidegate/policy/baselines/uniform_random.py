"""`random`: a uniformly random candidate."""

from __future__ import annotations

import random

from tidegate.policy.pick import Pick
from tidegate.policy.registry import PoolSnapshot, RequestFeatures, make_pick


class UniformRandom:
    name = "random"

    def pick(self, snapshot: PoolSnapshot, request: RequestFeatures, rng: random.Random) -> Pick | None:
        cands = snapshot.candidates()
        if not cands:
            return None
        chosen = cands[rng.randrange(len(cands))]
        return make_pick(chosen, "random", chosen.weight, len(cands))
