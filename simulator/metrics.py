"""Prometheus exposition of a simulated replica, with a real engine's metric names and buckets.

Flavours (``--metrics-flavor``):

- ``vllm``: vLLM V1 names, labels model_name and engine (vllm/v1/metrics/loggers.py):
  vllm:num_requests_running / _waiting, vllm:kv_cache_usage_perc, vllm:num_preemptions_total,
  vllm:prompt_tokens_total, vllm:generation_tokens_total, vllm:prefix_cache_queries_total and
  vllm:prefix_cache_hits_total (tokens), vllm:request_success_total, vllm:cache_config_info, and
  the histograms vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds,
  vllm:e2e_request_latency_seconds, vllm:iteration_tokens_total (tokens per engine step: prompt
  tokens of prefills completed in the step plus sampled tokens, as vLLM counts them),
  vllm:request_prefill_time_seconds (first token minus first scheduled, observed when the request
  finishes, as V1 does; V0 exports it too).
- ``vllm-v0``: the V0 names, label model_name: vllm:gpu_cache_usage_perc,
  vllm:num_requests_swapped, vllm:gpu_prefix_cache_hit_rate, vllm:time_per_output_token_seconds
  (and vllm:iteration_tokens_total, which V0 exports too).
- ``sglang``: SGLang names, label model_name (python/sglang/srt/metrics/collector.py):
  sglang:num_running_reqs, sglang:num_queue_reqs, sglang:token_usage, sglang:num_used_tokens,
  sglang:max_total_num_tokens, sglang:cache_hit_rate, sglang:prompt_tokens_total,
  sglang:generation_tokens_total, sglang:cached_tokens_total, sglang:num_requests_total,
  sglang:num_aborted_requests_total, sglang:num_retracted_requests_total (our preemptions),
  sglang:gpu_execution_seconds_total (summed step durations, category "forward"), and
  the histograms sglang:time_to_first_token_seconds, sglang:inter_token_latency_seconds,
  sglang:e2e_request_latency_seconds with SGLang's default buckets.

Engine state (queue gauges, KV usage, token, cache and preemption counters) is read from the
engine at scrape time, so the exposition can never drift from the engine; per-request latencies
are histograms observed by the server. Every server owns its registry (no global state).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from tidegate.simulator.engine import ITERATION_TOKENS_BUCKETS, Engine, EngineStats

FLAVORS = ("vllm", "vllm-v0", "sglang")

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                           60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)

# SGLang's default buckets (TokenizerMetricsCollector).
SGLANG_TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
SGLANG_ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
                      0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)
SGLANG_E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200,
                      1800, 2400)


class _EngineCollector:
    def __init__(self, engine: Engine, labels: dict[str, str], flavor: str, time_scale: float) -> None:
        self._engine = engine
        self._time_scale = time_scale
        self._names = list(labels)
        self._values = list(labels.values())
        self._flavor = flavor

    def _gauge(self, name: str, doc: str, value: float) -> Metric:
        g = GaugeMetricFamily(name, doc, labels=self._names)
        g.add_metric(self._values, value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> Metric:
        c = CounterMetricFamily(name, doc, labels=self._names)
        c.add_metric(self._values, value)
        return c

    def collect(self) -> Iterator[Metric]:
        s = self._engine.stats()
        if self._flavor == "sglang":
            yield from self._collect_sglang()
            return
        yield self._gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                          s.running)
        yield self._gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                          s.waiting)
        if self._flavor == "vllm-v0":
            yield self._gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.", 0)
            yield self._gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.",
                              s.kv_usage)
            rate = s.prefix_cache_hits_total / s.prefix_cache_queries_total if s.prefix_cache_queries_total else 0.0
            yield self._gauge("vllm:gpu_prefix_cache_hit_rate", "GPU prefix cache block hit rate.", rate)
        else:
            yield self._gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                              s.kv_usage)
            yield self._counter("vllm:prefix_cache_queries",
                                "Prefix cache queries, in terms of number of queried tokens.",
                                s.prefix_cache_queries_total)
            yield self._counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                                s.prefix_cache_hits_total)
        yield self._counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                            s.preemptions_total)
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens_total)
        yield self._counter("vllm:generation_tokens", "Number of generation tokens processed.",
                            s.generation_tokens_total)
        yield self._iteration_tokens(s)
        info = {"block_size": str(s.block_size), "num_gpu_blocks": str(s.num_gpu_blocks),
                "cache_dtype": "auto", "gpu_memory_utilization": "0.9",
                "enable_prefix_caching": str(self._engine.enable_prefix_caching)}
        if self._flavor != "vllm-v0":
            info["engine"] = "0"
        g = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                              labels=list(info))
        g.add_metric(list(info.values()), 1)
        yield g

    def _iteration_tokens(self, s: EngineStats) -> Metric:
        h = HistogramMetricFamily("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                                  labels=self._names)
        cumulative, acc = [], 0
        for le, count in zip((*ITERATION_TOKENS_BUCKETS, "+Inf"), s.iteration_tokens_counts, strict=True):
            acc += count
            cumulative.append((str(le), acc))
        h.add_metric(self._values, cumulative, s.step_tokens_total)
        return h

    def _collect_sglang(self) -> Iterator[Metric]:
        s = self._engine.stats()
        capacity = s.num_gpu_blocks * s.block_size
        yield self._gauge("sglang:num_running_reqs", "The number of running requests.", s.running)
        yield self._gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", s.waiting)
        yield self._gauge("sglang:num_used_tokens", "The number of used tokens.", s.used_blocks * s.block_size)
        yield self._gauge("sglang:token_usage", "The token usage.", s.kv_usage)
        yield self._gauge("sglang:max_total_num_tokens",
                          "Maximum total number of tokens in the KV cache pool.", capacity)
        rate = s.prefix_cache_hits_total / s.prefix_cache_queries_total if s.prefix_cache_queries_total else 0.0
        yield self._gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", rate)
        yield self._counter("sglang:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens_total)
        yield self._counter("sglang:generation_tokens", "Number of generation tokens processed.",
                            s.generation_tokens_total)
        yield self._counter("sglang:cached_tokens", "Number of cached prompt tokens.", s.prefix_cache_hits_total)
        yield self._counter("sglang:num_requests", "Number of requests processed.", s.requests_finished_total)
        yield self._counter("sglang:num_aborted_requests", "Number of requests aborted.", s.requests_aborted_total)
        yield self._counter("sglang:num_retracted_requests", "Total number of retracted requests.",
                            s.preemptions_total)
        busy = CounterMetricFamily("sglang:gpu_execution_seconds", "Total time that GPU is busy executing a workload.",
                                   labels=[*self._names, "category"])
        busy.add_metric([*self._values, "forward"], s.busy_s * self._time_scale)
        yield busy


class SimMetrics:
    """The /metrics registry of one simulated replica. `time_scale` converts engine seconds into
    the seconds the server lives in (1 / speedup), for the engine's own busy-time counter."""

    def __init__(self, engine: Engine, model_name: str, flavor: str = "vllm", *, time_scale: float = 1.0) -> None:
        if flavor not in FLAVORS:
            raise ValueError(f"unknown metrics flavor {flavor!r}; valid: {', '.join(FLAVORS)}")
        self.flavor = flavor
        self.registry = CollectorRegistry(auto_describe=True)
        labels = {"model_name": model_name} if flavor != "vllm" else {"model_name": model_name, "engine": "0"}
        names = list(labels)
        values = list(labels.values())
        self.registry.register(_EngineCollector(engine, labels, flavor, time_scale))
        self._success: Counter | None = None
        buckets: tuple[tuple[float, ...], ...]
        if flavor == "sglang":
            prefix, buckets = "sglang:", (SGLANG_TTFT_BUCKETS, SGLANG_ITL_BUCKETS, SGLANG_E2E_BUCKETS)
            itl_name = "sglang:inter_token_latency_seconds"
        else:
            prefix, buckets = "vllm:", (TTFT_BUCKETS, ITL_BUCKETS, REQUEST_LATENCY_BUCKETS)
            itl_name = ("vllm:time_per_output_token_seconds" if flavor == "vllm-v0"
                        else "vllm:inter_token_latency_seconds")
            self._success = Counter("vllm:request_success", "Count of successfully processed requests.",
                                    [*names, "finished_reason"], registry=self.registry)
        self._ttft = Histogram(prefix + "time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                               names, buckets=buckets[0], registry=self.registry).labels(*values)
        self._itl = Histogram(itl_name, "Histogram of inter-token latency in seconds.", names,
                              buckets=buckets[1], registry=self.registry).labels(*values)
        self._e2e = Histogram(prefix + "e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                              names, buckets=buckets[2], registry=self.registry).labels(*values)
        self._label_values = values
        self._prefill: Histogram | None = None
        if flavor != "sglang":
            self._prefill = Histogram("vllm:request_prefill_time_seconds",
                                      "Histogram of time spent in PREFILL phase for request.", names,
                                      buckets=REQUEST_LATENCY_BUCKETS, registry=self.registry).labels(*values)
        self._time_scale = time_scale

    def observe_first_token(self, ttft_s: float) -> None:
        self._ttft.observe(ttft_s)

    def observe_inter_token(self, itl_s: float) -> None:
        self._itl.observe(itl_s)

    def observe_finished(self, e2e_s: float, finish_reason: str = "length", *, prefill_s: float | None = None) -> None:
        """`prefill_s` in engine seconds (the engine's own clock), scaled here like its busy time."""
        self._e2e.observe(e2e_s)
        if self._prefill is not None and prefill_s is not None:
            self._prefill.observe(prefill_s * self._time_scale)
        if self._success is not None:
            self._success.labels(*self._label_values, finish_reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
