"""`tidegate`: the router's own pick (tidegate.policy.pick) over the control plane's weights.

A thin adapter: the weights come from the control plane (tidegate.policy.weights) through the
routing table; the per-request choice is `tidegate.policy.pick.pick`, called as the router calls it.
"""

from __future__ import annotations

import random

from tidegate.policy import pick as tidegate_pick
from tidegate.policy.registry import PoolSnapshot, RequestFeatures


class TidegatePick:
    name = "tidegate"

    def pick(self, snapshot: PoolSnapshot, request: RequestFeatures, rng: random.Random) -> tidegate_pick.Pick | None:
        features = tidegate_pick.RequestFeatures(model="", prompt_tokens=request.prompt_tokens,
                                                 max_tokens=request.max_tokens)
        return tidegate_pick.pick(snapshot.entries, snapshot.inflight, features, rng, snapshot.exclude)
