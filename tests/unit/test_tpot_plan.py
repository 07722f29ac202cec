"""The TPOT planning margin (tidegate/policy/tpot_plan.py) and how the pick plans with it."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidegate.policy import registry
from tidegate.policy.registry import PoolSnapshot, RequestFeatures, RouteInfo, SloTargets
from tidegate.policy.slo_pick import TidegatePolicy
from tidegate.policy.tpot_plan import TpotPlan, TpotPlanConfig

SMALL = TpotPlanConfig(window=100, min_samples=10, refresh=1)


def fed(errors: list[float], cfg: TpotPlanConfig = SMALL, planned: float = 0.05) -> TpotPlan:
    plan = TpotPlan(cfg)
    for e in errors:
        plan.observe(e * planned, planned)
    return plan


@pytest.mark.parametrize(
    ("errors", "margin"),
    [
        pytest.param([], 1.0, id="nothing yet: no margin"),
        pytest.param([1.5] * 9, 1.0, id="under min_samples: no margin"),
        pytest.param([0.5] * 100, 1.0, id="every plan met with room: floored at 1"),
        pytest.param([1.0] * 98 + [1.2] * 2, 1.2, id="2 % of plans missed by 20 %: q0.99 is 1.2"),
        pytest.param([1.0] * 99 + [1.5], 1.0, id="1 % missed: within the quantile"),
        pytest.param([3.0] * 100, 2.0, id="capped at max_margin"),
        pytest.param([9.0] * 100 + [0.9] * 100, 1.0, id="only the latest window counts"),
    ],
)
def test_margin_is_the_quantile_of_realized_over_planned(errors: list[float], margin: float) -> None:
    assert fed(errors).margin == pytest.approx(margin)


@pytest.mark.parametrize(("realized", "planned"), [
    (math.nan, 0.05), (math.inf, 0.05), (-0.01, 0.05), (0.05, 0.0), (0.05, -1.0), (0.05, math.nan),
])
def test_garbage_observations_are_ignored(realized: float, planned: float) -> None:
    plan = TpotPlan(SMALL)
    plan.observe(realized, planned)
    assert plan.samples == 0 and plan.margin == 1.0


def test_refreshed_every_refresh_observations_not_per_one() -> None:
    plan = TpotPlan(TpotPlanConfig(window=100, min_samples=10, refresh=10))
    for _ in range(10):
        plan.observe(0.08, 0.05)
    assert plan.margin == pytest.approx(1.6)
    for _ in range(9):
        plan.observe(0.01, 0.05)
    assert plan.margin == pytest.approx(1.6)  # not yet refreshed
    plan.observe(0.01, 0.05)
    assert plan.margin == pytest.approx(1.6)  # 10 of 20 still at 1.6: q0.99 is 1.6


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.0, 10.0), min_size=1, max_size=300), st.floats(0.5, 1.0))
def test_property_margin_bounded_and_fixed_point(errors: list[float], q: float) -> None:
    """Always within [1, max_margin]; and measured against the plan it set: if realized TPOTs
    run k times their plan, the margin is k whatever the plan's own margin was."""
    cfg = TpotPlanConfig(quantile=q, window=300, min_samples=1, refresh=1)
    plan = fed(errors, cfg)
    assert 1.0 <= plan.margin <= cfg.max_margin
    k = 1.3
    a, b = fed([k] * 50, cfg, planned=0.1), fed([k] * 50, cfg, planned=0.1 / 1.7)
    assert a.margin == b.margin == pytest.approx(k)


@pytest.mark.parametrize("bad", [
    {"quantile": 0.0}, {"quantile": 1.5}, {"window": 0}, {"min_samples": 0}, {"min_samples": 5, "window": 4},
    {"refresh": 0}, {"max_margin": 0.9}, {"max_margin": math.inf},
])
def test_config_rejects_nonsense(bad: dict) -> None:
    with pytest.raises(ValueError):
        TpotPlanConfig(**bad)


# ------------------------------------------------------------------ the pick plans with it

ENTRY = RouteInfo("r0", 1.0, endpoint="http://r0", prefill_tokens_per_s=10_000.0, decode_step_base_ms=20.0,
                  decode_step_per_seq_ms=0.5)
SLO = SloTargets(ttft_s=2.0, tpot_s=0.1)


def _policy_with_margin(errors: list[float], cfg: TpotPlanConfig = SMALL) -> tuple[TidegatePolicy, RequestFeatures]:
    policy = TidegatePolicy(SLO, tpot_plan=cfg)
    snap = PoolSnapshot((ENTRY,), {}, frozenset(), slo=SLO)
    for i, e in enumerate(errors):
        req = RequestFeatures(prompt_tokens=500, max_tokens=50, req_id=f"q{i}")
        planned = SLO.tpot_s / policy.tpot_margin
        assert policy.pick(snap, req, random.Random(0)) is not None
        policy.on_dispatch(req, "r0")
        policy.on_first_token(req, "r0")
        policy.on_tpot(req, "r0", e * planned)  # e times what it was planned to
        policy.on_complete(req, "r0")
    return policy, RequestFeatures(prompt_tokens=500, max_tokens=50, req_id="new")


def test_the_prefill_budget_shrinks_with_the_margin() -> None:
    snap = PoolSnapshot((ENTRY,), {}, frozenset(), slo=SLO)
    plain, req = _policy_with_margin([])
    tight, _ = _policy_with_margin([1.25] * 20)
    assert plain.tpot_margin == 1.0 and tight.tpot_margin == pytest.approx(1.25)
    b_plain = plain.predictions(snap, req)[0].prefill_budget
    b_tight = tight.predictions(snap, req)[0].prefill_budget
    step = (20.0 + 0.5) / 1000.0   # one sequence decoding: the request itself
    assert b_plain == pytest.approx((0.1 - step) * 10_000.0)
    assert b_tight == pytest.approx((0.1 / 1.25 - step) * 10_000.0)


def test_a_request_the_policy_did_not_place_teaches_nothing() -> None:
    policy = TidegatePolicy(SLO, tpot_plan=SMALL)
    for i in range(20):
        policy.on_tpot(RequestFeatures(prompt_tokens=10, req_id=f"x{i}"), "r0", 1.0)
    assert policy.tpot_margin == 1.0


def test_critical_requests_plan_with_the_stricter_quantile() -> None:
    """One window of errors, two quantiles: critical requests (priority >= 1) plan with the margin
    at `critical_quantile`, the others at `quantile`; both floored at 1 and capped."""
    plan = TpotPlan(TpotPlanConfig(quantile=0.9, critical_quantile=0.99, window=100, min_samples=10, refresh=1))
    for e in [1.0] * 90 + [1.2] * 9 + [1.5]:
        plan.observe(e * 0.05, 0.05)
    assert plan.margin == pytest.approx(1.0)
    assert plan.critical_margin == pytest.approx(1.2)
    assert plan.margin_for(0) == plan.margin and plan.margin_for(-1) == plan.margin
    assert plan.margin_for(1) == plan.critical_margin
    with pytest.raises(ValueError):
        TpotPlanConfig(critical_quantile=0.0)


def test_a_critical_request_is_planned_to_the_stricter_margin() -> None:
    """The same window of errors; a critical request's prefill budget is planned to the target
    over the critical margin, a standard one's over the plain margin."""
    snap = PoolSnapshot((ENTRY,), {}, frozenset(), slo=SLO)
    cfg = TpotPlanConfig(quantile=0.9, critical_quantile=0.99, window=100, min_samples=10, refresh=1)
    policy, _ = _policy_with_margin([1.0] * 18 + [1.4] * 2, cfg)
    plan = policy._tpot_plan
    assert plan.critical_margin > plan.margin >= 1.0
    step = (20.0 + 0.5) / 1000.0
    for priority, margin in ((0, plan.margin), (-1, plan.margin), (1, plan.critical_margin)):
        req = RequestFeatures(prompt_tokens=500, max_tokens=50, req_id=f"p{priority}", priority=priority)
        budget = policy.predictions(snap, req)[0].prefill_budget
        assert budget == pytest.approx((0.1 / margin - step) * 10_000.0), priority


def test_an_enforced_plan_starts_at_the_cap_until_its_error_is_measured() -> None:
    plan = TpotPlan(SMALL)
    assert (plan.margin, plan.critical_margin) == (1.0, 1.0)   # nobody enforces it: no margin
    plan.enforce()
    assert (plan.margin, plan.critical_margin) == (SMALL.max_margin, SMALL.max_margin)
    for _ in range(SMALL.min_samples - 1):
        plan.observe(0.055, 0.05)
    assert plan.margin == SMALL.max_margin                     # not measured yet
    plan.observe(0.055, 0.05)
    assert plan.margin == pytest.approx(1.1) and plan.critical_margin == pytest.approx(1.1)
    plan.enforce()                                             # once measured, the data decide
    assert plan.margin == pytest.approx(1.1)


def test_the_policy_plans_to_the_cap_only_where_its_router_enforces_the_plan() -> None:
    plain, enforced = TidegatePolicy(), TidegatePolicy()
    registry.enforce_tpot_plan(enforced)
    registry.enforce_tpot_plan(object())                       # a policy without a plan: ignored
    assert plain.tpot_margin == 1.0
    assert enforced.tpot_margin == TpotPlanConfig().max_margin


def test_an_enforced_plan_that_is_never_measured_stops_at_the_cap_after_min_samples_requests() -> None:
    # A live router measures TPOT only on streamed answers with usage: without them, the cap must
    # not stand for good.
    plan = TpotPlan(SMALL)
    plan.enforce()
    for _ in range(SMALL.min_samples - 1):
        plan.completed()
    assert plan.margin == SMALL.max_margin
    plan.completed()
    assert (plan.margin, plan.critical_margin) == (1.0, 1.0)
    plan.enforce()                                             # a later enforce changes nothing
    assert plan.margin == 1.0
    for _ in range(SMALL.min_samples):
        plan.observe(0.06, 0.05)
    assert plan.margin == pytest.approx(1.2)                   # measured: the data decide


@pytest.mark.parametrize(
    ("whole", "early", "margin", "critical"),
    [
        pytest.param([1.0] * 100, [None] * 100, 1.0, 1.0, id="no early TPOT timed: the whole one stands in"),
        pytest.param([1.0] * 100, [1.0] * 90 + [1.5] * 10, 1.0, 1.5,
                     id="short answers' stalls show early: critical plans on them, the rest do not"),
        pytest.param([1.0] * 95 + [1.3] * 5, [0.8] * 100, 1.3, 1.0,
                     id="the whole answers' misses set the plain margin, not the critical one"),
        pytest.param([1.0] * 100, [math.nan] * 50 + [1.4] * 50, 1.0, 1.4, id="a garbage early TPOT: the whole one"),
        pytest.param([1.0] * 100, [5.0] * 100, 1.0, 2.0, id="critical capped at max_margin too"),
    ],
)
def test_critical_requests_plan_on_the_early_tpot(whole: list[float], early: list[float | None], margin: float,
                                                   critical: float) -> None:
    plan = TpotPlan(SMALL)
    planned = 0.05
    for w, e in zip(whole, early, strict=True):
        plan.observe(w * planned, planned, None if e is None else e * planned)
    assert plan.margin == pytest.approx(margin)
    # a garbage early ratio counts as its whole answer's (1.0 here): q0.99 of 50 x 1.0 and 50 x 1.4
    assert plan.critical_margin == pytest.approx(critical)


def test_the_policy_passes_the_early_tpot_to_its_plan() -> None:
    # Not enforced: no startup cap, so every request (standard: margin 1 throughout) is planned to 50 ms.
    policy = TidegatePolicy(SloTargets(ttft_s=2.0, tpot_s=0.05))
    snap = PoolSnapshot((ENTRY,), {}, frozenset(), slo=SloTargets(ttft_s=2.0, tpot_s=0.05))
    for i in range(64):
        req = RequestFeatures(prompt_tokens=100, max_tokens=50, req_id=f"r{i}")
        pick = policy.pick(snap, req, random.Random(0))
        assert pick is not None
        policy.on_dispatch(req, pick.replica_id)
        registry.notify_tpot(policy, req, pick.replica_id, 0.04, 0.09)   # early 1.8x the plan, whole 0.8x
        policy.on_complete(req, pick.replica_id)
    assert policy._tpot_plan.margin == pytest.approx(1.0)
    assert policy._tpot_plan.critical_margin == pytest.approx(1.8)
