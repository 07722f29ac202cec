"""The leader's side of admission budgets: each pool's total and every live router's share,
written to /tidegate/v1/admission/<pool> (formulas: tidegate/policy/admission_budget.py).

Inputs each tick: the computed tables (routable replicas, fitted rates, KV capacity), the SLO
feedback multiplier of each replica (FleetState), the pools' SLO records, and the routers'
presence records (who is alive, what each wants per pool). Every live router takes part in
every pool's split: any of them may be sent a request for any pool.

A record is written when its router set changes, its total moves by more than 1 %, a share
moves by more than 2 % of the total, or it is older than `refresh_s` (so `computed_at` shows
it is live). A router whose presence lease expires drops out of the next tick's split (the
deletion wakes the decision loop), so its share returns to the others within one lease.
Like the tables and the scale recommendation, writes are fenced by the leader's term
(controlplane/fenced.py): a deposed leader's write does not land, and it steps down.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence

import structlog

from tidegate import codec, keys
from tidegate.controlplane.fenced import FencedWriter
from tidegate.controlplane.fleet import FleetState
from tidegate.controlplane.publisher import _timestamp
from tidegate.policy.admission_budget import BudgetConfig, ReplicaCapacity, Tokens, pool_total, split
from tidegate.policy.weights import ROUTABLE_STATES
from tidegate.store.api import Fence, Store
from tidegate.v1 import records_pb2

log = structlog.get_logger(__name__)


def tokens_of(t: records_pb2.TokenBudget) -> Tokens:
    return Tokens(t.prefill_tokens, t.kv_tokens, t.sequences).clean()


def _proto(t: Tokens) -> records_pb2.TokenBudget:
    return records_pb2.TokenBudget(prefill_tokens=t.prefill_tokens, kv_tokens=t.kv_tokens, sequences=t.sequences)


def capacities(entries: Sequence[records_pb2.RouteEntry], fleet: FleetState) -> list[ReplicaCapacity]:
    out = []
    for e in entries:
        rec = fleet.get(e.replica_id)
        out.append(ReplicaCapacity(
            e.replica_id, e.state in ROUTABLE_STATES and e.weight > 0, e.prefill_tokens_per_s,
            e.decode_step_base_ms, e.decode_step_per_seq_ms, float(e.kv_capacity_tokens),
            rec.feedback.multiplier if rec is not None else 1.0,
            seats=float(rec.stats.max_num_seqs) if rec is not None else 0.0,
            completions_per_s=rec.completions_per_s if rec is not None else 0.0))
    return out


class BudgetPublisher:
    def __init__(self, store: Store, controlplane_id: str, config: BudgetConfig | None = None, *,
                 refresh_s: float = 30.0, wall_clock: Callable[[], float] = time.time,
                 on_fenced: Callable[[str], None] = lambda reason: None) -> None:
        self._writer = FencedWriter(store, "admission_budget", on_fenced)
        self._id = controlplane_id
        self.cfg = config or BudgetConfig()
        self._refresh_s = refresh_s
        self._wall = wall_clock
        self._latest: dict[str, records_pb2.AdmissionBudget] = {}
        self._written: dict[str, tuple[records_pb2.AdmissionBudget, float]] = {}

    def latest(self) -> Mapping[str, records_pb2.AdmissionBudget]:
        return dict(self._latest)

    def reset(self) -> None:
        """On becoming leader: write every pool again."""
        self._written.clear()

    def compute(self, tables: Mapping[str, Sequence[records_pb2.RouteEntry]], fleet: FleetState,
                slos: Mapping[str, records_pb2.PoolSlo], routers: Collection[str],
                demand: Mapping[str, Mapping[str, Tokens]]) -> dict[str, records_pb2.AdmissionBudget]:
        """`routers`: live router ids; `demand`: pool -> router id -> what it wants in flight."""
        out = {}
        for pool, entries in tables.items():
            slo = slos.get(pool)
            total, reason = pool_total(capacities(entries, fleet), slo.ttft_s if slo else 0.0,
                                       slo.tpot_s if slo else 0.0)
            msg = records_pb2.AdmissionBudget(pool=pool, leader_id=self._id, reason=reason,
                                              class_fraction=dict(self.cfg.class_fraction))
            msg.computed_at.CopyFrom(_timestamp(self._wall()))
            if total is not None:
                msg.total.CopyFrom(_proto(total))
                wants = demand.get(pool, {})
                for rid, share in split(total, {r: wants.get(r, Tokens()) for r in routers}, self.cfg).items():
                    msg.share_by_router[rid].CopyFrom(_proto(share))
            out[pool] = msg
        self._latest = out
        return out

    async def publish(self, fence: Callable[[], Fence | None]) -> list[str]:
        """Writes, fenced by `fence()` (nothing while it is None), the pools whose budget moved
        (or is due a refresh); returns their names. Never raises StoreError."""
        now = self._wall()
        due = []
        for pool, msg in sorted(self._latest.items()):
            last = self._written.get(pool)
            if last is None or moved(last[0], msg) or now - last[1] >= self._refresh_s:
                due.append((pool, msg))
        landed = await self._writer.write([(keys.admission(pool), codec.encode(msg)) for pool, msg in due], fence)
        for (pool, msg), ok in zip(due, landed, strict=True):
            if ok:
                self._written[pool] = (msg, now)
        return [pool for (pool, _), ok in zip(due, landed, strict=True) if ok]


def moved(old: records_pb2.AdmissionBudget, new: records_pb2.AdmissionBudget) -> bool:
    """Worth a rewrite: the router set or the presence of a total changed, a unit of the total
    moved by more than 1 %, or a share by more than 2 % of the total. Compared with what was
    last written (not on a grid), so a figure hovering near a boundary does not flap."""
    if old.HasField("total") != new.HasField("total") or set(old.share_by_router) != set(new.share_by_router):
        return True
    if not new.HasField("total"):
        return old.reason != new.reason
    t_old, t_new = tokens_of(old.total).values(), tokens_of(new.total).values()
    if any(abs(a - b) > 0.01 * max(a, b) for a, b in zip(t_old, t_new, strict=True)):
        return True
    for rid, share in new.share_by_router.items():
        a, b = tokens_of(old.share_by_router[rid]).values(), tokens_of(share).values()
        if any(abs(x - y) > 0.02 * t for x, y, t in zip(a, b, t_new, strict=True)):
            return True
    return False
