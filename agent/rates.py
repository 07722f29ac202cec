"""Per-second rates from cumulative counters (pure; time is injected)."""

from __future__ import annotations


def counter_rate(prev: float | None, now: float | None, dt_s: float) -> float:
    """(now - prev) / dt; 0 without a previous value, a positive interval or after a reset.

    A decrease means the engine restarted; the counts since the restart span an unknown
    interval, so the rate is reported as 0 for that one tick rather than guessed.
    """
    if prev is None or now is None or dt_s <= 0 or now < prev:
        return 0.0
    return (now - prev) / dt_s
