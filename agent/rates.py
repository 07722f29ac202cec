"""Per-second rates from cumulative counters (pure; time is injected)."""

from __future__ import annotations

import math

from tidegate.engine_metrics import EngineSample


def counter_rate(prev: float | None, now: float | None, dt_s: float) -> float:
    """(now - prev) / dt; 0 without a previous value, a positive interval or after a reset.

    A decrease means the engine restarted; the counts since the restart span an unknown
    interval, so the rate is reported as 0 for that one tick rather than guessed.
    """
    if prev is None or now is None or dt_s <= 0 or now < prev:
        return 0.0
    return (now - prev) / dt_s


# EngineSample field -> EngineWork field, for every cumulative value the rate estimator reads.
_WORK_FIELDS = (
    ("steps_total", "steps"),
    ("step_tokens_total", "step_tokens"),
    ("prompt_tokens_total", "prompt_tokens"),
    ("prefix_cache_hits_total", "cached_prompt_tokens"),
    ("generation_tokens_total", "generation_tokens"),
    ("itl_sum_s", "itl_sum_s"),
    ("itl_count", "itl_count"),
    ("busy_seconds_total", "busy_s"),
    ("prefill_time_sum_s", "prefill_time_sum_s"),
    ("prefill_time_count", "prefill_time_count"),
    ("finished_total", "finished_requests"),
)


def work_deltas(prev: EngineSample, now: EngineSample, dt_s: float) -> dict[str, float]:
    """EngineWork fields between two scrapes `dt_s` apart: each cumulative value's increase, 0 where
    either scrape lacks it. Empty (all unknown) without a positive interval or when any value went
    down: the engine restarted, and its counts since then span an unknown interval."""
    if not (dt_s > 0 and math.isfinite(dt_s)):
        return {}
    out = {"interval_s": dt_s}
    for src, dst in _WORK_FIELDS:
        a, b = getattr(prev, src), getattr(now, src)
        if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
            continue
        if b < a:
            return {}
        out[dst] = b - a
    return out
