"""Automatic fault decisions for one replica: eject, weight cut, re-admission with backoff.

Pure: `step(prev, signals, now, cfg)` returns the next `FaultState` and the events to record.
No I/O, no clock reads (`now` is the caller's monotonic seconds), no logging. The control
plane keeps one FaultState per replica and calls `step` on every report. Rules (README.md):

- GPU faults reported by NVML eject at once: a critical Xid event (`critical_xids`), an
  uncorrectable ECC count > 0, a failed row remapping, or the GPU lost. Xid 79 (fallen off the
  bus), a lost GPU and a failed row remapping (memory that needs service, not a reset) are not
  recoverable: the replica stays ejected until its agent reconnects fresh.
- Engine /health failing for `unhealthy_reports` consecutive reports ejects.
- OOM or a preemption storm (> `preemption_storm_per_s`) cuts the weight (DEGRADED) at once
  and ejects when it persists for `pressure_eject_after_s`.
- An ejected replica whose signals look healthy again is re-admitted once its backoff has
  passed: `backoff_initial_s * 2^(n-1)`, capped at `backoff_max_s`, n = ejections in a row;
  n resets after `backoff_reset_after_s` without an ejection since the last re-admission.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# Xids that mean the GPU (or its memory/interconnect) cannot be trusted: 48 double-bit ECC,
# 63/64 row remapping, 74 NVLink, 79 fallen off the bus, 92 high single-bit ECC rate,
# 94/95 contained/uncontained ECC.
CRITICAL_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95})
UNRECOVERABLE_XIDS = frozenset({79})


@dataclass(frozen=True)
class FaultPolicyConfig:
    critical_xids: frozenset[int] = CRITICAL_XIDS
    unrecoverable_xids: frozenset[int] = UNRECOVERABLE_XIDS
    unhealthy_reports: int = 3             # consecutive failing /health reports before ejection
    preemption_storm_per_s: float = 5.0    # preemptions/s above which the weight is cut (0 = off)
    pressure_eject_after_s: float = 30.0   # OOM/storm lasting this long ejects
    backoff_initial_s: float = 10.0
    backoff_max_s: float = 300.0
    backoff_reset_after_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.unhealthy_reports < 1:
            raise ValueError("unhealthy_reports must be >= 1")
        if not (0 < self.backoff_initial_s <= self.backoff_max_s):
            raise ValueError("need 0 < backoff_initial_s <= backoff_max_s")
        if self.pressure_eject_after_s < 0 or self.preemption_storm_per_s < 0:
            raise ValueError("pressure_eject_after_s and preemption_storm_per_s must be >= 0")


@dataclass(frozen=True)
class FaultSignals:
    """What one report says, already sanitised."""

    healthy: bool = True
    engine_error: str = ""
    xid_events: tuple[int, ...] = ()
    ecc_uncorrected: int = 0
    gpu_lost: bool = False
    oom: bool = False
    preemptions_per_s: float = 0.0
    row_remap_failed: bool = False


@dataclass(frozen=True)
class FaultState:
    ejected: bool = False
    cause: str = ""                      # why ejected (kept after re-admission for describe)
    permanent: bool = False              # not recoverable: only a fresh agent clears it
    ejected_at: float = 0.0
    readmit_at: float = 0.0
    ejections: int = 0                   # in a row, for the backoff
    last_readmit_at: float | None = None
    unhealthy_streak: int = 0
    pressure_since: float | None = None
    cut: str = ""                        # non-empty: weight cut for this reason


@dataclass(frozen=True)
class FaultEvent:
    kind: str                            # "eject" or "readmit"
    reason: str


@dataclass(frozen=True)
class FaultStep:
    state: FaultState
    events: tuple[FaultEvent, ...] = ()


def exp_backoff(ejections: int, initial_s: float, max_s: float) -> float:
    """initial_s * 2^(n-1), capped at max_s (shared with tidegate.policy.outliers)."""
    n = max(1, ejections)
    return min(max_s, initial_s * 2.0 ** min(n - 1, 30))


def backoff_s(ejections: int, cfg: FaultPolicyConfig) -> float:
    return exp_backoff(ejections, cfg.backoff_initial_s, cfg.backoff_max_s)


def step(prev: FaultState, sig: FaultSignals, now: float, cfg: FaultPolicyConfig) -> FaultStep:
    hard: list[str] = []
    permanent = False
    if sig.gpu_lost:
        hard.append("GPU lost (driver)")
        permanent = True
    crit = sorted({x for x in sig.xid_events if x in cfg.critical_xids})
    if crit:
        hard.append("critical Xid " + ", ".join(map(str, crit)))
        permanent = permanent or any(x in cfg.unrecoverable_xids for x in crit)
    if sig.ecc_uncorrected > 0:
        hard.append(f"{sig.ecc_uncorrected} uncorrectable ECC errors")
    if sig.row_remap_failed:
        hard.append("row remapping failed (GPU memory needs service)")
        permanent = True

    streak = 0 if sig.healthy else prev.unhealthy_streak + 1
    causes = list(hard)
    if streak >= cfg.unhealthy_reports:
        causes.append(f"engine unhealthy for {streak} consecutive reports"
                      + (f": {sig.engine_error}" if sig.engine_error else ""))

    pressure = []
    if sig.oom:
        pressure.append("out of memory")
    if cfg.preemption_storm_per_s > 0 and sig.preemptions_per_s > cfg.preemption_storm_per_s:
        pressure.append(f"preemption storm {sig.preemptions_per_s:.1f}/s > {cfg.preemption_storm_per_s:g}/s")
    since = (prev.pressure_since if prev.pressure_since is not None else now) if pressure else None
    cut = "; ".join(pressure)
    if since is not None and now - since >= cfg.pressure_eject_after_s:
        causes.append(f"{cut} for {now - since:.0f}s (>= {cfg.pressure_eject_after_s:g}s)")

    state = replace(prev, unhealthy_streak=streak, pressure_since=since, cut=cut)
    if prev.ejected:
        if causes:
            return FaultStep(replace(state, permanent=prev.permanent or permanent))
        if prev.permanent or now < prev.readmit_at or pressure or not sig.healthy:
            return FaultStep(state)
        return FaultStep(replace(state, ejected=False, last_readmit_at=now),
                         (FaultEvent("readmit", f"healthy again after {now - prev.ejected_at:.0f}s ejected "
                                     f"(cause: {prev.cause})"),))
    if not causes:
        return FaultStep(state)
    ejections = prev.ejections
    if prev.last_readmit_at is not None and now - prev.last_readmit_at >= cfg.backoff_reset_after_s:
        ejections = 0
    ejections += 1
    wait = backoff_s(ejections, cfg)
    cause = "; ".join(causes)
    after = ("not recoverable: stays ejected until the agent reconnects fresh" if permanent
             else f"re-admission when healthy, not before {wait:g}s (ejection {ejections} in a row)")
    return FaultStep(
        replace(state, ejected=True, cause=cause, permanent=permanent, ejected_at=now, readmit_at=now + wait,
                ejections=ejections, unhealthy_streak=0, pressure_since=None, cut=""),
        (FaultEvent("eject", f"{cause}; {after}"),))


def reconnected(prev: FaultState, now: float) -> FaultStep:
    """A fresh agent stream (no stream was open): clears a permanent ejection, which needs a
    new agent (node reset or replaced) to clear. Other ejections keep their backoff."""
    if not (prev.ejected and prev.permanent):
        return FaultStep(prev)
    return FaultStep(replace(prev, ejected=False, permanent=False, last_readmit_at=now, unhealthy_streak=0),
                     (FaultEvent("readmit", f"agent reconnected fresh after an unrecoverable fault "
                                 f"({prev.cause})"),))


def view_reasons(state: FaultState, now: float) -> tuple[str, str]:
    """(ejected reason, cut reason) for the weight policy; empty when not applicable."""
    if state.ejected:
        if state.permanent:
            return f"ejected: {state.cause} (not recoverable until the agent reconnects)", ""
        left = max(0.0, state.readmit_at - now)
        when = f"re-admission when healthy in {left:.0f}s" if left > 0 else "re-admission when healthy"
        return f"ejected: {state.cause} ({when})", ""
    return "", (f"weight cut: {state.cut}" if state.cut else "")
