"""Per-pool summaries for ListPools (`tidegate get pools`).

- available: replicas READY or DEGRADED.
- demand_rps: sum over the pool's fresh reports of e2e.count / window_s, i.e. requests that
  finished per second within the agent's histogram window (0 when no replica reports it).
- slo_attainment: an approximation from windowed percentiles, since reports carry p50/p95/p99
  and not raw latencies. Per replica and per target (TTFT, ITL: the pool's SLO when set, else
  the control plane's --slo-ttft-ms/--slo-itl-ms): 1.0 when p99 is
  within the target, 0.95 when p95 is, 0.5 when p50 is, 0 when even p50 misses (a lower
  bound, except the 1.0 step); the replica takes the lower of its TTFT and ITL figures, and
  the pool averages replicas weighted by their observation count. -1 when no target is
  configured or nothing was observed.
- slo: the pool's SLO record, when an SRE set one (pools with an SLO and no replica are listed).
- scale, recommended_replicas: the leader's latest scale recommendation (tidegate/policy/scale.py);
  0 = none (unknown rates or no SLO; scale.reason says why).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tidegate.controlplane.fleet import FleetState
from tidegate.policy.weights import ROUTABLE_STATES, decide
from tidegate.v1 import admin_pb2, records_pb2, telemetry_pb2

RS = records_pb2.ReplicaState


def attainment(summary: telemetry_pb2.LatencySummary, target_ms: float) -> float:
    """Share of requests within target estimated from percentiles; -1 when unknown."""
    if target_ms <= 0 or summary.count <= 0:
        return -1.0
    if summary.p99_ms <= target_ms:
        return 1.0
    if summary.p95_ms <= target_ms:
        return 0.95
    if summary.p50_ms <= target_ms:
        return 0.5
    return 0.0


def pool_summaries(
    fleet: FleetState,
    budgets: Mapping[str, records_pb2.DisruptionBudget],
    generation: Callable[[str], int],
    *,
    slo_ttft_ms: float = 0.0,
    slo_itl_ms: float = 0.0,
    slos: Mapping[str, records_pb2.PoolSlo] | None = None,
    scale: Mapping[str, records_pb2.ScaleRecommendation] | None = None,
) -> list[admin_pb2.PoolSummary]:
    slos = slos or {}
    scale = scale or {}
    pools: dict[str, admin_pb2.PoolSummary] = {}
    slo: dict[str, list[tuple[float, float]]] = {}

    def summary(name: str) -> admin_pb2.PoolSummary:
        p = pools.get(name)
        if p is None:
            p = pools[name] = admin_pb2.PoolSummary(pool=name, generation=generation(name))
            if (b := budgets.get(f"pool:{name}")) is not None:
                p.budgets.append(b)
            if (target := slos.get(name)) is not None:
                p.slo.CopyFrom(target)
            if (rec := scale.get(name)) is not None:
                p.scale.CopyFrom(rec)
                p.recommended_replicas = rec.recommended_replicas
        return p

    for name in slos:
        summary(name)
    for view in fleet.views():
        p = summary(view.pool)
        d = decide(view, fleet.policy)
        name = RS.Name(d.state).removeprefix("REPLICA_STATE_").lower()
        p.replicas_by_state[name] = p.replicas_by_state[name] + 1
        p.total_weight += d.weight
        if d.state in ROUTABLE_STATES:
            p.available += 1
        rec = fleet.get(view.replica_id)
        if rec is None or rec.report is None or d.state == RS.REPLICA_STATE_STALE:
            continue
        eng = rec.report.engine
        if eng.window_s > 0:
            p.demand_rps += eng.e2e.count / eng.window_s
        ttft_ms, itl_ms = ((p.slo.ttft_s * 1000.0, p.slo.tpot_s * 1000.0) if p.HasField("slo")
                           else (slo_ttft_ms, slo_itl_ms))
        figures = [a for a in (attainment(eng.ttft, ttft_ms), attainment(eng.itl, itl_ms)) if a >= 0]
        if figures:
            slo.setdefault(view.pool, []).append((min(figures), max(eng.ttft.count, eng.itl.count, 1.0)))
    for name, p in pools.items():
        weights = slo.get(name)
        p.slo_attainment = (sum(a * w for a, w in weights) / sum(w for _, w in weights)) if weights else -1.0
    return [pools[k] for k in sorted(pools)]
