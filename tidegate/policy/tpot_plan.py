"""The TPOT planning margin: the target the pick plans to, divided by how far past plans missed.

Pure: observations in, a margin out; no clock, I/O or RNG.

Why: the pick gives each request a stall budget (what later prefills may delay its steps before
its TPOT passes the target) and admission gives each replica a prefill budget, both from the
fitted step-time model and planned exactly to the target. Planned at the target, the model's
errors (a rate fitted from noisy windows, a step time without the KV context's share) put the
marginal requests just over it: Mooncake at 1.5x its SLO capacity, one router, seed 0, 40
critical requests missed TPOT, 28 of them by under 10 %. The margin is measured, not chosen:

    e_i          = realized TPOT_i / TPOT_i was planned to   (the latest `window` requests)
    margin       = min(max_margin, max(1, q_quantile(e)))    (until `min_samples` are in: the cap
                                                               where the plan is enforced, else 1)
    planned TPOT = target / margin       (critical requests: margin at `critical_quantile`)

It is measured against the plan it set, so it is a fixed point, not an integrator: if realized
TPOTs run k times their plan at the quantile, the margin is k whatever it was before, and with
the plan at target / k they meet the target there. `quantile` is the share of planned requests
that should meet their TPOT (0.99, the strictest class's attainment target in issue 9; 0.995 for
`critical` requests themselves, whose 99 % must cover TTFT misses too: measured, Mooncake at 1.5x
capacity, one router, critical 98.7 -> 99.2 %, the other classes as before); floored at
1, a plan that was met never loosens the target; capped at `max_margin`, a burst of misses that
no plan could avoid (a preemption, an engine stall) cannot make it refuse most of the work.

Only routers that enforce the plan report realized TPOTs (admission: the router holds what would
break it); without admission every request is sent anyway and its TPOT says nothing of the plan,
so the margin stays 1 there. The quantile is refreshed every `refresh` observations (a sort of
`window` values), not per pick.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class TpotPlanConfig:
    quantile: float = 0.99
    # For `critical` requests (priority >= 1): their class must attain 99 % of both SLOs, so their
    # TPOT plan may spend at most half of that 1 % (the other half is TTFT's): 0.995.
    critical_quantile: float = 0.995
    window: int = 1024
    min_samples: int = 32
    max_margin: float = 2.0
    refresh: int = 16

    def __post_init__(self) -> None:
        if not (0.0 < self.quantile <= 1.0 and 0.0 < self.critical_quantile <= 1.0):
            raise ValueError("tpot plan: quantile and critical_quantile must be in (0, 1]")
        if not (self.window >= 1 and 1 <= self.min_samples <= self.window and self.refresh >= 1):
            raise ValueError("tpot plan: need window >= min_samples >= 1 and refresh >= 1")
        if not (math.isfinite(self.max_margin) and self.max_margin >= 1.0):
            raise ValueError("tpot plan: max_margin must be >= 1")


class TpotPlan:
    """Realized-over-planned TPOTs of the latest requests and the margin they set."""

    def __init__(self, cfg: TpotPlanConfig) -> None:
        self.cfg = cfg
        self._errors: deque[float] = deque(maxlen=cfg.window)
        self._since = 0
        self.margin = 1.0
        self.critical_margin = 1.0
        self.enforced = False
        self._completed = 0

    def enforce(self) -> None:
        """A router enforces the plan (admission): for its first `min_samples` requests, until as
        many realized TPOTs are in, plan to the cap. With no measure of the plan's error yet, the
        worst the margin allows is the safe side (as DEFAULT_RATES are slower than real engines);
        the first seconds of a router otherwise planned to the target exactly, and their misses
        were most of critical's (Mooncake at 1.5x capacity, one router: critical 98.8 -> 99.5 %).
        Bounded by completions, not only by measurements: a live router measures TPOT only on
        streamed answers with usage, and clients that never ask for it must not leave it
        planning to the cap for good (`completed`)."""
        self.enforced = True
        if len(self._errors) < self.cfg.min_samples and self._completed < self.cfg.min_samples:
            self.margin = self.critical_margin = self.cfg.max_margin

    def completed(self) -> None:
        """A request placed under the plan finished, with a realized TPOT or without one. After
        `min_samples` of them with fewer measurements, the cap no longer stands in: margin 1 until
        measured (what nothing measurable can tell better)."""
        self._completed += 1
        if self._completed == self.cfg.min_samples and len(self._errors) < self.cfg.min_samples:
            self.margin = self.critical_margin = 1.0

    def margin_for(self, priority: int) -> float:
        """The margin a request of this priority is planned with (`critical_margin` for critical)."""
        return self.critical_margin if priority >= 1 else self.margin

    def observe(self, realized_s: float, planned_s: float) -> None:
        """One finished request: its TPOT and the TPOT its stall budget was planned to."""
        if not (planned_s > 0 and math.isfinite(planned_s) and realized_s >= 0 and math.isfinite(realized_s)):
            return
        self._errors.append(realized_s / planned_s)
        self._since += 1
        if self._since >= self.cfg.refresh and len(self._errors) >= self.cfg.min_samples:
            self._since = 0
            ranked = sorted(self._errors)
            top = len(ranked) - 1
            self.margin = min(self.cfg.max_margin, max(1.0, ranked[int(self.cfg.quantile * top)]))
            self.critical_margin = min(self.cfg.max_margin, max(1.0, ranked[int(self.cfg.critical_quantile * top)]))

    @property
    def samples(self) -> int:
        return len(self._errors)
