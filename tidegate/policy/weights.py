"""Routing weight and lifecycle state of each replica: a pure function of a snapshot.

No I/O, no clock reads, no logging. The control plane, tests and the offline
simulator call the same code. The formula and its edge cases are documented in
README.md next to this module.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from tidegate.v1 import records_pb2

RS = records_pb2.ReplicaState

# States in which a replica takes new requests (weight > 0). Every other state has weight 0.
ROUTABLE_STATES = frozenset({RS.REPLICA_STATE_READY, RS.REPLICA_STATE_DEGRADED})
# Plain ints: reading an attribute of a protobuf enum wrapper is a slow Python-level
# __getattr__, and decide() runs for every replica several times per control-plane tick.
_STALE, _DRAINING, _DRAINED, _CORDONED = (RS.REPLICA_STATE_STALE, RS.REPLICA_STATE_DRAINING,
                                          RS.REPLICA_STATE_DRAINED, RS.REPLICA_STATE_CORDONED)
_JOINING, _EJECTED, _DEGRADED, _READY = (RS.REPLICA_STATE_JOINING, RS.REPLICA_STATE_EJECTED,
                                         RS.REPLICA_STATE_DEGRADED, RS.REPLICA_STATE_READY)


@dataclass(frozen=True)
class WeightPolicyConfig:
    stale_after_s: float = 3.0         # no report for longer: STALE, weight 0
    remove_after_s: float = 30.0       # no report for longer: forgotten (FleetState prunes it)
    max_weight: float = 100.0          # weights are on a 0..max_weight scale
    kv_floor: float = 0.05             # KV headroom never counts for less than this while routable
    weight_quantum: float = 1.0        # weights are rounded to this step, so noise does not rewrite tables
    degraded_kv_usage: float = 0.95    # KV used fraction at/above which a replica is DEGRADED
    degraded_waiting: int = 64         # waiting requests at/above which a replica is DEGRADED
    degraded_factor: float = 0.25      # weight multiplier of a DEGRADED replica
    ttft_p95_target_ms: float = 0.0    # 0 = no target; p95 above target: DEGRADED
    itl_p95_target_ms: float = 0.0     # 0 = no target; p95 above target: DEGRADED
    preemptions_per_s_max: float = 0.0  # 0 = ignore preemptions; above: DEGRADED

    def __post_init__(self) -> None:
        if not (self.stale_after_s > 0 and self.remove_after_s >= self.stale_after_s):
            raise ValueError("need 0 < stale_after_s <= remove_after_s")
        if not (self.max_weight > 0 and self.weight_quantum > 0 and self.weight_quantum <= self.max_weight):
            raise ValueError("need 0 < weight_quantum <= max_weight")
        if not (0 <= self.kv_floor <= 1 and 0 < self.degraded_factor <= 1):
            raise ValueError("need 0 <= kv_floor <= 1 and 0 < degraded_factor <= 1")


@dataclass(frozen=True)
class ReplicaView:
    """What the policy knows about one replica at one instant (already sanitised)."""

    replica_id: str
    pool: str
    endpoint: str = ""
    region: str = ""
    zone: str = ""
    has_report: bool = False           # False: hello only (JOINING)
    report_age_s: float = 0.0          # since the last report, or since hello when none
    healthy: bool = False
    engine_error: str = ""
    running: int = 0
    waiting: int = 0
    kv_capacity_tokens: int = 0        # 0 = unknown
    kv_free_tokens: int = 0
    kv_usage: float = 0.0              # 0..1, used when capacity is unknown
    ttft_p95_ms: float = 0.0
    itl_p95_ms: float = 0.0
    preemptions_per_s: float = 0.0
    gpu_telemetry_available: bool = False
    gpu_faults: tuple[str, ...] = ()   # e.g. "gpu 0 lost", "gpu 1: 2 uncorrectable ECC errors"
    telemetry_flags: tuple[str, ...] = ()  # what sanitising clamped, for humans
    cordoned: bool = False             # SRE intent
    draining: bool = False             # SRE intent
    router_inflight: int = 0           # requests routers hold for this replica (RouterPresence)
    drain_hold: bool = False           # drain younger than its grace period: not DRAINED yet
    drain_expired: bool = False        # drain deadline passed
    drain_force: bool = False          # at the deadline, mark DRAINED anyway
    ejected: str = ""                  # non-empty: ejected by the fault policy (the reason)
    cut: str = ""                      # non-empty: weight cut by the fault policy (the reason)
    # Fitted engine rates (tidegate.policy.rates, already quantized); 0 = unknown.
    prefill_tokens_per_s: float = 0.0
    decode_step_base_ms: float = 0.0
    decode_step_per_seq_ms: float = 0.0
    max_num_seqs: int = 0              # the engine's limit on running sequences, as reported; 0 = unknown
    # SLO feedback (tidegate.policy.feedback): multiplier in (0, 1] on the weight, and why.
    slo_factor: float = 1.0
    slo_note: str = ""


@dataclass(frozen=True)
class ReplicaDecision:
    state: records_pb2.ReplicaState    # an int at run time
    weight: float
    reason: str


def kv_free_fraction(view: ReplicaView) -> float:
    """KV headroom in [0, 1]: free/capacity when capacity is known, else 1 - usage."""
    if view.kv_capacity_tokens > 0:
        frac = view.kv_free_tokens / view.kv_capacity_tokens
    else:
        frac = 1.0 - view.kv_usage
    return _clamp01(frac)


def queue_factor(view: ReplicaView) -> float:
    """1 with an empty queue, 1/2 when as many wait as run, towards 0 as the queue grows."""
    return 1.0 / (1.0 + max(0, view.waiting) / max(1, view.running))


def decide(view: ReplicaView, cfg: WeightPolicyConfig) -> ReplicaDecision:
    """State and weight of one replica. Precedence, first match wins:
    STALE > DRAINING/DRAINED > CORDONED > JOINING > EJECTED (fault policy, GPU fault, unhealthy)
    > DEGRADED (fault-policy cut, pressure) > READY."""
    zero = 0.0
    if view.report_age_s > cfg.stale_after_s:
        what = "report" if view.has_report else "hello without a report"
        return ReplicaDecision(
            _STALE, zero,
            f"no report for {view.report_age_s:.1f}s (last: {what}; stale after {cfg.stale_after_s:g}s)",
        )
    if view.draining:
        return _drain_decision(view)
    if view.cordoned:
        return ReplicaDecision(_CORDONED, zero, "cordoned by SRE")
    if not view.has_report:
        return ReplicaDecision(_JOINING, zero, "hello received, waiting for the first report")
    if view.ejected:
        return ReplicaDecision(_EJECTED, zero, view.ejected)
    if view.gpu_faults:
        return ReplicaDecision(_EJECTED, zero, "gpu fault: " + "; ".join(view.gpu_faults))
    if not view.healthy:
        return ReplicaDecision(
            _EJECTED, zero, "engine unhealthy: " + (view.engine_error or "health check failed")
        )

    free = kv_free_fraction(view)
    qf = queue_factor(view)
    raw = max(cfg.kv_floor, free) * qf
    pressure = ([view.cut] if view.cut else []) + _pressure(view, free, cfg)
    state = _DEGRADED if pressure else _READY
    if pressure:
        raw *= cfg.degraded_factor
    if math.isfinite(view.slo_factor) and 0 < view.slo_factor < 1:
        raw *= view.slo_factor
    weight = quantize(raw * cfg.max_weight, cfg)
    reasons = pressure or [f"kv free {free:.0%}, queue factor {qf:.2f}"]
    if view.slo_note:
        reasons = [*reasons, view.slo_note]
    if view.telemetry_flags:
        reasons = [*reasons, "telemetry clamped: " + ", ".join(view.telemetry_flags)]
    return ReplicaDecision(state, weight, "; ".join(reasons))


def _drain_decision(view: ReplicaView) -> ReplicaDecision:
    zero = 0.0
    if not view.has_report:
        left = "no report yet"
    else:
        busy = []
        if view.running:
            busy.append(f"{view.running} running")
        if view.waiting:
            busy.append(f"{view.waiting} waiting")
        if view.router_inflight:
            busy.append(f"{view.router_inflight} in flight at routers")
        left = ", ".join(busy)
        if not busy and not view.drain_hold:
            return ReplicaDecision(_DRAINED, zero, "drained: no running, waiting or in-flight requests")
        if not busy:
            left = "idle, waiting out the grace period"
    if view.drain_expired:
        if view.drain_force:
            return ReplicaDecision(_DRAINED, zero, f"drain forced at the deadline ({left})")
        return ReplicaDecision(_DRAINING, zero, f"drain timed out: {left}")
    return ReplicaDecision(_DRAINING, zero, f"draining: {left}")


def quantize(weight: float, cfg: WeightPolicyConfig) -> float:
    """Round to the quantum; a routable replica never rounds down to 0 (0 means 'do not route')."""
    if not math.isfinite(weight) or weight <= 0:
        return cfg.weight_quantum
    q = round(weight / cfg.weight_quantum) * cfg.weight_quantum
    q = min(cfg.max_weight, max(cfg.weight_quantum, q))
    # Strip float noise (0.30000000000000004) so equal tables compare and print equal.
    return round(q, 6)


def route_entry(view: ReplicaView, decision: ReplicaDecision) -> records_pb2.RouteEntry:
    return records_pb2.RouteEntry(
        replica_id=view.replica_id,
        endpoint=view.endpoint,
        region=view.region,
        zone=view.zone,
        state=decision.state,
        weight=decision.weight,
        kv_capacity_tokens=view.kv_capacity_tokens,
        kv_free_tokens=view.kv_free_tokens,
        running=view.running,
        waiting=view.waiting,
        ttft_p95_ms=view.ttft_p95_ms,
        itl_p95_ms=view.itl_p95_ms,
        reason=decision.reason,
        prefill_tokens_per_s=view.prefill_tokens_per_s,
        decode_step_base_ms=view.decode_step_base_ms,
        decode_step_per_seq_ms=view.decode_step_per_seq_ms,
        max_num_seqs=view.max_num_seqs,
    )


def compute_pool_tables(
    views: Iterable[ReplicaView], cfg: WeightPolicyConfig
) -> dict[str, list[records_pb2.RouteEntry]]:
    """One list of entries per pool, sorted by replica id. Every known replica is listed,
    non-routable ones with weight 0, so routers and SREs see why a replica gets no traffic.
    Pools without any view are absent (the publisher decides what to do with them)."""
    out: dict[str, list[records_pb2.RouteEntry]] = {}
    for view in sorted(views, key=lambda v: (v.pool, v.replica_id)):
        out.setdefault(view.pool, []).append(route_entry(view, decide(view, cfg)))
    return out


def routing_key(entries: Iterable[records_pb2.RouteEntry]) -> tuple[tuple, ...]:
    """The part of a table that changes routing: identity, location, state, weight, the fitted
    rates (quantized on a 4 % grid with hysteresis, so they move only when the engine does) and
    the engine's seats (max_num_seqs: set at its start).
    Informational fields (KV tokens, queue, latencies, reason) are a snapshot taken when this key
    last changed; they alone never trigger a rewrite."""
    return tuple((e.replica_id, e.endpoint, e.region, e.zone, e.state, e.weight, e.prefill_tokens_per_s,
                  e.decode_step_base_ms, e.decode_step_per_seq_ms, e.max_num_seqs) for e in entries)


def _pressure(view: ReplicaView, free: float, cfg: WeightPolicyConfig) -> list[str]:
    out = []
    used = 1.0 - free
    if used >= cfg.degraded_kv_usage:
        out.append(f"kv {used:.0%} used (>= {cfg.degraded_kv_usage:.0%})")
    if view.waiting >= cfg.degraded_waiting:
        out.append(f"{view.waiting} waiting (>= {cfg.degraded_waiting})")
    if cfg.ttft_p95_target_ms > 0 and view.ttft_p95_ms > cfg.ttft_p95_target_ms:
        out.append(f"ttft p95 {view.ttft_p95_ms:.0f}ms > {cfg.ttft_p95_target_ms:g}ms")
    if cfg.itl_p95_target_ms > 0 and view.itl_p95_ms > cfg.itl_p95_target_ms:
        out.append(f"itl p95 {view.itl_p95_ms:.0f}ms > {cfg.itl_p95_target_ms:g}ms")
    if cfg.preemptions_per_s_max > 0 and view.preemptions_per_s > cfg.preemptions_per_s_max:
        out.append(f"{view.preemptions_per_s:.1f} preemptions/s > {cfg.preemptions_per_s_max:g}")
    return out


def _clamp01(x: float) -> float:
    if not math.isfinite(x):
        return 0.0
    return min(1.0, max(0.0, x))
