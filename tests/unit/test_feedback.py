"""SLO feedback controller (tidegate.policy.feedback): tables, bounds, convergence, step response."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidegate.policy.feedback import FeedbackConfig, FeedbackSample, FeedbackState, describe, ratio, step

CFG = FeedbackConfig(deadband_low=0.7, decrease=0.8, increase=0.05, min_multiplier=0.2, hysteresis=2,
                     min_samples=5)


def sample(ttft: float = 0.0, itl: float = 0.0, n: float = 100, ttft_t: float = 1000, tpot_t: float = 100
           ) -> FeedbackSample:
    return FeedbackSample(ttft, itl, n, ttft_t, tpot_t)


def run(samples: list[FeedbackSample], state: FeedbackState | None = None) -> list[float]:
    s = state or FeedbackState()
    out = []
    for x in samples:
        s = step(s, x, CFG)
        out.append(round(s.multiplier, 6))
    return out


CASES = [
    # id, samples, multipliers after each
    ("in-deadband-holds", [sample(800, 80)] * 3, [1.0, 1.0, 1.0]),
    ("over-acts-after-hysteresis", [sample(1500)] * 4, [1.0, 0.8, 0.8, 0.64]),
    ("itl-over-counts", [sample(500, 150)] * 2, [1.0, 0.8]),
    ("single-spike-ignored", [sample(1500), sample(800), sample(1500), sample(800)], [1.0] * 4),
    ("under-at-one-stays", [sample(100, 10)] * 3, [1.0] * 3),
    ("too-few-samples-ignored", [sample(5000, n=2)] * 4, [1.0] * 4),
    ("no-target-ignored", [sample(5000, 500, ttft_t=0, tpot_t=0)] * 4, [1.0] * 4),
    ("floor", [sample(90000)] * 40, [1.0] + [0.8, 0.8, 0.64, 0.64, 0.512, 0.512, 0.4096, 0.4096, 0.32768, 0.32768,
                                             0.262144, 0.262144, 0.209715, 0.209715] + [0.2] * 25),
]


@pytest.mark.parametrize("samples,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_table(samples: list[FeedbackSample], expected: list[float]) -> None:
    assert run(samples) == expected


def test_recovers_additively_from_low() -> None:
    assert run([sample(100)] * 4, FeedbackState(multiplier=0.5)) == [0.5, 0.55, 0.55, 0.6]


def test_ratio_takes_the_worse_and_ignores_garbage() -> None:
    assert ratio(sample(500, 150)) == pytest.approx(1.5)
    assert ratio(sample(math.nan, 50)) == pytest.approx(0.5)
    assert ratio(sample(-1, -1)) is None
    assert ratio(sample(math.inf, 0)) is None
    assert ratio(sample(1e300, 0)) == 100.0


def test_describe() -> None:
    assert describe(FeedbackState()) == ""
    assert "x0.50" in describe(FeedbackState(multiplier=0.5, ratio=1.3))


def test_disabled_is_neutral() -> None:
    off = FeedbackConfig(enabled=False)
    assert step(FeedbackState(multiplier=0.3), sample(9000), off).multiplier == 1.0


@pytest.mark.parametrize("kw", [dict(decrease=0.5, deadband_low=0.7), dict(min_multiplier=0), dict(hysteresis=0),
                                dict(increase=0), dict(decrease=1.0)])
def test_config_rejects(kw: dict) -> None:
    with pytest.raises(ValueError):
        FeedbackConfig(**kw)


garbage = st.floats(allow_nan=True, allow_infinity=True)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(garbage, garbage, garbage, garbage, garbage), max_size=60),
       st.floats(allow_nan=True, allow_infinity=True))
def test_bounded_under_garbage(xs: list[tuple[float, ...]], m0: float) -> None:
    s = FeedbackState(multiplier=m0)
    for t in xs:
        s = step(s, FeedbackSample(*t), CFG)
        assert CFG.min_multiplier <= s.multiplier <= 1.0
        assert math.isfinite(s.multiplier)


@settings(max_examples=200, deadline=None)
@given(st.floats(0.01, 50), st.floats(0.2, 1.0))
def test_constant_measurements_move_monotonically(r: float, m0: float) -> None:
    """Constant input: the multiplier never changes direction (no oscillation)."""
    s = FeedbackState(multiplier=m0)
    ms = [s.multiplier]
    for _ in range(200):
        s = step(s, sample(1000 * r), CFG)
        ms.append(s.multiplier)
    diffs = [b - a for a, b in zip(ms, ms[1:], strict=False) if b != a]
    assert all(d > 0 for d in diffs) or all(d < 0 for d in diffs)


def plant(load: float, m: float, share_weight: float = 1.0) -> float:
    """A replica whose p95 TTFT grows linearly with its share of the load (the documented
    worst case for the deadband argument): share = m / (m + others)."""
    share = m * share_weight / (m * share_weight + 3.0)   # three peers at 1.0
    return 1000 * load * share * 4


@settings(max_examples=200, deadline=None)
@given(st.floats(0.3, 6.0))
def test_closed_loop_settles_without_oscillation(load: float) -> None:
    """Constant load through a plant: after settling, the multiplier stops moving (at a bound or
    inside the deadband); it changes direction at most once."""
    s = FeedbackState()
    ms = []
    for _ in range(300):
        s = step(s, sample(plant(load, s.multiplier)), CFG)
        ms.append(s.multiplier)
    tail = ms[-50:]
    assert max(tail) - min(tail) == 0
    moves = [b - a for a, b in zip(ms, ms[1:], strict=False) if b != a]
    turns = sum(1 for a, b in zip(moves, moves[1:], strict=False) if (a > 0) != (b > 0))
    assert turns <= 1
    r = plant(load, tail[-1]) / 1000
    assert r <= 1.0 or tail[-1] == CFG.min_multiplier
    assert r >= CFG.deadband_low or tail[-1] == 1.0 or turns == 1


def test_step_change_reacts_within_a_few_ticks() -> None:
    """Steady at load 0.8 (in band), then the load doubles: the multiplier drops within
    hysteresis ticks and latency is back under target within a few more."""
    s = FeedbackState()
    for _ in range(20):
        s = step(s, sample(plant(0.8, s.multiplier)), CFG)
    assert s.multiplier == 1.0
    history = []
    for _ in range(20):
        s = step(s, sample(plant(1.6, s.multiplier)), CFG)
        history.append((s.multiplier, plant(1.6, s.multiplier) / 1000))
    first_drop = next(i for i, (m, _) in enumerate(history) if m < 1.0)
    assert first_drop < CFG.hysteresis
    back = next(i for i, (_, r) in enumerate(history) if r <= 1.0)
    assert back <= 6
