"""Outlier ejection, in the spirit of Envoy's outlier detection, for one pool at a time.

Pure: `evaluate(inputs, prev, now, cfg)` returns each replica's next `OutlierState`, whether
the pool is in panic, and the events to record. No I/O, no clock reads, no logging. The
control plane calls it on every tick with the replicas of each pool. Rules:

- **Consecutive errors**: a replica whose upstream error streak (the largest a router reports
  in its presence record: connect failures, resets, 5xx and first-byte timeouts in a row,
  reset by a success) reaches `consecutive_errors` is ejected. The streak seen at an ejection
  is remembered, so a streak that did not grow (no traffic while ejected) cannot eject again;
  a router that saw a success restarts its count from 0.
- **Latency**: a replica whose windowed TTFT p95 exceeds `latency_factor` x the pool median
  (over replicas with >= `latency_min_samples` observations, at least
  `latency_min_replicas` of them) and `latency_floor_ms` is ejected.
- **At most `max_ejection_percent`** of the pool's candidates (replicas routable apart from
  outlier ejection) are outlier-ejected at once, rounded down (a pool of one is never
  ejected); the worst candidates go first (errors, then latency ratio, then id).
- **Backoff**: an ejection lasts `backoff_initial_s * 2^(n-1)` (capped at `backoff_max_s`),
  n = ejections in a row, reset after `backoff_reset_after_s` without one; then the replica
  is re-admitted by time alone, like Envoy: if it is still an outlier, it is ejected again
  for twice as long.
- **Panic**: when fewer than `panic_threshold_percent` of the candidates are healthy (not
  outlier-ejected), the pool is in panic and outlier ejections are not applied (routers see
  every candidate): a pool half broken is better served by all its replicas than by a few.
  Faults (GPU, engine health; `tidegate.policy.faults`) are never lifted by panic.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from tidegate.policy.faults import FaultEvent, exp_backoff


@dataclass(frozen=True)
class OutlierConfig:
    consecutive_errors: int = 5            # 0 = off
    latency_factor: float = 3.0            # 0 = off
    latency_min_samples: float = 20.0
    latency_min_replicas: int = 3
    latency_floor_ms: float = 100.0        # a p95 below this is never an outlier (a 3x of 5 ms is noise)
    max_ejection_percent: float = 50.0
    panic_threshold_percent: float = 50.0  # 0 = never panic
    backoff_initial_s: float = 30.0
    backoff_max_s: float = 300.0
    backoff_reset_after_s: float = 600.0

    def __post_init__(self) -> None:
        if self.consecutive_errors < 0 or self.latency_factor < 0:
            raise ValueError("consecutive_errors and latency_factor must be >= 0")
        if self.latency_factor and self.latency_factor <= 1:
            raise ValueError("latency_factor must be > 1 (or 0 = off)")
        if self.latency_min_replicas < 2 or self.latency_min_samples < 0 or self.latency_floor_ms < 0:
            raise ValueError("need latency_min_replicas >= 2, latency_min_samples >= 0, latency_floor_ms >= 0")
        if not (0 <= self.max_ejection_percent <= 100 and 0 <= self.panic_threshold_percent <= 100):
            raise ValueError("max_ejection_percent and panic_threshold_percent must be in [0, 100]")
        if not (0 < self.backoff_initial_s <= self.backoff_max_s):
            raise ValueError("need 0 < backoff_initial_s <= backoff_max_s")


@dataclass(frozen=True)
class OutlierInput:
    replica_id: str
    candidate: bool = True        # routable apart from outlier ejection (not faulted, cordoned, stale...)
    error_streak: int = 0
    ttft_p95_ms: float = 0.0
    ttft_samples: float = 0.0


@dataclass(frozen=True)
class OutlierState:
    ejected: bool = False
    cause: str = ""
    ejected_at: float = 0.0
    readmit_at: float = 0.0
    ejections: int = 0            # in a row, for the backoff
    last_readmit_at: float | None = None
    error_base: int = 0           # streak seen at the last error ejection


@dataclass(frozen=True)
class PoolOutliers:
    states: dict[str, OutlierState] = field(default_factory=dict)
    panic: bool = False
    events: tuple[tuple[str, FaultEvent], ...] = ()   # (replica id, event)

    def ejected_reason(self, replica_id: str, now: float) -> str:
        """'' unless the replica is outlier-ejected and the pool is not in panic."""
        s = self.states.get(replica_id)
        if s is None or not s.ejected or self.panic:
            return ""
        return f"ejected (outlier): {s.cause} (re-admission in {max(0.0, s.readmit_at - now):.0f}s)"


def evaluate(inputs: Sequence[OutlierInput], prev: Mapping[str, OutlierState], now: float,
             cfg: OutlierConfig) -> PoolOutliers:
    events: list[tuple[str, FaultEvent]] = []
    states: dict[str, OutlierState] = {}
    by_id = {i.replica_id: i for i in inputs}
    for rid, inp in sorted(by_id.items()):
        s = prev.get(rid, OutlierState())
        streak = max(0, inp.error_streak)
        if streak < s.error_base:      # a router saw a success (or went away): count afresh
            s = replace(s, error_base=0)
        if s.ejected and now >= s.readmit_at:
            s = replace(s, ejected=False, last_readmit_at=now)
            events.append((rid, FaultEvent("readmit", f"outlier backoff over after {now - s.ejected_at:.0f}s "
                                           f"(cause: {s.cause})")))
        states[rid] = s

    candidates = [i for i in by_id.values() if i.candidate]
    median = _median_ttft(candidates, cfg)
    found: list[tuple[int, float, str, str]] = []   # (errors first, -ratio, id, cause)
    for inp in candidates:
        s = states[inp.replica_id]
        if s.ejected:
            continue
        errors = max(0, inp.error_streak) - s.error_base
        if cfg.consecutive_errors and errors >= cfg.consecutive_errors:
            found.append((0, -float(errors), inp.replica_id,
                          f"{errors} consecutive upstream errors (>= {cfg.consecutive_errors})"))
            continue
        if median is not None and _enough(inp, cfg) and inp.ttft_p95_ms > cfg.latency_floor_ms \
                and inp.ttft_p95_ms > cfg.latency_factor * median:
            found.append((1, -inp.ttft_p95_ms / median, inp.replica_id,
                          f"ttft p95 {inp.ttft_p95_ms:.0f}ms > {cfg.latency_factor:g} x pool median {median:.0f}ms"))
    limit = math.floor(len(candidates) * cfg.max_ejection_percent / 100 + 1e-9)
    ejected_now = sum(1 for i in candidates if states[i.replica_id].ejected)
    for kind, _, rid, cause in sorted(found):
        if ejected_now >= limit:
            break
        s = states[rid]
        n = s.ejections
        if s.last_readmit_at is not None and now - s.last_readmit_at >= cfg.backoff_reset_after_s:
            n = 0
        n += 1
        wait = exp_backoff(n, cfg.backoff_initial_s, cfg.backoff_max_s)
        base = max(0, by_id[rid].error_streak) if kind == 0 else s.error_base
        states[rid] = replace(s, ejected=True, cause=cause, ejected_at=now, readmit_at=now + wait, ejections=n,
                              error_base=base)
        events.append((rid, FaultEvent("eject", f"outlier: {cause}; re-admission in {wait:g}s "
                                       f"(ejection {n} in a row)")))
        ejected_now += 1

    healthy = sum(1 for i in candidates if not states[i.replica_id].ejected)
    panic = bool(candidates) and cfg.panic_threshold_percent > 0 and \
        healthy * 100 < cfg.panic_threshold_percent * len(candidates)
    return PoolOutliers(states, panic, tuple(events))


def _enough(inp: OutlierInput, cfg: OutlierConfig) -> bool:
    return math.isfinite(inp.ttft_samples) and inp.ttft_samples >= cfg.latency_min_samples \
        and math.isfinite(inp.ttft_p95_ms) and inp.ttft_p95_ms > 0


def _median_ttft(candidates: Sequence[OutlierInput], cfg: OutlierConfig) -> float | None:
    if not cfg.latency_factor:
        return None
    values = [i.ttft_p95_ms for i in candidates if _enough(i, cfg)]
    if len(values) < cfg.latency_min_replicas:
        return None
    m = statistics.median(values)
    return m if m > 0 else None
