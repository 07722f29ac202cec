# ruff: noqa: E501  (metric fixture lines are copied whole from real engines)
"""The rate estimator's signals: tidegate.engine_metrics reads them per engine dialect, agent.rates turns
two scrapes into one EngineWork window."""

from __future__ import annotations

import math

import pytest

from tidegate.agent.rates import work_deltas
from tidegate.engine_metrics import EngineSample, parse_metrics

VLLM_V1 = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 7.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 12000.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 345.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 4000.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 0.0
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 4000.0
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 53000.0
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="m"} 10.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="m"} 900.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 900.0
vllm:iteration_tokens_total_sum{engine="1",model_name="m"} 1000.0
vllm:iteration_tokens_total_bucket{engine="1",le="1.0",model_name="m"} 0.0
vllm:iteration_tokens_total_bucket{engine="1",le="+Inf",model_name="m"} 100.0
vllm:iteration_tokens_total_count{engine="1",model_name="m"} 100.0
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 30.5
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="m"} 2000.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2500.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 2500.0
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_sum{engine="0",model_name="m"} 99.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 99.0
vllm:time_per_output_token_seconds_count{engine="0",model_name="m"} 99.0
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 6.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="0.3",model_name="m"} 15.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 20.0
vllm:request_prefill_time_seconds_count{engine="0",model_name="m"} 20.0
vllm:request_prefill_time_seconds_sum{engine="1",model_name="m"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="1",le="0.3",model_name="m"} 4.0
vllm:request_prefill_time_seconds_bucket{engine="1",le="+Inf",model_name="m"} 5.0
vllm:request_prefill_time_seconds_count{engine="1",model_name="m"} 5.0
"""

# V0: iteration histogram and TPOT; a hit-rate gauge but no hit counter.
VLLM_V0 = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 2.0
vllm:prompt_tokens_total{model_name="m"} 100.0
# TYPE vllm:gpu_prefix_cache_hit_rate gauge
vllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.5
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{le="+Inf",model_name="m"} 40.0
vllm:iteration_tokens_total_count{model_name="m"} 40.0
vllm:iteration_tokens_total_sum{model_name="m"} 640.0
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 3.0
vllm:time_per_output_token_seconds_count{model_name="m"} 3.0
vllm:time_per_output_token_seconds_sum{model_name="m"} 0.1
"""

# Recent SGLang: cached tokens by source, GPU busy seconds by category; no step counter.
SGLANG = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 11.0
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m"} 9000.0
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{cache_source="device",model_name="m"} 3000.0
sglang:cached_tokens_total{cache_source="host",model_name="m"} 500.0
# TYPE sglang:gpu_execution_seconds_total counter
sglang:gpu_execution_seconds_total{category="forward",model_name="m"} 12.5
sglang:gpu_execution_seconds_total{category="prefill",model_name="m"} 2.5
# TYPE sglang:inter_token_latency_seconds histogram
sglang:inter_token_latency_seconds_sum{model_name="m"} 4.0
sglang:inter_token_latency_seconds_bucket{le="0.01",model_name="m"} 300.0
sglang:inter_token_latency_seconds_bucket{le="+Inf",model_name="m"} 400.0
sglang:inter_token_latency_seconds_count{model_name="m"} 400.0
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(VLLM_V1, {"steps_total": 1000.0, "step_tokens_total": 54000.0, "itl_sum_s": 30.5,
                               "itl_count": 2500.0, "prompt_tokens_total": 12345.0,
                               "prefix_cache_hits_total": 4000.0, "busy_seconds_total": None,
                               "prefill_time_sum_s": 7.0, "prefill_time_count": 25.0},
                     id="vllm-v1: data-parallel engines summed, ITL not TPOT, hits not the deprecated name"),
        pytest.param(VLLM_V0, {"steps_total": 40.0, "step_tokens_total": 640.0, "itl_sum_s": 0.1,
                               "itl_count": 3.0, "prefix_cache_hits_total": None, "busy_seconds_total": None},
                     id="vllm-v0: TPOT histogram, no hit counter"),
        pytest.param(SGLANG, {"steps_total": None, "step_tokens_total": None, "itl_sum_s": 4.0,
                              "itl_count": 400.0, "prefix_cache_hits_total": 3500.0, "busy_seconds_total": 15.0,
                              "prefill_time_sum_s": None, "prefill_time_count": None},
                     id="sglang: cache sources and busy categories summed"),
    ],
)
def test_rate_signals_per_dialect(text: str, expected: dict[str, float | None]) -> None:
    s = parse_metrics(text)
    assert {k: getattr(s, k) for k in expected} == expected


def test_deprecated_hit_counter_is_a_fallback() -> None:
    text = VLLM_V1.replace("vllm:prefix_cache_hits_total", "vllm:old_name")
    assert parse_metrics(text).prefix_cache_hits_total == 4000.0


def _sample(**kw: float) -> EngineSample:
    return EngineSample(engine="vllm", **kw)  # type: ignore[arg-type]


def test_work_is_the_difference_of_two_scrapes() -> None:
    a = _sample(steps_total=100, step_tokens_total=5000, prompt_tokens_total=4000, prefix_cache_hits_total=1000,
                generation_tokens_total=900, itl_sum_s=10.0, itl_count=800, prefill_time_sum_s=3.0,
                prefill_time_count=20)
    b = _sample(steps_total=160, step_tokens_total=9000, prompt_tokens_total=7000, prefix_cache_hits_total=1500,
                generation_tokens_total=1900, itl_sum_s=12.5, itl_count=1750, prefill_time_sum_s=4.5,
                prefill_time_count=25)
    assert work_deltas(a, b, 0.5) == {
        "interval_s": 0.5, "steps": 60, "step_tokens": 4000, "prompt_tokens": 3000, "cached_prompt_tokens": 500,
        "generation_tokens": 1000, "itl_sum_s": 2.5, "itl_count": 950, "prefill_time_sum_s": 1.5,
        "prefill_time_count": 5}


@pytest.mark.parametrize(
    ("prev", "now", "dt"),
    [
        pytest.param(_sample(itl_count=10), _sample(itl_count=5), 1.0, id="counter went down: restart"),
        pytest.param(_sample(itl_count=1), _sample(itl_count=5), 0.0, id="no interval"),
        pytest.param(_sample(itl_count=1), _sample(itl_count=5), -1.0, id="clock went back"),
        pytest.param(_sample(itl_count=1), _sample(itl_count=5), math.nan, id="NaN interval"),
    ],
)
def test_no_work_without_a_trustworthy_interval(prev: EngineSample, now: EngineSample, dt: float) -> None:
    assert work_deltas(prev, now, dt) == {}


def test_missing_or_garbage_values_are_left_out() -> None:
    a = _sample(itl_count=1, itl_sum_s=math.inf, steps_total=None)
    b = _sample(itl_count=5, itl_sum_s=2.0, steps_total=10)
    assert work_deltas(a, b, 1.0) == {"interval_s": 1.0, "itl_count": 4}
