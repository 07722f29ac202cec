# ruff: noqa: E501  (metric fixture lines are copied whole from real engines)
"""tidegate.engine_metrics: engine metric text -> EngineSample, per engine dialect."""

from __future__ import annotations

import math

import pytest

from tidegate.engine_metrics import EngineSample, TelemetryParseError, parse_metrics
from tidegate.errors import TidegateError

VLLM_V1 = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama-8b"} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama-8b"} 3.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama-8b"} 0.25
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="llama-8b"} 2.0
vllm:num_preemptions_created{engine="0",model_name="llama-8b"} 1.7e9
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="llama-8b"} 12345.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="llama-8b"} 6789.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="2000",prefix_caching_hold="True"} 1.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{engine="0",model_name="llama-8b"} 3.5
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="llama-8b"} 4.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="llama-8b"} 9.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="llama-8b"} 10.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="llama-8b"} 10.0
# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_sum{engine="0",model_name="llama-8b"} 1.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="llama-8b"} 20.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.05",model_name="llama-8b"} 50.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="llama-8b"} 50.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="llama-8b"} 50.0
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="llama-8b"} 20.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="llama-8b"} 2.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="5.0",model_name="llama-8b"} 8.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="llama-8b"} 8.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="llama-8b"} 8.0
"""

# vLLM V0 (0.6.x): gpu_cache_usage_perc and time_per_output_token_seconds; counters without TYPE
# lines keep their `_total` family name.
VLLM_V0 = """\
# HELP vllm:cache_config_info information of cache_config
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",cache_dtype="auto",enable_prefix_caching="False",gpu_memory_utilization="0.9",num_cpu_blocks="2048",num_gpu_blocks="1000",num_gpu_blocks_override="None",sliding_window="None",swap_space_bytes="4294967296"} 1.0
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="opt-125m"} 2.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="opt-125m"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="opt-125m"} 5.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="opt-125m"} 0.5
vllm:num_preemptions_total{model_name="opt-125m"} 4.0
vllm:prompt_tokens_total{model_name="opt-125m"} 100.0
vllm:generation_tokens_total{model_name="opt-125m"} 200.0
# HELP vllm:time_per_output_token_seconds Histogram of time per output token in seconds.
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{le="0.025",model_name="opt-125m"} 1.0
vllm:time_per_output_token_seconds_bucket{le="0.05",model_name="opt-125m"} 3.0
vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="opt-125m"} 3.0
vllm:time_per_output_token_seconds_count{model_name="opt-125m"} 3.0
vllm:time_per_output_token_seconds_sum{model_name="opt-125m"} 0.1
"""

SGLANG = """\
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.128902e+06
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.557572e+06
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28
# HELP sglang:max_total_num_tokens Maximum total number of tokens
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{model_name="meta-llama/Llama-3.1-8B-Instruct"} 161721.0
# HELP sglang:num_running_reqs The number of running requests
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 11.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 6.0
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_sum{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.35
sglang:time_to_first_token_seconds_bucket{le="0.04",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
sglang:time_to_first_token_seconds_bucket{le="0.06",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
sglang:time_to_first_token_seconds_count{model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# HELP sglang:time_per_output_token_seconds Histogram of time per output token in seconds.
# TYPE sglang:time_per_output_token_seconds histogram
sglang:time_per_output_token_seconds_sum{model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
sglang:time_per_output_token_seconds_bucket{le="0.005",model_name="meta-llama/Llama-3.1-8B-Instruct"} 5.0
sglang:time_per_output_token_seconds_bucket{le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 5.0
sglang:time_per_output_token_seconds_count{model_name="meta-llama/Llama-3.1-8B-Instruct"} 5.0
"""

INF = math.inf


@pytest.mark.parametrize(
    ("text", "model", "expected"),
    [
        pytest.param(
            VLLM_V1, "llama-8b",
            EngineSample(
                engine="vllm", running=7, waiting=3, kv_usage=0.25, num_gpu_blocks=2000, block_size=16,
                prompt_tokens_total=12345.0, generation_tokens_total=6789.0, preemptions_total=2.0,
                ttft=((0.1, 4.0), (0.5, 9.0), (INF, 10.0)),
                itl=((0.01, 20.0), (0.05, 50.0), (INF, 50.0)),
                e2e=((1.0, 2.0), (5.0, 8.0), (INF, 8.0)),
                itl_sum_s=1.0, itl_count=50.0, finished_total=8.0,
            ),
            id="vllm-v1",
        ),
        pytest.param(
            VLLM_V0, "opt-125m",
            EngineSample(
                engine="vllm", running=2, waiting=5, kv_usage=0.5, num_gpu_blocks=1000, block_size=32,
                prompt_tokens_total=100.0, generation_tokens_total=200.0, preemptions_total=4.0,
                itl=((0.025, 1.0), (0.05, 3.0), (INF, 3.0)),
                itl_sum_s=0.1, itl_count=3.0,
            ),
            id="vllm-v0",
        ),
        pytest.param(
            SGLANG, None,
            EngineSample(
                engine="sglang", running=11, waiting=6, kv_usage=0.28, num_gpu_blocks=161721, block_size=1,
                prompt_tokens_total=8.128902e06, generation_tokens_total=7.557572e06, preemptions_total=None,
                ttft=((0.04, 1.0), (0.06, 3.0), (INF, 3.0)),
                itl=((0.005, 5.0), (INF, 5.0)),
                itl_sum_s=1.0, itl_count=5.0,
            ),
            id="sglang-tpot-fallback",
        ),
    ],
)
def test_parse_dialects(text: str, model: str | None, expected: EngineSample) -> None:
    assert parse_metrics(text, model) == expected


def test_kv_capacity_property() -> None:
    s = parse_metrics(VLLM_V1, "llama-8b")
    assert s.kv_capacity_tokens == 32000
    assert s.has_kv_capacity


def test_v1_prefers_kv_cache_usage_perc_over_v0_name() -> None:
    text = VLLM_V1 + 'vllm:gpu_cache_usage_perc{engine="0",model_name="llama-8b"} 0.9\n'
    assert parse_metrics(text).kv_usage == 0.25


def test_sglang_prefers_inter_token_latency() -> None:
    text = SGLANG + (
        "# TYPE sglang:inter_token_latency_seconds histogram\n"
        'sglang:inter_token_latency_seconds_bucket{le="0.02",model_name="m"} 7.0\n'
        'sglang:inter_token_latency_seconds_bucket{le="+Inf",model_name="m"} 7.0\n'
    )
    assert parse_metrics(text).itl == ((0.02, 7.0), (INF, 7.0))


TWO_MODELS = """\
vllm:num_requests_running{engine="0",model_name="a"} 1.0
vllm:num_requests_running{engine="1",model_name="b"} 4.0
vllm:num_requests_waiting{engine="0",model_name="a"} 2.0
vllm:num_requests_waiting{engine="1",model_name="b"} 8.0
vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="b"} 0.6
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="300"} 1.0
"""


@pytest.mark.parametrize(
    ("model", "running", "waiting", "kv"),
    [("a", 1, 2, 0.2), ("b", 4, 8, 0.6), (None, 5, 10, 0.4)],
    ids=["filter-a", "filter-b", "sum-all"],
)
def test_model_filter_and_sum(model: str | None, running: int, waiting: int, kv: float) -> None:
    s = parse_metrics(TWO_MODELS, model)
    assert (s.running, s.waiting) == (running, waiting)
    assert s.kv_usage == pytest.approx(kv)
    # cache_config_info carries no model label: every engine's blocks count.
    assert (s.num_gpu_blocks, s.block_size) == (400, 16)


def test_sglang_old_name_label_filters() -> None:
    text = 'sglang:num_running_reqs{name="x"} 3.0\nsglang:num_running_reqs{name="y"} 9.0\n'
    assert parse_metrics(text, "x").running == 3


@pytest.mark.parametrize(
    "text",
    [
        "hello world",
        "<html><body>502 Bad Gateway</body></html>",
        '{"object": "error"}',
        "vllm:num_requests_running{model_name= 1",
    ],
    ids=["words", "html", "json", "broken-labels"],
)
def test_garbage_raises_parse_error(text: str) -> None:
    with pytest.raises(TelemetryParseError) as info:
        parse_metrics(text)
    assert isinstance(info.value, TidegateError)
    assert "not Prometheus text" in str(info.value)


@pytest.mark.parametrize(
    ("text", "model", "match"),
    [
        ("", None, "no vLLM, SGLang or TGI metrics"),
        ("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.0\n", None, "no vLLM"),
        (TWO_MODELS, "other-model", "for model 'other-model'"),
        ('vllm:prompt_tokens_total{model_name="a"} 1.0\n', None, "lacks running/waiting"),
    ],
    ids=["empty", "other-exporter", "wrong-model", "only-counters"],
)
def test_no_engine_metrics_raises(text: str, model: str | None, match: str) -> None:
    with pytest.raises(TelemetryParseError, match=match):
        parse_metrics(text, model)


def test_missing_optional_metrics_are_unknown_not_zero() -> None:
    s = parse_metrics('vllm:num_requests_running{model_name="m"} 2.0\n', "m")
    assert s == EngineSample(engine="vllm", running=2)
    assert s.kv_usage is None
    assert s.prompt_tokens_total is None
    assert not s.has_kv_capacity
    assert s.ttft == () and s.itl == () and s.e2e == ()


def test_kv_usage_clamped_and_nan_ignored() -> None:
    assert parse_metrics('vllm:kv_cache_usage_perc{model_name="m"} 1.5\n').kv_usage == 1.0
    assert parse_metrics('vllm:num_requests_running 1\nvllm:kv_cache_usage_perc NaN\n').kv_usage is None


def test_bad_cache_config_labels_mean_no_capacity() -> None:
    text = 'vllm:num_requests_running 1\nvllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1\n'
    s = parse_metrics(text)
    assert (s.num_gpu_blocks, s.block_size, s.has_kv_capacity) == (0, 0, False)


@pytest.mark.parametrize("value, want", [("48", 48), ("0", 0), ("NaN", 0), ("-3", 0)])
def test_sglang_max_running_requests_is_the_engines_seats(value: str, want: int) -> None:
    # Older SGLang releases export their scheduler's limit; garbage reads as not exported.
    page = SGLANG + f"# TYPE sglang:max_running_requests gauge\nsglang:max_running_requests{{name=\"m\"}} {value}\n"
    assert parse_metrics(page).max_running == want
    assert parse_metrics(SGLANG).max_running == 0


def test_vllm_does_not_export_its_seats() -> None:
    assert parse_metrics(VLLM_V1, "llama-8b").max_running == 0
