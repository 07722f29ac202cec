"""`round_robin`: candidates in replica-id order, one after the other (a router-local cursor)."""

from __future__ import annotations

import random

from tidegate.policy.pick import Pick
from tidegate.policy.registry import PoolSnapshot, RequestFeatures, make_pick


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._cursor = 0

    def pick(self, snapshot: PoolSnapshot, request: RequestFeatures, rng: random.Random) -> Pick | None:
        cands = snapshot.candidates()
        if not cands:
            return None
        chosen = cands[self._cursor % len(cands)]
        self._cursor += 1
        return make_pick(chosen, "round_robin", chosen.weight, len(cands))
