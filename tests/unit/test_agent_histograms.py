"""agent.histograms: windowed percentiles from cumulative bucket deltas; agent.rates."""

from __future__ import annotations

import math

import pytest

from tidegate.agent.histograms import HistogramWindow, LatencyWindow, delta, quantile, summarize
from tidegate.agent.rates import counter_rate

INF = math.inf


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        # 10 observations: 4 in (0, 0.1], 5 in (0.1, 0.5], 1 above 0.5.
        (0.5, ((0.1, 4.0), (0.5, 9.0), (INF, 10.0)), 0.1 + 0.4 * (5 - 4) / 5),
        (0.2, ((0.1, 4.0), (0.5, 9.0), (INF, 10.0)), 0.1 * 2 / 4),
        (0.9, ((0.1, 4.0), (0.5, 9.0), (INF, 10.0)), 0.5),
        # rank falls in +Inf: the last finite bound.
        (0.99, ((0.1, 4.0), (0.5, 9.0), (INF, 10.0)), 0.5),
        # every observation above the last finite bound.
        (0.5, ((0.1, 0.0), (0.5, 0.0), (INF, 3.0)), 0.5),
        # empty buckets.
        (0.5, ((0.1, 0.0), (INF, 0.0)), 0.0),
        (0.5, (), 0.0),
        # rank on an exact bucket boundary.
        (0.5, ((1.0, 5.0), (2.0, 10.0), (INF, 10.0)), 1.0),
    ],
    ids=["p50-interp", "p20-first-bucket", "p90-edge", "p99-inf", "all-inf", "zero", "none", "boundary"],
)
def test_quantile(q: float, buckets: tuple[tuple[float, float], ...], expected: float) -> None:
    assert quantile(q, buckets) == pytest.approx(expected)


def test_summarize_in_ms_and_zero_count() -> None:
    w = summarize(((0.1, 4.0), (0.5, 9.0), (INF, 10.0)))
    assert w.p50_ms == pytest.approx(180.0)
    assert w.p95_ms == pytest.approx(500.0)
    assert w.count == 10.0
    assert summarize(((0.1, 0.0), (INF, 0.0))) == LatencyWindow(0.0, 0.0, 0.0, 0.0)


def test_delta_normal_and_reset() -> None:
    prev = ((0.1, 4.0), (INF, 10.0))
    assert delta(prev, ((0.1, 6.0), (INF, 15.0))) == ((0.1, 2.0), (INF, 5.0))
    # one bucket went down: engine restarted, the current values are the increment.
    assert delta(prev, ((0.1, 1.0), (INF, 12.0))) == ((0.1, 1.0), (INF, 12.0))
    # bucket layout changed: also a restart.
    assert delta(prev, ((0.2, 1.0), (INF, 1.0))) == ((0.2, 1.0), (INF, 1.0))
    assert delta(None, prev) == prev


def _b(fast: float, total: float) -> tuple[tuple[float, float], ...]:
    return ((0.1, fast), (1.0, total), (INF, total))


def test_window_first_scrape_is_baseline_only() -> None:
    w = HistogramWindow(window_s=10)
    w.observe(0.0, _b(1000, 2000))  # lifetime counts: not part of any window
    assert w.summary(0.0).count == 0
    w.observe(1.0, _b(1000, 2010))  # 10 slow observations in the last second
    s = w.summary(1.0)
    assert s.count == 10
    assert 100.0 < s.p50_ms <= 1000.0


def test_window_expires_old_increments() -> None:
    w = HistogramWindow(window_s=10)
    w.observe(0.0, _b(0, 0))
    w.observe(1.0, _b(0, 10))     # 10 slow at t=1
    w.observe(5.0, _b(20, 30))    # 20 fast at t=5
    assert w.summary(5.0).count == 30
    # at t=11.5 the t=1 increment is older than 10 s and drops out: only the fast ones remain.
    s = w.summary(11.5)
    assert s.count == 20
    assert s.p99_ms <= 100.0
    assert w.summary(100.0) == LatencyWindow()


def test_window_counter_reset_restarts_from_current() -> None:
    w = HistogramWindow(window_s=60)
    w.observe(0.0, _b(0, 100))
    w.observe(1.0, _b(0, 110))    # +10 slow
    w.observe(2.0, _b(3, 3))      # engine restarted: 3 fast since
    s = w.summary(2.0)
    assert s.count == 13          # 10 before the restart + 3 after, never negative
    w.observe(3.0, _b(5, 5))      # +2 fast after the restart
    assert w.summary(3.0).count == 15


def test_window_ignores_empty_scrapes_and_rejects_bad_window() -> None:
    w = HistogramWindow(window_s=5)
    w.observe(0.0, ())
    w.observe(1.0, _b(1, 1))
    assert w.summary(1.0).count == 0  # first non-empty scrape is the baseline
    with pytest.raises(ValueError):
        HistogramWindow(window_s=0)


@pytest.mark.parametrize(
    ("prev", "now", "dt", "expected"),
    [(100.0, 150.0, 2.0, 25.0), (None, 150.0, 2.0, 0.0), (150.0, 10.0, 1.0, 0.0),
     (1.0, 2.0, 0.0, 0.0), (1.0, None, 1.0, 0.0)],
    ids=["rate", "no-prev", "reset", "zero-dt", "missing"],
)
def test_counter_rate(prev: float | None, now: float | None, dt: float, expected: float) -> None:
    assert counter_rate(prev, now, dt) == expected
