"""tidegate.policy.rates: per-replica engine rates fitted from EngineWork windows."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidegate.policy.rates import (
    GENERIC_PRIOR,
    EngineRates,
    RateEstimator,
    RateEstimatorConfig,
    WorkWindow,
    regressors,
    snap,
)
from tidegate.v1 import telemetry_pb2

CFG = RateEstimatorConfig()


def synthetic_window(rng: random.Random, truth: EngineRates, *, batch: float, prefill_per_step: float,
                     interval_s: float = 1.0, noise: float = 0.03, cached_frac: float = 0.2) -> WorkWindow:
    """One report window of an engine whose steps follow `truth` exactly, with measurement noise on
    the ITL sum (timer jitter, bucket-free but noisy)."""
    step_ms = truth.step_ms(batch, prefill_per_step)
    steps = max(1.0, round(interval_s * 1000.0 / step_ms))
    decode_tokens = steps * batch
    uncached = steps * prefill_per_step
    itl_sum = decode_tokens * step_ms / 1000.0 * (1.0 + rng.uniform(-noise, noise))
    return WorkWindow(interval_s=interval_s, steps=steps, step_tokens=decode_tokens + uncached,
                      prompt_tokens=uncached / (1 - cached_frac),
                      cached_prompt_tokens=uncached * cached_frac / (1 - cached_frac),
                      generation_tokens=decode_tokens, itl_sum_s=itl_sum, itl_count=decode_tokens)


# ------------------------------------------------------------------ regressors


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        pytest.param(WorkWindow(interval_s=1, steps=100, prompt_tokens=5000, cached_prompt_tokens=1000,
                                itl_sum_s=40.0, itl_count=4000),
                     (40.0, 10.0, 40.0), id="vllm-v1: steps counted"),
        pytest.param(WorkWindow(interval_s=1, steps=0, busy_s=0.5, prompt_tokens=1000,
                                itl_sum_s=5.0, itl_count=500),
                     (10.0, 10.0, 20.0), id="sglang: steps from busy time"),
        pytest.param(WorkWindow(interval_s=2, steps=0, prompt_tokens=0, itl_sum_s=4.0, itl_count=200),
                     (2.0, 20.0, 0.0), id="no step count, no busy time: the interval"),
        pytest.param(WorkWindow(interval_s=1, steps=50, prompt_tokens=1000, itl_sum_s=0.2, itl_count=20),
                     (1.0, 10.0, 8.0), id="steps without decodes: batch >= 1, decoding share of prefill"),
        pytest.param(WorkWindow(interval_s=1, steps=10, prompt_tokens=100, cached_prompt_tokens=300,
                                itl_sum_s=1.0, itl_count=100),
                     (10.0, 10.0, 0.0), id="more hits than prompt tokens: no uncached prefill"),
    ],
)
def test_regressors(window: WorkWindow, expected: tuple[float, float, float]) -> None:
    obs = regressors(window)
    assert obs is not None
    assert (obs.batch, obs.step_ms, obs.prefill) == pytest.approx(expected)
    assert obs.weight == window.itl_count


@pytest.mark.parametrize(
    "window",
    [
        pytest.param(WorkWindow(), id="empty (first scrape, restart)"),
        pytest.param(WorkWindow(interval_s=0, steps=10, itl_sum_s=1, itl_count=10), id="zero interval"),
        pytest.param(WorkWindow(interval_s=1, steps=10, itl_sum_s=0, itl_count=10), id="zero ITL sum"),
        pytest.param(WorkWindow(interval_s=1, steps=10, itl_sum_s=1, itl_count=0), id="no decode tokens"),
        pytest.param(WorkWindow(interval_s=1, steps=10, itl_sum_s=math.nan, itl_count=10), id="NaN"),
        pytest.param(WorkWindow(interval_s=1, steps=10, itl_sum_s=math.inf, itl_count=10), id="inf"),
        pytest.param(WorkWindow(interval_s=1, steps=-3, itl_sum_s=1, itl_count=10), id="negative steps"),
        pytest.param(WorkWindow(interval_s=1, steps=10, prompt_tokens=-5, itl_sum_s=1, itl_count=10),
                     id="negative tokens"),
        pytest.param(WorkWindow(interval_s=1, steps=1, itl_sum_s=1e6, itl_count=1), id="absurd step time"),
    ],
)
def test_garbage_windows_are_rejected(window: WorkWindow) -> None:
    assert regressors(window) is None
    est = RateEstimator()
    assert est.observe(window) is False
    assert (est.windows, est.rejected) == (0, 1)
    assert est.published == EngineRates()


def test_from_proto_round_trip() -> None:
    w = WorkWindow(interval_s=1, steps=2, step_tokens=3, prompt_tokens=4, cached_prompt_tokens=5,
                   generation_tokens=6, itl_sum_s=7, itl_count=8, busy_s=9)
    assert WorkWindow.from_proto(telemetry_pb2.EngineWork(**w.__dict__)) == w


# ------------------------------------------------------------------ the fit


TRUTHS = [
    pytest.param(EngineRates(47_600.0, 7.5, 0.072), id="8b-h100-like"),
    pytest.param(EngineRates(8_900.0, 29.0, 0.49), id="70b-tp4-like"),
    pytest.param(EngineRates(120_000.0, 3.0, 0.02), id="small-model"),
]


@pytest.mark.parametrize("truth", TRUTHS)
def test_converges_from_the_generic_prior(truth: EngineRates) -> None:
    rng = random.Random(1)
    est = RateEstimator()
    for _ in range(120):
        est.observe(synthetic_window(rng, truth, batch=rng.uniform(2, 200), prefill_per_step=rng.uniform(0, 600)))
    fit = est.estimate()
    assert fit.decode_step_base_ms == pytest.approx(truth.decode_step_base_ms, rel=0.10)
    assert fit.decode_step_per_seq_ms == pytest.approx(truth.decode_step_per_seq_ms, rel=0.10)
    assert fit.prefill_tokens_per_s == pytest.approx(truth.prefill_tokens_per_s, rel=0.10)
    pub = est.published
    assert pub.complete
    assert pub.prefill_tokens_per_s == pytest.approx(fit.prefill_tokens_per_s, rel=0.07)


@settings(max_examples=40, deadline=None)
@given(base=st.floats(1.0, 60.0), per_seq=st.floats(0.005, 1.0), rate=st.floats(2_000.0, 200_000.0),
       seed=st.integers(0, 2**16))
def test_property_converges_to_any_linear_step_model(base: float, per_seq: float, rate: float, seed: int) -> None:
    truth = EngineRates(rate, base, per_seq)
    rng = random.Random(seed)
    est = RateEstimator()
    for _ in range(200):
        est.observe(synthetic_window(rng, truth, batch=rng.uniform(1, 256), prefill_per_step=rng.uniform(0, 2000),
                                     noise=0.05))
    # What the router uses: predicted step times across the operating range, not each coefficient,
    # within 8 % or 2 % of the full-scale step (a 1 ms base under a 256 ms full batch is noise).
    fit = est.estimate()
    full_scale = truth.step_ms(256, 2000)
    for batch, prefill in ((1, 0), (16, 0), (128, 0), (64, 1024), (200, 2000)):
        want = truth.step_ms(batch, prefill)
        assert abs(fit.step_ms(batch, prefill) - want) <= 0.08 * want + 0.02 * full_scale


def test_a_fixed_batch_pins_the_prediction_there_and_the_prior_holds_the_rest() -> None:
    truth = EngineRates(47_600.0, 7.5, 0.072)
    rng = random.Random(2)
    est = RateEstimator()
    for _ in range(60):
        est.observe(synthetic_window(rng, truth, batch=40, prefill_per_step=0, noise=0.01))
    fit = est.estimate()
    assert fit.step_ms(40) == pytest.approx(truth.step_ms(40), rel=0.02)
    assert math.isfinite(fit.decode_step_base_ms) and fit.decode_step_per_seq_ms > 0


def test_tracks_a_slower_engine_after_a_change() -> None:
    rng = random.Random(3)
    fast, slow = EngineRates(40_000.0, 8.0, 0.08), EngineRates(20_000.0, 16.0, 0.16)
    est = RateEstimator()
    for truth in (fast, slow):
        for _ in range(900):
            est.observe(synthetic_window(rng, truth, batch=rng.uniform(4, 128), prefill_per_step=rng.uniform(0, 400)))
    assert est.estimate().step_ms(64, 200) == pytest.approx(slow.step_ms(64, 200), rel=0.05)


# ------------------------------------------------------------------ publishing


def test_nothing_is_published_before_enough_evidence() -> None:
    truth = EngineRates(47_600.0, 7.5, 0.072)
    rng = random.Random(4)
    est = RateEstimator()
    assert est.published == EngineRates()
    est.observe(synthetic_window(rng, truth, batch=1, prefill_per_step=0, interval_s=0.01))
    assert est.published == EngineRates()  # a handful of decode tokens: still unknown
    for _ in range(5):
        est.observe(synthetic_window(rng, truth, batch=30, prefill_per_step=0))
    pub = est.published
    assert pub.decode_step_base_ms > 0 and pub.decode_step_per_seq_ms > 0
    assert pub.prefill_tokens_per_s == 0  # no prefill seen yet
    est.observe(synthetic_window(rng, truth, batch=30, prefill_per_step=100))
    assert est.published.prefill_tokens_per_s > 0


def test_a_profile_prior_is_published_at_once_and_then_refined() -> None:
    prior = EngineRates(30_000.0, 9.0, 0.1)
    est = RateEstimator(prior=prior)
    assert est.published == EngineRates(snap(30_000.0, CFG.quantum), snap(9.0, CFG.quantum), snap(0.1, CFG.quantum))
    truth = EngineRates(47_600.0, 7.5, 0.072)
    rng = random.Random(5)
    for _ in range(100):
        est.observe(synthetic_window(rng, truth, batch=rng.uniform(2, 200), prefill_per_step=rng.uniform(0, 600)))
    assert est.published.prefill_tokens_per_s == pytest.approx(truth.prefill_tokens_per_s, rel=0.08)


def test_an_incomplete_prior_is_ignored() -> None:
    est = RateEstimator(prior=EngineRates(0.0, 9.0, 0.1))
    assert est.prior is None
    assert est.published == EngineRates()
    assert est.theta0 == (GENERIC_PRIOR.decode_step_base_ms, GENERIC_PRIOR.decode_step_per_seq_ms,
                          1000.0 / GENERIC_PRIOR.prefill_tokens_per_s)


def test_noise_does_not_move_published_values() -> None:
    truth = EngineRates(47_600.0, 7.5, 0.072)
    rng = random.Random(6)
    est = RateEstimator()
    for _ in range(200):
        est.observe(synthetic_window(rng, truth, batch=rng.uniform(2, 200), prefill_per_step=rng.uniform(0, 600)))
    seen = set()
    for _ in range(200):
        est.observe(synthetic_window(rng, truth, batch=rng.uniform(2, 200), prefill_per_step=rng.uniform(0, 600),
                                     noise=0.02))
        seen.add(est.published)
    assert len(seen) <= 2


@pytest.mark.parametrize(("value", "expected"), [(0.0, 0.0), (-1.0, 0.0), (math.nan, 0.0), (1.0, 1.0),
                                                  (1.04, 1.04), (1.05, 1.04), (47_619.0, 48_320.0)])
def test_snap_to_the_grid(value: float, expected: float) -> None:
    assert snap(value, 0.04) == pytest.approx(expected, rel=1e-3)


# ------------------------------------------------------------------ robustness


_ANY = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-1e3, 1e6))


@settings(max_examples=200, deadline=None)
@given(windows=st.lists(st.builds(WorkWindow, interval_s=_ANY, steps=_ANY, step_tokens=_ANY, prompt_tokens=_ANY,
                                  cached_prompt_tokens=_ANY, generation_tokens=_ANY, itl_sum_s=_ANY,
                                  itl_count=_ANY, busy_s=_ANY), max_size=30))
def test_property_bounded_under_garbage(windows: list[WorkWindow]) -> None:
    est = RateEstimator()
    for w in windows:
        est.observe(w)
    fit = est.estimate()
    lo, hi = CFG.base_ms_bounds
    assert lo <= fit.decode_step_base_ms <= hi
    lo, hi = CFG.per_seq_ms_bounds
    assert lo <= fit.decode_step_per_seq_ms <= hi
    lo, hi = CFG.prefill_tokens_per_s_bounds
    assert lo * 0.999 <= fit.prefill_tokens_per_s <= hi * 1.001
    for v in (est.published.prefill_tokens_per_s, est.published.decode_step_base_ms,
              est.published.decode_step_per_seq_ms):
        assert v == 0 or (math.isfinite(v) and v > 0)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_property_deterministic(seed: int) -> None:
    truth = EngineRates(47_600.0, 7.5, 0.072)

    def run() -> tuple[EngineRates, EngineRates]:
        rng = random.Random(seed)
        est = RateEstimator()
        for _ in range(30):
            est.observe(synthetic_window(rng, truth, batch=rng.uniform(1, 100), prefill_per_step=rng.uniform(0, 500)))
        return est.estimate(), est.published

    assert run() == run()


@pytest.mark.parametrize("bad", [
    {"half_life_s": 0}, {"prior_weight": -1}, {"quantum": math.nan}, {"base_ms_bounds": (5.0, 1.0)},
    {"per_seq_ms_bounds": (0.0, 1.0)},
])
def test_config_rejects_nonsense(bad: dict) -> None:
    with pytest.raises(ValueError):
        RateEstimatorConfig(**bad)
