"""`clairvoyant`: a reference that reads what no router can know. Not a product policy, and NOT an
upper bound: it knows true output lengths and exact engine state but not the prefix cache, so on
prefix-heavy traces cache-aware policies beat it.

It knows each request's true output length (`RequestFeatures.true_output_tokens`) and, through
`PoolSnapshot.live`, each engine's exact running/waiting/free KV at the instant of the pick; its
hooks tell it which of its requests have started (first token) and finished. Per candidate:

    queued_prefill = prompt tokens of its requests still waiting for their first token
    kv_committed   = sum over its in-flight requests of (prompt + true output): the KV they hold
                     when they finish
    overflow       = max(0, kv_committed + prompt + output - kv_capacity)     (would preempt)
    cost           = queued_prefill + prompt                                 (prefill ahead of us)
                   + 16 * running                                           (decode batch slows steps)
                   + 4 * overflow
    pick the minimum cost; ties by fewer in flight, then replica id.

The weights (16 tokens of prefill per running sequence, 4 per overflowing KV token) are rough
step-time equivalents of the llama3-8b cost model; the point is a reference that avoids
queueing and preemption with information no real router has, not an optimum: it ignores cached
prefixes, so it neither seeks cache hits nor counts them as saved prefill.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tidegate.policy.pick import Pick
from tidegate.policy.registry import PoolSnapshot, RequestFeatures, make_pick

RUNNING_WEIGHT = 16.0
OVERFLOW_WEIGHT = 4.0


@dataclass
class _Outstanding:
    prompt: int = 0        # queued prefill tokens (not started)
    committed: int = 0     # prompt + true output of in-flight requests


class Clairvoyant:
    name = "clairvoyant"
    reads_live_state = True  # the simulator fills PoolSnapshot.live only for such policies

    def __init__(self) -> None:
        self._load: dict[str, _Outstanding] = {}
        self._started: set[tuple[str, str]] = set()

    @staticmethod
    def _size(request: RequestFeatures) -> int:
        out = request.true_output_tokens if request.true_output_tokens is not None else (request.max_tokens or 0)
        return request.prompt_tokens + max(0, out)

    def pick(self, snapshot: PoolSnapshot, request: RequestFeatures, rng: random.Random) -> Pick | None:
        cands = snapshot.candidates()
        if not cands:
            return None
        live = snapshot.live or {}
        need = self._size(request)
        best, best_key = cands[0], None
        for e in cands:
            o = self._load.get(e.replica_id, _Outstanding())
            lv = live.get(e.replica_id)
            running = lv.running if lv is not None else e.running
            cap = lv.kv_capacity_tokens if lv is not None else e.kv_capacity_tokens
            overflow = max(0, o.committed + need - cap) if cap > 0 else 0
            cost = o.prompt + request.prompt_tokens + RUNNING_WEIGHT * running + OVERFLOW_WEIGHT * overflow
            key = (cost, snapshot.load(e.replica_id), e.replica_id)
            if best_key is None or key < best_key:
                best, best_key = e, key
        assert best_key is not None
        return make_pick(best, "min_predicted_cost", best_key[0], len(cands))

    def on_dispatch(self, request: RequestFeatures, replica_id: str) -> None:
        o = self._load.setdefault(replica_id, _Outstanding())
        o.prompt += request.prompt_tokens
        o.committed += self._size(request)

    def on_first_token(self, request: RequestFeatures, replica_id: str) -> None:
        key = (request.req_id, replica_id)
        if key in self._started:
            return
        self._started.add(key)
        o = self._load.setdefault(replica_id, _Outstanding())
        o.prompt = max(0, o.prompt - request.prompt_tokens)

    def on_complete(self, request: RequestFeatures, replica_id: str) -> None:
        o = self._load.setdefault(replica_id, _Outstanding())
        key = (request.req_id, replica_id)
        if key in self._started:
            self._started.discard(key)
        else:
            o.prompt = max(0, o.prompt - request.prompt_tokens)
        o.committed = max(0, o.committed - self._size(request))
