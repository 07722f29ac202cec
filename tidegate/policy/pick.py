"""Pick one replica of a pool for one request: the router's per-request policy.

Pure: a function of the pool's routing-table snapshot, the router's own in-flight
counts, the request's features and an injected RNG. No I/O, no clock, no logging.

Formula (in-flight-discounted weighted random choice)
-----------------------------------------------------
Candidates ``C`` are the entries with a finite weight ``w_i > 0`` whose replica id is
not in ``exclude`` (replicas already tried for this request). With this router's
in-flight count ``f_i`` (clamped at >= 0) on each candidate, ``W = sum(w_i)`` and
``F = sum(f_i)`` over the candidates:

    expected_i  = max(1, (F + 1) * w_i / W)      # i's fair share of our in-flight work,
                                                 # counting the request being placed
    effective_i = w_i / (1 + f_i / expected_i)
    P(i)        = effective_i / sum(effective_j)

Why: the control plane publishes weights every tick, from measured KV and queue
state; between two tables the only fresher signal a router has is what it has sent
itself. A replica holding more than its weighted share of our in-flight requests is
discounted (at exactly its share by at most half), one holding none keeps its full
weight, so bursts spread out instead of following a stale weight.

Edge cases:
- no candidate (empty table, every weight <= 0 or not finite, all excluded) -> None;
- a single candidate -> it, whatever its in-flight count (reason ``only_candidate``);
- all equal weights and in-flight counts -> uniform choice;
- in-flight counts of replicas not in the table are ignored.

Candidates are visited in replica-id order, so a seeded RNG gives reproducible
picks regardless of the table's entry order. The request's features are accepted so
that scorers that need them (prompt size vs. free KV) plug in without changing the
signature; this policy does not use them yet.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


class RouteView(Protocol):
    """The fields of a routing-table entry the picker reads (RouteEntry or Candidate)."""

    @property
    def replica_id(self) -> str: ...

    @property
    def endpoint(self) -> str: ...

    @property
    def weight(self) -> float: ...


@dataclass(frozen=True, slots=True)
class Candidate:
    """A frozen view of one `tidegate.v1.RouteEntry`."""

    replica_id: str
    endpoint: str
    weight: float
    state: int = 0
    region: str = ""
    kv_free_tokens: int = 0
    running: int = 0
    waiting: int = 0


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    model: str
    prompt_tokens: int = 0          # estimated at the router
    max_tokens: int | None = None
    stream: bool = False
    prefix_hashes: tuple[int, ...] = ()   # router's estimate of the prompt's prefix blocks


@dataclass(frozen=True, slots=True)
class Pick:
    replica_id: str
    endpoint: str
    reason: str                     # "only_candidate" or "weighted"
    effective_weight: float
    candidates: int                 # how many replicas were eligible


def routable(weight: float) -> bool:
    return math.isfinite(weight) and weight > 0


def pick(
    entries: Sequence[RouteView],
    inflight: Mapping[str, int],
    request: RequestFeatures,
    rng: random.Random,
    exclude: frozenset[str] = frozenset(),
) -> Pick | None:
    """Choose one entry (see the module docstring for the formula), or None."""
    del request  # not used by this policy (see module docstring)
    cands = sorted(
        (e for e in entries if routable(e.weight) and e.replica_id not in exclude),
        key=lambda e: e.replica_id,
    )
    if not cands:
        return None
    if len(cands) == 1:
        only = cands[0]
        return Pick(only.replica_id, only.endpoint, "only_candidate", only.weight, 1)
    # Only ratios matter; scaling by the largest weight keeps sums of huge weights finite.
    top = max(e.weight for e in cands)
    weights = [e.weight / top for e in cands]
    total_w = math.fsum(weights)
    loads = [max(0, int(inflight.get(e.replica_id, 0))) for e in cands]
    total_f = sum(loads)
    effective = []
    for w, f in zip(weights, loads, strict=True):
        expected = max(1.0, (total_f + 1) * w / total_w)
        effective.append(w / (1.0 + f / expected))
    total_e = math.fsum(effective)
    r = rng.random() * total_e
    acc = 0.0
    chosen = len(cands) - 1  # float rounding can leave r just past the last bound
    for i, eff in enumerate(effective):
        acc += eff
        if r < acc:
            chosen = i
            break
    c = cands[chosen]
    return Pick(c.replica_id, c.endpoint, "weighted", effective[chosen], len(cands))
