"""May this routing table be published? Continuity across leader changes and etcd outages.

A pure function of the last published table of a pool, the table the current views compute,
which replicas have reported to this leader since its term began, and the term's age. No I/O,
no clock reads.

Why: a leader that has just been elected (or re-elected after etcd came back) has not heard
from agents that are reconnecting; to it they look absent or JOINING. Publishing that view
would take healthy replicas out of routing (the 0-replica table after a 60 s etcd pause).
"Not heard yet in this term" therefore means *unknown*, never *stale*:

1. unknown   = replicas in the previous table that have not reported in this term.
   waiting   = the unknown ones that were routable (weight > 0) in the previous table.
2. Warm-up: while `waiting` is non-empty and the term is younger than `warmup_s`, publish
   nothing (hold): agents reconnect within this window. The warm-up ends early, at the first
   tick at which every previously routable replica has reported.
3. Carry-over: until the term is `warmup_s + stale_after_s` old, each unknown replica keeps its
   previous entry verbatim (endpoint, state, weight); replicas that reported get their computed
   entry. After that window an unknown replica is whatever the views say (STALE: nobody heard
   from it for a full stale timeout after the warm-up), exactly like an agent that died.
4. Replicas that report are never dropped: every reporting replica is in `computed`, and
   carried entries only add to it.

Edge cases: an empty previous table (first start) publishes at once; a previous table of
non-routable replicas only (all cordoned/stale) has nothing to wait for; `warmup_s = 0` turns
the hold off but keeps the carry-over for one stale timeout.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from tidegate.v1 import records_pb2


@dataclass(frozen=True)
class ContinuityConfig:
    warmup_s: float = 5.0          # longest hold of a new term waiting for agents to reconnect
    stale_after_s: float = 3.0     # carry-over lasts warmup_s + stale_after_s

    def __post_init__(self) -> None:
        if self.warmup_s < 0 or self.stale_after_s <= 0:
            raise ValueError("need warmup_s >= 0 and stale_after_s > 0")


@dataclass(frozen=True)
class Verdict:
    publish: bool
    entries: tuple[records_pb2.RouteEntry, ...]   # what to publish (empty when holding)
    carried: tuple[str, ...] = ()                 # replicas whose previous entry was kept
    waiting_for: tuple[str, ...] = ()             # previously routable, not heard in this term
    reason: str = ""


def check(
    previous: Sequence[records_pb2.RouteEntry],
    computed: Sequence[records_pb2.RouteEntry],
    heard: Collection[str],
    term_age_s: float,
    cfg: ContinuityConfig,
) -> Verdict:
    """The verdict for one pool (see the module docstring for the rules)."""
    unknown = {e.replica_id: e for e in previous if e.replica_id not in heard}
    waiting = tuple(sorted(rid for rid, e in unknown.items() if e.weight > 0))
    if waiting and term_age_s < cfg.warmup_s:
        return Verdict(False, (), (), waiting,
                       f"warming up: {len(waiting)} routable replica(s) not heard in this term")
    if not unknown or term_age_s >= cfg.warmup_s + cfg.stale_after_s:
        return Verdict(True, tuple(computed), (), waiting, "")
    merged = {e.replica_id: e for e in computed}
    merged.update(unknown)
    carried = tuple(sorted(unknown))
    return Verdict(True, tuple(merged[rid] for rid in sorted(merged)), carried, waiting,
                   f"carrying {len(carried)} replica(s) not heard in this term")
