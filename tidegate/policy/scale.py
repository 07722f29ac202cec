"""Scale recommendation: how many replicas a pool needs to meet its SLO at the current demand.

A pure function of the pool's replicas (fitted engine rates and measured load) and its SLO;
the control plane publishes the result for an external autoscaler (etcd
`/tidegate/v1/scale/<pool>`, gauge `tidegate_pool_recommended_replicas`, `tidegate get pools`).

Inputs, per replica: fitted rates R (uncached prompt tokens prefilled per second) and the decode
step model step(b) = base + per_seq * b (ms at batch b), as published in RouteEntry; measured
demand p, g (prompt and generation tokens per second), requests per second, waiting requests,
KV use. Rates are averaged over the serving replicas that have them; demand is summed over
every replica that reports (a draining replica's work is still demand).

    b_max    = (tpot - base) / per_seq          largest decode batch whose step meets the TPOT target
    D        = b_max / tpot                     decode tokens/s of one replica at that batch
    L        = P / rps                          mean prompt length (when rps is known)
    s        = L / R                            prefill time of a mean prompt on an idle replica
    backlog  = waiting * L / (R * ttft)         replica-equivalents to clear today's queue within one TTFT target
    work     = P / R + G / D + backlog          replica-equivalents of work (prefill and decode share a GPU's time)
    headroom = min(HEADROOM, 2 (ttft - s) / (2 ttft - s))
                                                target utilisation: the M/D/1 queue whose mean wait plus
                                                prefill s stays within the TTFT target, never above 0.8
    compute  = work / headroom
    kv       = sum of serving replicas' KV use / KV_TARGET    (KV in use, at most 80 % per replica)
    needed   = max(compute, kv)

Recommendation = max(floor, ceil(needed)), except that a figure within `tolerance` (10 %) of the
replicas serving now keeps that number (Kubernetes HPA's tolerance: no churn on noise). An
external autoscaler should still apply its own stabilisation window before scaling down.

No recommendation (None, with the reason), rather than a guess, when: the pool has no SLO; no
serving replica has fitted rates yet; the fitted step time at batch 1 already exceeds the TPOT
target, or a mean prompt's prefill alone exceeds the TTFT target (more replicas cannot help).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tidegate.policy.registry import SloTargets

HEADROOM = 0.8
KV_TARGET = 0.8


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    replica_id: str
    serving: bool                        # ready or degraded (takes new requests)
    prefill_tokens_per_s: float = 0.0    # fitted; 0 = unknown
    decode_step_base_ms: float = 0.0
    decode_step_per_seq_ms: float = 0.0  # fitted; 0 = unknown
    prompt_tokens_per_s: float = 0.0     # measured
    generation_tokens_per_s: float = 0.0
    requests_per_s: float = 0.0          # finished per second; 0 = unknown
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0                # 0..1

    @property
    def rated(self) -> bool:
        return self.prefill_tokens_per_s > 0 and self.decode_step_per_seq_ms > 0 and self.decode_step_base_ms >= 0


@dataclass(frozen=True, slots=True)
class ScaleConfig:
    headroom: float = HEADROOM
    kv_target: float = KV_TARGET
    min_replicas: int = 1
    max_replicas: int = 0                # 0 = no cap
    tolerance: float = 0.1

    def __post_init__(self) -> None:
        if not (0 < self.headroom <= 1 and 0 < self.kv_target <= 1 and 0 <= self.tolerance < 1):
            raise ValueError("headroom and kv_target must be in (0, 1], tolerance in [0, 1)")
        if self.min_replicas < 1 or self.max_replicas < 0:
            raise ValueError("min_replicas must be >= 1 and max_replicas >= 0")


@dataclass(frozen=True, slots=True)
class Recommendation:
    replicas: int | None        # None: no recommendation (reason says why)
    binding: str                # prefill | decode | backlog | kv | floor | current | none
    reason: str
    current: int                # serving now
    headroom: float
    prompt_tokens_per_s: float
    generation_tokens_per_s: float


def recommend(replicas: Sequence[ReplicaLoad], slo: SloTargets | None,
              cfg: ScaleConfig = ScaleConfig()) -> Recommendation:
    serving = [r for r in replicas if r.serving]
    n = len(serving)
    p = sum(max(0.0, r.prompt_tokens_per_s) for r in replicas)
    g = sum(max(0.0, r.generation_tokens_per_s) for r in replicas)
    rps = sum(max(0.0, r.requests_per_s) for r in replicas)
    waiting = sum(max(0, r.waiting) for r in replicas)

    def none(reason: str) -> Recommendation:
        return Recommendation(None, "none", reason, n, 0.0, p, g)

    if slo is None:
        return none("no SLO target for the pool (tidegate pool set-slo)")
    rated = [r for r in serving if r.rated]
    if not rated:
        return none("engine rates not known yet (no serving replica has fitted prefill/decode rates)")
    prefill = sum(r.prefill_tokens_per_s for r in rated) / len(rated)
    base = sum(r.decode_step_base_ms for r in rated) / len(rated)
    per_seq = sum(r.decode_step_per_seq_ms for r in rated) / len(rated)
    tpot_ms = slo.tpot_s * 1000.0
    b_max = (tpot_ms - base) / per_seq
    if b_max < 1.0:
        return none(f"a decode step at batch 1 takes {base + per_seq:.1f} ms, above the TPOT target "
                    f"{tpot_ms:.0f} ms: more replicas cannot meet it")
    decode = b_max / slo.tpot_s
    mean_prompt = p / rps if rps > 0 else 0.0
    service = mean_prompt / prefill
    if service >= slo.ttft_s:
        return none(f"a mean prompt ({mean_prompt:.0f} tokens) takes {service:.2f} s to prefill, above the TTFT "
                    f"target {slo.ttft_s:g} s: more replicas cannot meet it")
    headroom = min(cfg.headroom, 2 * (slo.ttft_s - service) / (2 * slo.ttft_s - service))
    parts = {
        "prefill": p / prefill / headroom,
        "decode": g / decode / headroom,
        "backlog": waiting * mean_prompt / (prefill * slo.ttft_s) / headroom,
    }
    compute = sum(parts.values())
    kv = sum(min(1.0, max(0.0, r.kv_usage)) for r in serving) / cfg.kv_target
    needed = max(compute, kv)
    binding = "kv" if kv > compute else max(parts, key=lambda k: parts[k])
    figures = (f"prefill {p:.0f} tok/s at {prefill:.0f}/replica, decode {g:.0f} tok/s at {decode:.0f}/replica "
               f"(batch <= {b_max:.0f} for TPOT {tpot_ms:.0f} ms), {waiting} waiting, "
               f"headroom {headroom:.2f}: {compute:.2f} replicas of compute, {kv:.2f} of KV")
    floor = cfg.min_replicas
    if n > 0 and needed >= floor - 1 and abs(needed / n - 1.0) <= cfg.tolerance:
        return Recommendation(n, "current", f"within {cfg.tolerance:.0%} of the {n} serving; " + figures,
                              n, headroom, p, g)
    count = math.ceil(needed - 1e-9)
    if count <= floor:
        count, binding = floor, ("floor" if count < floor or needed <= 0 else binding)
    if cfg.max_replicas and count > cfg.max_replicas:
        return Recommendation(cfg.max_replicas, binding, f"capped at {cfg.max_replicas} (needs {count}); " + figures,
                              n, headroom, p, g)
    return Recommendation(count, binding, figures, n, headroom, p, g)
