"""Per-replica engine rates fitted online from telemetry (pure: no clock, no I/O).

The router predicts TTFT and TPOT with a linear step-time model of each engine::

    step_ms ~= decode_step_base_ms + decode_step_per_seq_ms * B + P * 1000 / prefill_tokens_per_s

where B is the number of sequences the step decodes and P the uncached prompt tokens it prefills.
This module fits the three numbers per replica from what every engine already exports, without a
profile: each report carries one `EngineWork` window (deltas since the previous scrape, built by
the agent from /metrics) and the fit is a ridge regression over exponentially forgotten windows.

One window gives one observation (see `regressors`):

    y  = itl_sum / itl_count                mean time between two tokens of a decoding sequence (ms)
    x1 = itl_count / steps                  mean decoding sequences per step
    x2 = (prompt - cached prompt) / steps   mean uncached prefill tokens per step
    y ~= base + per_seq * x1 + x2 / prefill_rate_per_ms

Why it holds: each decoded token's inter-token latency is the duration of the step that made it,
so the ITL histogram's sum is the sum over steps of B_s * T_s and its count the sum of B_s. With
T_s linear in B_s and P_s, y is the token-weighted mean step time, which equals the model at the
window's mean batch and prefill when B_s varies little inside the window (it is biased up by
per_seq * Var(B)/mean(B) otherwise). Engines that do not count steps (SGLang) get
steps = busy_s / y, with busy_s their GPU busy time where exported and the interval otherwise
(right while the engine is busy, which is when the rates matter).

The lead term (`lead`, the default): engines count a prompt's tokens when its prefill completes
(vLLM's `prompt_tokens_total`, and the prompt part of `iteration_tokens_total`) and its cache hits
when it is admitted, so a long prompt prefilled in chunks over several steps is counted in a later
window than some of the steps it slowed. That misattribution is noise in x2, and noise in a
regressor flattens its slope (errors in variables): the prefill reads faster than it is. The
tokens a window's steps computed but did not count are counted in the next window, so the fit
takes the next window's uncached tokens, in this window's per-step units, as a fourth regressor:

    x3 = (next window's prompt - cached prompt) / steps
    y ~= base + per_seq * x1 + m0 * x2 + m1 * x3          prefill slope = m0 + m1

A prefill longer than a report spills past the next one, so windows are first summed until they
span two mean prefill durations (`lag_windows` 2, from the engine's
vllm:request_prefill_time_seconds; below): a prefill then spills at most into the next summed
window, which the lead reads. Prefills under ~0.75 s keep 1 s windows (a sum ends at the nearest
report), so on the shipped traces this is the lead on 1 s reports. On a 70B on four GPUs, where
Mooncake's prompts take seconds to prefill (~9k tokens/s), the lead on 1 s windows alone fitted
18.1k, the sums without the lead (ten durations, the fit before) 11.8k / 9.3k at loads 0.5 / 1,
and the two together 10.1k / 10.1k (scripts/measure_rate_estimator.py).

Each window enters the fit when the next one arrives (one report later); an idle next window
gives it x3 = 0 (nothing was in flight across it), and a garbage one or `interrupt()` (reports may
have been lost) drops it, its lead unknown. m1 is held at 0 by the prior where the data do not
identify it (prompts that prefill in one step leave nothing to the next window). Measured
(tidegate/policy/README.md, "Rate estimator"): on one simulated replica of the Mooncake trace at
load 1 the fit is 46.5k tokens/s (the engine computes 47.6k; 56.5k without the term) and its
mean-step error p50/p90 5.4/15.5 % (11.5/21.0 %); on a 16-replica fleet at 1.5x capacity the
published median is 46.5-49.3k from 10 s on (56.5-59.2k before).

Summing windows: the slope is fitted on windows summed (counters add) until they span
`lag_windows` times the mean prefill duration the engine reports (vllm:request_prefill_time_seconds,
first token minus first scheduled; forgotten like the fit), at least `min_window_s` and at most
`max_window_s`; base and per_seq then come from every report's own window with that slope held
(`estimate`), since summing averages away the batch spread that identifies them. Before the lead
term, summing alone was the remedy, to ten durations: Mooncake's ~3 s sums fitted 56-59k, since
the misplaced tokens give a window's count a spread of ~15k tokens whatever its length, so
longer sums only dilute it (`lead` off and `lag_windows` 10 reproduce it, for measuring). A
window with no work at all ends the merge early, and a garbage window (NaN, negative, no
interval: also what the agent sends after a counter reset) or `interrupt()` drops it: counts
across a gap are not one window.

Fit: theta = (A + L0)^-1 (r + L0 theta0) with A = sum w x x^T, r = sum w x y over windows
weighted by their decode tokens w and forgotten with half-life `half_life_s`; L0 = prior_weight *
diag(1, batch_scale^2, prefill_scale^2, prefill_scale^2) holds theta0 = the prior (a generic one,
or a profile's figures from the agent's hello, with m1 = 0) in the directions the data leave
unidentified, e.g. the split between base and per_seq while the batch never changes. The prior
never decays, so the fit cannot wind up; with data it is overruled within a few reports. Windows
with NaN, negative or zero counts are rejected; outputs are clamped to physical bounds.

Published values: 0 (unknown) until enough data (or a profile prior) backs them; then snapped to
a geometric grid (`quantum`, 4 %) with hysteresis, so noise does not rewrite routing tables.
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass, field


@dataclass(frozen=True)
class EngineRates:
    """The published figures (RouteEntry fields of the same names); 0 = unknown."""

    prefill_tokens_per_s: float = 0.0
    decode_step_base_ms: float = 0.0
    decode_step_per_seq_ms: float = 0.0

    def step_ms(self, batch: float, prefill_tokens: float = 0.0) -> float:
        """Predicted duration of a step decoding `batch` sequences and prefilling `prefill_tokens`."""
        prefill = prefill_tokens * 1000.0 / self.prefill_tokens_per_s if self.prefill_tokens_per_s > 0 else 0.0
        return self.decode_step_base_ms + self.decode_step_per_seq_ms * batch + prefill

    @property
    def complete(self) -> bool:
        return self.prefill_tokens_per_s > 0 and self.decode_step_base_ms > 0 and self.decode_step_per_seq_ms > 0


# Plausible for a mid-size model on a current datacenter GPU; only a starting point: the data
# overrule it in every direction they identify.
GENERIC_PRIOR = EngineRates(prefill_tokens_per_s=10_000.0, decode_step_base_ms=10.0, decode_step_per_seq_ms=0.1)


@dataclass(frozen=True)
class RateEstimatorConfig:
    half_life_s: float = 120.0          # windows older than this count half
    prior_weight: float = 50.0          # prior strength, in decode tokens of evidence
    batch_scale: float = 32.0           # batch spread the prior's per_seq stands for
    prefill_scale: float = 64.0         # prefill tokens per step the prior's prefill rate stands for
    min_decode_tokens: float = 200.0    # forgotten-weighted decode tokens before publishing decode rates
    min_prefill_tokens: float = 4096.0  # forgotten-weighted uncached prompt tokens before publishing prefill
    # Report windows with decode timing before any figure is published. Token thresholds alone let
    # a replica publish after its first window, and a fit on one or two windows is noise: 48
    # identical replicas on Azure code published prefill rates from 9.7k to 139k tokens/s (true
    # ~47k) in their first 4 s, and predict.pool_rates took the outliers for other kinds of GPU,
    # flooding the "fast" ones (1.7x least_request's TPOT misses there). Unpublished, a replica
    # takes its pool's median, or the cautious default while no replica has one. Counted in
    # reports (seconds of traffic), not in merged windows: five of Mooncake's ~3 s merges kept
    # its pool on the default for 15 s and cost a search step of capacity with admission. Five,
    # by measurement (docs/BENCHMARKS.md, "Rates published on evidence"): ten did worse.
    min_windows: int = 5
    quantum: float = 0.04               # published values move on a geometric grid of this ratio
    max_step_ms: float = 60_000.0       # a mean inter-token time above this is garbage
    base_ms_bounds: tuple[float, float] = (0.05, 5_000.0)
    per_seq_ms_bounds: tuple[float, float] = (1e-4, 1_000.0)
    prefill_tokens_per_s_bounds: tuple[float, float] = (10.0, 1e7)
    # Prompts counted after the steps they slowed (module docstring): the slope's fit reads the
    # next window's uncached prompt tokens (`lead`), on report windows summed until they span
    # `lag_windows` mean prefill durations (the engine's vllm:request_prefill_time_seconds), at
    # least `min_window_s` and at most `max_window_s`, so that a prefill spills at most into the
    # next summed window; base and per_seq stay on every report's own window. `lead` off with
    # `lag_windows` 10 is the fit before the lead term (for measuring).
    lead: bool = True
    lag_windows: float = 2.0   # 0 = off: windows merge only to min_window_s
    min_window_s: float = 0.0   # reached to the nearest window: report intervals jitter
    max_window_s: float = 10.0

    def __post_init__(self) -> None:
        positive = (self.half_life_s, self.prior_weight, self.batch_scale, self.prefill_scale, self.quantum,
                    self.max_step_ms)
        if not all(math.isfinite(v) and v > 0 for v in positive):
            raise ValueError("rate estimator: half_life_s, prior_weight, scales, quantum, max_step_ms must be > 0")
        for lo, hi in (self.base_ms_bounds, self.per_seq_ms_bounds, self.prefill_tokens_per_s_bounds):
            if not 0 < lo < hi:
                raise ValueError("rate estimator: bounds must satisfy 0 < low < high")
        if self.min_windows < 0:
            raise ValueError("rate estimator: min_windows must be >= 0")
        if not (math.isfinite(self.min_window_s) and self.min_window_s >= 0):
            raise ValueError("rate estimator: min_window_s must be >= 0")
        if not (math.isfinite(self.lag_windows) and self.lag_windows >= 0):
            raise ValueError("rate estimator: lag_windows must be >= 0")
        if not (math.isfinite(self.max_window_s) and self.max_window_s >= self.min_window_s):
            raise ValueError("rate estimator: max_window_s must be >= min_window_s")


@dataclass(frozen=True)
class WorkWindow:
    """One `tidegate.v1.EngineWork`: what the engine did between two scrapes (0 = not exported)."""

    interval_s: float = 0.0
    steps: float = 0.0
    step_tokens: float = 0.0
    prompt_tokens: float = 0.0
    cached_prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    itl_sum_s: float = 0.0
    itl_count: float = 0.0
    busy_s: float = 0.0
    prefill_time_sum_s: float = 0.0   # how long finished requests' prefills spanned, summed
    prefill_time_count: float = 0.0
    finished_requests: float = 0.0    # not a fit input: the control plane's seat drain (fleet.smoothed_rate)

    @classmethod
    def from_proto(cls, w) -> WorkWindow:
        """From a `tidegate.v1.EngineWork` (or anything with its field names)."""
        return cls(interval_s=w.interval_s, steps=w.steps, step_tokens=w.step_tokens, prompt_tokens=w.prompt_tokens,
                   cached_prompt_tokens=w.cached_prompt_tokens, generation_tokens=w.generation_tokens,
                   itl_sum_s=w.itl_sum_s, itl_count=w.itl_count, busy_s=w.busy_s,
                   prefill_time_sum_s=w.prefill_time_sum_s, prefill_time_count=w.prefill_time_count,
                   finished_requests=w.finished_requests)

    def __add__(self, other: WorkWindow) -> WorkWindow:
        """Two consecutive windows as one: every field is a count or a duration, so they add."""
        return WorkWindow(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    @property
    def idle(self) -> bool:
        """Nothing ran: no step, token or busy time (the interval alone)."""
        return not any(astuple(self)[1:])


def garbage(w: WorkWindow, max_step_ms: float = 60_000.0) -> bool:
    """Counts no engine produces: NaN, negative, no interval (the agent's empty window after a
    counter went down), an ITL sum without a count or the reverse, or an absurd mean ITL."""
    values = astuple(w)
    if not all(math.isfinite(v) and v >= 0 for v in values) or w.interval_s <= 0:
        return True
    if (w.itl_count > 0) != (w.itl_sum_s > 0):
        return True
    return w.itl_count >= 1 and 1000.0 * w.itl_sum_s / w.itl_count > max_step_ms


@dataclass(frozen=True)
class Observation:
    batch: float           # x1: decoding sequences per step
    prefill: float         # x2: uncached prefill tokens per step
    step_ms: float         # y: mean inter-token time
    weight: float          # decode tokens behind it
    prefill_tokens: float  # uncached prompt tokens in the window
    per_step: float = 0.0  # prefill / prefill_tokens: how the window turns tokens into x2 (its lead too)


def regressors(w: WorkWindow, max_step_ms: float = 60_000.0) -> Observation | None:
    """The window's observation, or None when it holds no usable decode timing or any garbage."""
    values = (w.interval_s, w.steps, w.step_tokens, w.prompt_tokens, w.cached_prompt_tokens, w.generation_tokens,
              w.itl_sum_s, w.itl_count, w.busy_s)
    if not all(math.isfinite(v) and v >= 0 for v in values):
        return None
    if w.interval_s <= 0 or w.itl_count < 1 or w.itl_sum_s <= 0:
        return None
    y = 1000.0 * w.itl_sum_s / w.itl_count
    if not 0 < y <= max_step_ms:
        return None
    uncached = uncached_tokens(w)
    steps = w.steps
    if steps <= 0:
        busy = w.busy_s if w.busy_s > 0 else w.interval_s
        steps = busy * 1000.0 / y
    # Every decoded token ran in some step with at least one decode: fewer steps than that is garbage.
    batch = w.itl_count / steps
    prefill = uncached / steps
    per_step = 1.0 / steps
    if batch < 1.0:
        # Fewer decode tokens than steps: some steps decoded nothing (a prefill on an idle engine)
        # and no token saw them. At most itl_count steps decoded; count only that share of the
        # prefill (as if spread evenly), and the decoding steps still ran at least one sequence.
        prefill *= batch
        per_step *= batch
        batch = 1.0
    return Observation(batch=batch, prefill=prefill, step_ms=y, weight=w.itl_count, prefill_tokens=uncached,
                       per_step=per_step)


def uncached_tokens(w: WorkWindow) -> float:
    """Prompt tokens the window counted as prefilled, cache hits left out (>= 0)."""
    return max(0.0, w.prompt_tokens - w.cached_prompt_tokens)


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Solve a small linear system by Gaussian elimination with partial pivoting; None when
    singular. `a` and `b` are overwritten."""
    n = len(b)
    for c in range(n):
        p = max(range(c, n), key=lambda i: abs(a[i][c]))
        if not math.isfinite(a[p][c]) or abs(a[p][c]) < 1e-300:
            return None
        a[c], a[p] = a[p], a[c]
        b[c], b[p] = b[p], b[c]
        for i in range(c + 1, n):
            f = a[i][c] / a[c][c]
            for j in range(c, n):
                a[i][j] -= f * a[c][j]
            b[i] -= f * b[c]
    x = [0.0] * n
    for i in range(n - 1, -1, -1):
        x[i] = (b[i] - sum(a[i][j] * x[j] for j in range(i + 1, n))) / a[i][i]
    return x


def _clamp(v: float, bounds: tuple[float, float]) -> float:
    return min(bounds[1], max(bounds[0], v))


def snap(value: float, quantum: float) -> float:
    """Nearest point of the geometric grid (1 + quantum)^k, to 4 significant digits; 0 stays 0."""
    if not (value > 0 and math.isfinite(value)):
        return 0.0
    step = math.log1p(quantum)
    v = math.exp(round(math.log(value) / step) * step)
    return float(f"{v:.4g}")


def _publish(prev: float, value: float, quantum: float) -> float:
    """Hysteresis: keep `prev` while `value` stays within 1.5 grid steps of it."""
    if value <= 0:
        return 0.0
    if prev > 0 and abs(math.log(value / prev)) <= 1.5 * math.log1p(quantum):
        return prev
    return snap(value, quantum)


@dataclass
class RateEstimator:
    """Per-replica online fit. `observe` each report's window; read `published` for the table."""

    cfg: RateEstimatorConfig = field(default_factory=RateEstimatorConfig)
    prior: EngineRates | None = None   # a profile's figures when known; None = GENERIC_PRIOR, unpublished
    # Normal equations over merged windows (they give the prefill slope) and over every report's
    # own window (they give base and per_seq at the report's resolution; see `estimate`).
    _a: list[list[float]] = field(default_factory=lambda: [[0.0] * 4 for _ in range(4)])
    _r: list[float] = field(default_factory=lambda: [0.0] * 4)
    _a1: list[list[float]] = field(default_factory=lambda: [[0.0] * 4 for _ in range(4)])
    _r1: list[float] = field(default_factory=lambda: [0.0] * 4)
    _decode_tokens: float = 0.0
    _prefill_tokens: float = 0.0
    _published: EngineRates = field(default_factory=EngineRates)
    windows: int = 0      # observations fitted (merged windows)
    reports: int = 0      # report windows with decode timing (min_windows counts these)
    rejected: int = 0     # garbage windows, idle ones, and merged windows without decode timing
    # Windows received since the last fit, summed, while they span under `window_s`.
    _pending: WorkWindow | None = None
    # The last fitted window's observation and forgetting factor, waiting for the next one's
    # count (its lead term) before it enters the slope's fit (`lead`).
    _held: tuple[Observation, float] | None = None
    _held_report: tuple[Observation, float] | None = None   # the same for the last report's own window
    # Prefill durations (s) and their count, forgotten like the fit: their ratio sizes the merge.
    _prefill_time_s: float = 0.0
    _prefill_count: float = 0.0
    # The slope fit's weighted squared step times and its windows, forgotten alike: the fit's
    # residual spread, for the prefill rate's standard error (`prefill_rel_se`).
    _syy: float = 0.0
    _n: float = 0.0

    def __post_init__(self) -> None:
        if self.prior is not None and not self.prior.complete:
            self.prior = None
        if self.prior is not None:
            self._published = self._quantized(self.estimate(), EngineRates())

    @property
    def theta0(self) -> tuple[float, float, float, float]:
        p = self.prior or GENERIC_PRIOR
        return (p.decode_step_base_ms, p.decode_step_per_seq_ms, 1000.0 / p.prefill_tokens_per_s, 0.0)

    @property
    def mean_prefill_s(self) -> float:
        """How long a prefill spans, from the engine's prefill-time histogram; 0 while unknown."""
        return self._prefill_time_s / self._prefill_count if self._prefill_count > 0 else 0.0

    @property
    def window_s(self) -> float:
        """The span merged windows reach before one observation is fitted (see RateEstimatorConfig)."""
        cfg = self.cfg
        return max(cfg.min_window_s, min(cfg.max_window_s, cfg.lag_windows * self.mean_prefill_s))

    def observe(self, window: WorkWindow) -> bool:
        """Take one report window: merged with the pending ones, fitted once they span
        `window_s` (to the nearest window). False when nothing of it is learnt: it is garbage,
        idle (which fits what is pending, if anything), or ends a window with no decode timing."""
        if garbage(window, self.cfg.max_step_ms):
            # Whatever is pending stays good, but the next window need not follow it (a counter
            # reset, a lost scrape): fitting them as one would attribute work to the wrong span.
            # The held window's lead is unknown for the same reason: it is dropped.
            self._pending = None
            self._held = self._held_report = None
            self.rejected += 1
            return False
        if window.idle:
            # Nothing in flight across an idle window, so no count lags past it: fit what is
            # pending now (and leave the idle interval out, as an idle window always was).
            pending, self._pending = self._pending, None
            if pending is not None:
                self._fit(pending)
            self._release(0.0)  # nothing was in flight across it: the held windows' leads are 0
            self._release_report(0.0)
            self.rejected += 1
            return False
        if window.prefill_time_count > 0:
            keep = 0.5 ** (window.interval_s / self.cfg.half_life_s)
            self._prefill_time_s = self._prefill_time_s * keep + window.prefill_time_sum_s
            self._prefill_count = self._prefill_count * keep + window.prefill_time_count
        merged = window if self._pending is None else self._pending + window
        # Report intervals are measured and jitter around the scrape period: the merge ends at the
        # span nearest window_s (two windows of 0.999 s are 2 s), or every other merge would
        # take one window more than intended.
        self._fit_report(window)
        if merged.interval_s < self.window_s - 0.5 * window.interval_s:
            self._pending = merged
            if self.windows:
                self._published = self._quantized(self.estimate(), self._published)
            return True
        self._pending = None
        return self._fit(merged)
    def interrupt(self) -> None:
        """The next window may not follow the last one (a new telemetry stream: reports may have
        been lost between): drop the pending merge and the held window, keep the fit."""
        self._pending = None
        self._held = self._held_report = None

    @staticmethod
    def _accumulate(a: list[list[float]], r: list[float], obs: Observation, keep: float, lead: float = 0.0) -> None:
        x = (1.0, obs.batch, obs.prefill, lead)
        for i in range(4):
            r[i] = r[i] * keep + obs.weight * x[i] * obs.step_ms
            for j in range(4):
                a[i][j] = a[i][j] * keep + obs.weight * x[i] * x[j]

    def _fit_report(self, window: WorkWindow) -> None:
        """One report's own window, merged or not: base and per_seq learn from it (decode tokens
        are counted in the step that made them), with `lead` once the next report's count is in."""
        self._release_report(uncached_tokens(window))
        obs = regressors(window, self.cfg.max_step_ms)
        if obs is not None:
            self.reports += 1
            keep = 0.5 ** (window.interval_s / self.cfg.half_life_s)
            if self.cfg.lead:
                self._held_report = (obs, keep)
            else:
                self._accumulate(self._a1, self._r1, obs, keep)

    def _release_report(self, next_uncached: float) -> None:
        """The held report window enters the decode figures' fit, its lead the next report's count."""
        held, self._held_report = self._held_report, None
        if held is not None:
            obs, keep = held
            self._accumulate(self._a1, self._r1, obs, keep, next_uncached * obs.per_step)

    def _fit(self, window: WorkWindow) -> bool:
        """A merged window (or a report's own, when it spans window_s alone): the prefill slope
        learns. With `lead`, its count is the held window's lead, and it is held in turn."""
        obs = regressors(window, self.cfg.max_step_ms)
        self._release(uncached_tokens(window))
        if obs is None:
            self.rejected += 1
            return False
        keep = 0.5 ** (window.interval_s / self.cfg.half_life_s)
        if self.cfg.lead:
            self._held = (obs, keep)
        else:
            self._learn(obs, keep, 0.0)
        return True

    def _release(self, next_uncached: float) -> None:
        """The held window enters the fit, its lead the next window's uncached tokens in its units."""
        held, self._held = self._held, None
        if held is not None:
            obs, keep = held
            self._learn(obs, keep, next_uncached * obs.per_step)

    def _learn(self, obs: Observation, keep: float, lead: float) -> None:
        self._accumulate(self._a, self._r, obs, keep, lead)
        self._syy = self._syy * keep + obs.weight * obs.step_ms * obs.step_ms
        self._n = self._n * keep + 1.0
        self._decode_tokens = self._decode_tokens * keep + obs.weight
        self._prefill_tokens = self._prefill_tokens * keep + obs.prefill_tokens
        self.windows += 1
        self._published = self._quantized(self.estimate(), self._published)

    def estimate(self) -> EngineRates:
        """The current fit, clamped to the bounds (the prior before any data).

        Two stages: the prefill slope (its own and lead coefficients) from the summed windows' fit,
        then base and per_seq from every report's own window (with the next report's count as its
        lead) with that slope held: the same ridge normal equations' first two rows, so with no
        summing this is the joint fit exactly, and with summing the decode figures keep the
        reports' resolution and spread (a fit of every figure on sums cost Azure code, whose
        prompts have no lag to undo, 2 points of SLO attainment at load 0.7)."""
        cfg = self.cfg
        t0 = self.theta0
        lam = self._ridge()
        a, b = self._slope_system()
        theta = _solve(a, b) or list(t0)
        if not all(math.isfinite(v) for v in theta):
            theta = list(t0)
        base, per_seq, own, lead = theta
        rate_lo, rate_hi = cfg.prefill_tokens_per_s_bounds
        # The window's own count and its lead are one slope; clamped, the own part takes the cut.
        ms_per_token = min(1000.0 / rate_lo, max(1000.0 / rate_hi, own + lead))
        own = ms_per_token - lead
        a1, r1 = self._a1, self._r1
        det = (a1[0][0] + lam[0]) * (a1[1][1] + lam[1]) - a1[0][1] * a1[1][0]
        if math.isfinite(det) and abs(det) > 1e-300:
            y0 = r1[0] + lam[0] * t0[0] - own * a1[0][2] - lead * a1[0][3]
            y1 = r1[1] + lam[1] * t0[1] - own * a1[1][2] - lead * a1[1][3]
            b0 = ((a1[1][1] + lam[1]) * y0 - a1[0][1] * y1) / det
            b1 = ((a1[0][0] + lam[0]) * y1 - a1[1][0] * y0) / det
            if math.isfinite(b0) and math.isfinite(b1):
                base, per_seq = b0, b1
        return EngineRates(
            prefill_tokens_per_s=1000.0 / ms_per_token,
            decode_step_base_ms=_clamp(base, cfg.base_ms_bounds),
            decode_step_per_seq_ms=_clamp(per_seq, cfg.per_seq_ms_bounds),
        )

    def _ridge(self) -> tuple[float, float, float, float]:
        """L0's diagonal: the prior's weight in each figure's units."""
        cfg = self.cfg
        return (cfg.prior_weight, cfg.prior_weight * cfg.batch_scale ** 2, cfg.prior_weight * cfg.prefill_scale ** 2,
                cfg.prior_weight * cfg.prefill_scale ** 2)

    def _slope_system(self) -> tuple[list[list[float]], list[float]]:
        """The slope fit's ridge normal equations (A + L0, r + L0 theta0), fresh lists."""
        lam, t0 = self._ridge(), self.theta0
        a = [[self._a[i][j] + (lam[i] if i == j else 0.0) for j in range(4)] for i in range(4)]
        return a, [self._r[i] + lam[i] * t0[i] for i in range(4)]

    def prefill_rel_se(self) -> float:
        """The fitted prefill rate's relative standard error (inf while it cannot be told).

        The slope s = m0 + m1 (ms per uncached token) has variance sigma^2 c^T (A + L0)^-1 c with
        c = (0, 0, 1, 1), sigma^2 the residual variance per unit of weight (weighted squared
        residuals over the windows less the four fitted figures: the windows' mean step times
        have variances inverse to their decode tokens, the weights), and the rate 1000 / s the
        same relative error to first order."""
        if self._n <= 4:
            return math.inf
        a, b = self._slope_system()
        theta = _solve([row[:] for row in a], b[:])
        g = _solve(a, [0.0, 0.0, 1.0, 1.0])
        if theta is None or g is None:
            return math.inf
        ssr = self._syy - 2.0 * sum(t * r for t, r in zip(theta, self._r, strict=True)) + sum(
            theta[i] * self._a[i][j] * theta[j] for i in range(4) for j in range(4))
        var = max(0.0, ssr) / (self._n - 4) * (g[2] + g[3])
        slope = theta[2] + theta[3]
        if not (math.isfinite(var) and var >= 0 and slope > 0):
            return math.inf
        return math.sqrt(var) / slope

    def _quantized(self, est: EngineRates, prev: EngineRates) -> EngineRates:
        q = self.cfg.quantum
        seeded = self.prior is not None
        cfg = self.cfg
        decode_ok = seeded or (self._decode_tokens >= cfg.min_decode_tokens and self.reports >= cfg.min_windows)
        prefill_ok = decode_ok and (seeded or self._prefill_tokens >= cfg.min_prefill_tokens)
        if not decode_ok:
            return EngineRates()
        # A slope the fit pins at a bound is no estimate: the windows say prompt tokens cost nothing
        # (or everything), which is what a few windows whose prompts were counted apart from the
        # steps they slowed say at a pool's start. Published, 1e7 tokens/s made every replica look
        # idle to admission (Azure code at 1.5x capacity: ~440 held requests sent in 60 ms, a third
        # of them missing TPOT). Unidentified, it is unknown (0): the pool's other replicas' figure
        # or the default stands in (predict.pool_rates).
        lo, hi = self.cfg.prefill_tokens_per_s_bounds
        pinned = not lo * (1 + 1e-9) < est.prefill_tokens_per_s < hi * (1 - 1e-9)
        prefill = _publish(prev.prefill_tokens_per_s, est.prefill_tokens_per_s, q) if prefill_ok and not pinned else 0.0
        return EngineRates(
            prefill_tokens_per_s=prefill,
            decode_step_base_ms=_publish(prev.decode_step_base_ms, est.decode_step_base_ms, q),
            decode_step_per_seq_ms=_publish(prev.decode_step_per_seq_ms, est.decode_step_per_seq_ms, q),
        )

    @property
    def published(self) -> EngineRates:
        """What the routing table carries: quantized, 0 where not yet backed by data or a profile."""
        return self._published
