"""router/metrics.py's lock-free per-request series expose exactly what prometheus_client's own
Counter and Histogram expose for the same observations (less the `_created` series)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from tidegate.router.metrics import HotCounter, HotHistogram

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


def exposition(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


@pytest.mark.parametrize("values", [
    [],
    [0.0],
    [0.005, 0.01, 1, 120],           # on the bounds: le counts them in their own bucket
    [0.0051, 0.7, 3.3, 121, 1e9],     # between bounds and past the last
    [0.2] * 7 + [2.6] * 3,
])
def test_hot_histogram_matches_prometheus_client(values):
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    hot = HotHistogram("x_seconds", "doc", ["model"], BUCKETS)
    ours.register(hot)
    ref = Histogram("x_seconds", "doc", ["model"], buckets=BUCKETS, registry=theirs)
    for v in values:
        hot.labels("m").observe(v)
        ref.labels("m").observe(v)
        hot.labels("n").observe(v / 2)
        ref.labels("n").observe(v / 2)
    if not values:  # a child that exists with nothing observed
        hot.labels("m")
        ref.labels("m")
    assert exposition(ours) == exposition(theirs)


def test_hot_counter_matches_prometheus_client():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    hot = HotCounter("y", "doc", ["model", "status"])
    ours.register(hot)
    ref = Counter("y", "doc", ["model", "status"], registry=theirs)
    for labels, n in [(("m", "200"), 3), (("m", "429"), 1), (("a", "200"), 2)]:
        for _ in range(n):
            hot.labels(*labels).inc()
            ref.labels(*labels).inc()
    hot.labels("z", "500")
    ref.labels("z", "500")
    assert exposition(ours) == exposition(theirs)
    assert ours.get_sample_value("y_total", {"model": "m", "status": "200"}) == 3
