"""`round_robin`: candidates in replica-id order, one after the other (a router-local cursor)."""

from __future__ import annotations

import random

from tidegate.policy.pick import Pick
from tidegate.policy.registry import PoolSnapshot, RequestFeatures, make_pick


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        # Starts at a random phase (from the pick's rng): routers started apart do not share one,
        # and N routers fed round-robin that all started at 0 would send every N consecutive
        # requests to the same replica (Mooncake, 4 routers: no load met the SLO target).
        self._cursor: int | None = None

    def pick(self, snapshot: PoolSnapshot, request: RequestFeatures, rng: random.Random) -> Pick | None:
        cands = snapshot.candidates()
        if not cands:
            return None
        if self._cursor is None:
            self._cursor = rng.randrange(len(cands))
        chosen = cands[self._cursor % len(cands)]
        self._cursor += 1
        return make_pick(chosen, "round_robin", chosen.weight, len(cands))
