"""Windowed latency percentiles from cumulative Prometheus histograms (pure; time is injected).

An engine's histogram buckets count every observation since it started, so a percentile of
the raw buckets describes the engine's whole life. The window keeps the per-scrape increments
(now - previous cumulative buckets) with their timestamps and sums those newer than
`window_s`: the percentiles then describe the last N seconds only.

Counter reset: when any bucket decreases, or the bucket bounds change, the engine restarted;
the increment is then the current cumulative values themselves (everything since the restart).

Percentile = Prometheus `histogram_quantile`: find the bucket holding rank q*count and
interpolate linearly between its lower and upper bound (lower bound 0 for the first bucket);
a rank inside the +Inf bucket returns the last finite bound.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from tidegate.engine_metrics import Buckets


@dataclass(frozen=True)
class LatencyWindow:
    p50_ms: float = 0.0
    p95_ms: float = 0.0
    p99_ms: float = 0.0
    count: float = 0.0


def is_reset(prev: Buckets, now: Buckets) -> bool:
    if [le for le, _ in prev] != [le for le, _ in now]:
        return True
    return any(c_now < c_prev for (_, c_prev), (_, c_now) in zip(prev, now, strict=True))


def delta(prev: Buckets | None, now: Buckets) -> Buckets:
    """Increment between two cumulative snapshots; the current values after a reset."""
    if not prev or is_reset(prev, now):
        return now
    return tuple((le, c_now - c_prev) for (le, c_prev), (_, c_now) in zip(prev, now, strict=True))


def add(a: Buckets, b: Buckets) -> Buckets:
    if not a:
        return b
    if not b:
        return a
    if [le for le, _ in a] != [le for le, _ in b]:
        # Bounds changed inside the window (engine restarted with other buckets): keep the newer.
        return b
    return tuple((le, ca + cb) for (le, ca), (_, cb) in zip(a, b, strict=True))


def total(buckets: Buckets) -> float:
    """Observation count: the largest bound's cumulative count (the +Inf bucket when present)."""
    return buckets[-1][1] if buckets else 0.0


def quantile(q: float, buckets: Buckets) -> float:
    """histogram_quantile(q) of cumulative buckets, in the buckets' unit; 0 when empty."""
    count = total(buckets)
    if count <= 0:
        return 0.0
    rank = q * count
    prev_le, prev_count = 0.0, 0.0
    last_finite = 0.0
    for le, cum in buckets:
        if math.isinf(le):
            return last_finite
        if cum >= rank:
            if cum == prev_count:
                return le
            lower = prev_le if le > 0 else le
            return lower + (le - lower) * (rank - prev_count) / (cum - prev_count)
        prev_le, prev_count, last_finite = le, cum, le
    return last_finite


def summarize(buckets: Buckets, scale: float = 1000.0) -> LatencyWindow:
    """p50/p95/p99 (seconds buckets -> ms by default) and count."""
    count = total(buckets)
    if count <= 0:
        return LatencyWindow()
    return LatencyWindow(
        p50_ms=quantile(0.50, buckets) * scale,
        p95_ms=quantile(0.95, buckets) * scale,
        p99_ms=quantile(0.99, buckets) * scale,
        count=count,
    )


class HistogramWindow:
    """Ring of per-scrape increments covering the last `window_s` seconds."""

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        self.window_s = window_s
        self._prev: Buckets | None = None
        self._increments: deque[tuple[float, Buckets]] = deque()

    def observe(self, t: float, cumulative: Buckets) -> None:
        """Record one scrape taken at time `t` (seconds, any monotonic origin)."""
        if not cumulative:
            return
        if self._prev is None:
            # The first scrape is only a baseline: its counts span the engine's whole life.
            self._prev = cumulative
            return
        self._increments.append((t, delta(self._prev, cumulative)))
        self._prev = cumulative
        self._prune(t)

    def _prune(self, now: float) -> None:
        while self._increments and self._increments[0][0] <= now - self.window_s:
            self._increments.popleft()

    def buckets(self, now: float) -> Buckets:
        self._prune(now)
        acc: Buckets = ()
        for _, inc in self._increments:
            acc = add(acc, inc)
        return acc

    def summary(self, now: float) -> LatencyWindow:
        return summarize(self.buckets(now))
