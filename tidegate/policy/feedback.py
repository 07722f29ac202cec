"""SLO feedback: a replica's measured P95 TTFT/ITL against its pool's targets corrects its
weight and its share of the pool's admission budget through one bounded multiplier.

Pure: `step(prev, sample, cfg)` returns the next `FeedbackState`; no I/O, no clock, no logging.
The control plane keeps one state per replica (in memory: a restart starts every replica at
1.0, which is the safe end: the controller only ever takes capacity away) and steps it once per
telemetry report, so one tick = one measurement window.

Controller (AIMD with a deadband and hysteresis):

    r = max(ttft_p95 / ttft_target, itl_p95 / tpot_target)     (over the targets known)
    r > 1            for `hysteresis` samples in a row:  m <- max(min_multiplier, m * decrease)
    r < deadband_low for `hysteresis` samples in a row:  m <- min(1, m + increase)
    deadband_low <= r <= 1:                              m unchanged (streaks reset)

Why it is bounded and does not oscillate:
- m stays in [min_multiplier, 1] whatever the input: a replica is never silenced by feedback
  alone (ejection is the outlier policy's job) and never pushed above its measured weight.
- A sample without enough observations (`min_samples`), a non-finite or negative latency, or no
  target leaves m and the streaks alone: garbage cannot move it.
- `decrease >= deadband_low` is enforced: when latency grows at most linearly with the
  replica's share, one decrease from r > 1 lands at r' >= decrease * r > deadband_low, i.e. at
  worst inside the deadband, never below it, so a decrease cannot provoke an increase. Under
  constant measurements m moves monotonically to a bound or stops in the deadband.
- Hysteresis (N samples in a row) keeps a single noisy window from acting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

MAX_RATIO = 100.0   # a latency 100x over target says "far over"; more adds nothing but overflow risk


@dataclass(frozen=True)
class FeedbackConfig:
    enabled: bool = True
    deadband_low: float = 0.7    # r below this grows the multiplier
    decrease: float = 0.8        # multiplicative decrease per acting sample (r > 1)
    increase: float = 0.05       # additive increase per acting sample (r < deadband_low)
    min_multiplier: float = 0.2
    hysteresis: int = 2          # samples in a row on one side before acting
    min_samples: float = 5.0     # TTFT observations in the report's window for it to count

    def __post_init__(self) -> None:
        if not (0 < self.min_multiplier <= 1):
            raise ValueError("min_multiplier must be in (0, 1]")
        if not (0 < self.decrease < 1):
            raise ValueError("decrease must be in (0, 1)")
        if not (0 < self.deadband_low <= 1):
            raise ValueError("deadband_low must be in (0, 1]")
        if self.decrease < self.deadband_low:
            raise ValueError("decrease must be >= deadband_low, or one decrease can jump past the deadband "
                             "and the controller oscillates")
        if not (0 < self.increase <= 1):
            raise ValueError("increase must be in (0, 1]")
        if self.hysteresis < 1 or self.min_samples < 0:
            raise ValueError("need hysteresis >= 1 and min_samples >= 0")


@dataclass(frozen=True)
class FeedbackSample:
    """One report's windowed figures and the pool's targets (0 = unknown)."""

    ttft_p95_ms: float = 0.0
    itl_p95_ms: float = 0.0
    samples: float = 0.0          # TTFT observations in the window
    ttft_target_ms: float = 0.0
    tpot_target_ms: float = 0.0


@dataclass(frozen=True)
class FeedbackState:
    multiplier: float = 1.0
    over: int = 0                 # samples in a row with r > 1
    under: int = 0                # samples in a row with r < deadband_low
    ratio: float = 0.0            # last valid r, for humans (0 = none yet)


def ratio(sample: FeedbackSample) -> float | None:
    """r of one sample, clamped to [0, MAX_RATIO]; None when it says nothing (no target, no data)."""
    out = None
    for value, target in ((sample.ttft_p95_ms, sample.ttft_target_ms), (sample.itl_p95_ms, sample.tpot_target_ms)):
        if not (_finite_pos(target) and math.isfinite(value) and value > 0):
            continue
        r = min(MAX_RATIO, value / target)
        out = r if out is None else max(out, r)
    return out


def step(prev: FeedbackState, sample: FeedbackSample, cfg: FeedbackConfig) -> FeedbackState:
    if not cfg.enabled:
        return FeedbackState()
    m = prev.multiplier if math.isfinite(prev.multiplier) else 1.0
    m = min(1.0, max(cfg.min_multiplier, m))
    if not (math.isfinite(sample.samples) and sample.samples >= cfg.min_samples):
        return replace(prev, multiplier=m)
    r = ratio(sample)
    if r is None:
        return replace(prev, multiplier=m)
    if r > 1.0:
        over = prev.over + 1
        if over >= cfg.hysteresis:
            return FeedbackState(max(cfg.min_multiplier, m * cfg.decrease), 0, 0, r)
        return FeedbackState(m, over, 0, r)
    if r < cfg.deadband_low:
        under = prev.under + 1
        if under >= cfg.hysteresis:
            return FeedbackState(min(1.0, m + cfg.increase), 0, 0, r)
        return FeedbackState(m, 0, under, r)
    return FeedbackState(m, 0, 0, r)


def describe(state: FeedbackState) -> str:
    """'' at 1.0; else why the weight is reduced, for the table's reason."""
    if state.multiplier >= 1.0:
        return ""
    return f"slo feedback x{state.multiplier:.2f} (p95/target {state.ratio:.2f})"


def _finite_pos(x: float) -> bool:
    return math.isfinite(x) and x > 0
