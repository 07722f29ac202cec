"""Prometheus exposition of a simulated replica, with vLLM's metric names and buckets.

Flavours: ``vllm`` (V1 names, labels model_name and engine) and ``vllm-v0`` (V0 names:
gpu_cache_usage_perc and time_per_output_token_seconds, label model_name). Engine state (queue
gauges, KV usage, token and preemption counters) is read from the engine at scrape time, so the
exposition can never drift from the engine; per-request latencies are histograms observed by the
server. Every server owns its registry (no global state).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from simulator.engine import Engine

FLAVORS = ("vllm", "vllm-v0")

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                           60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class _EngineCollector:
    def __init__(self, engine: Engine, labels: dict[str, str], flavor: str) -> None:
        self._engine = engine
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
        yield self._gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                          s.running)
        yield self._gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                          s.waiting)
        if self._flavor == "vllm-v0":
            yield self._gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.", 0)
            yield self._gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.",
                              s.kv_usage)
        else:
            yield self._gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                              s.kv_usage)
        yield self._counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                            s.preemptions_total)
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens_total)
        yield self._counter("vllm:generation_tokens", "Number of generation tokens processed.",
                            s.generation_tokens_total)
        info = {"block_size": str(s.block_size), "num_gpu_blocks": str(s.num_gpu_blocks),
                "cache_dtype": "auto", "gpu_memory_utilization": "0.9", "enable_prefix_caching": "False"}
        if self._flavor != "vllm-v0":
            info["engine"] = "0"
        g = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                              labels=list(info))
        g.add_metric(list(info.values()), 1)
        yield g


class SimMetrics:
    """The /metrics registry of one simulated replica."""

    def __init__(self, engine: Engine, model_name: str, flavor: str = "vllm") -> None:
        if flavor not in FLAVORS:
            raise ValueError(f"unknown metrics flavor {flavor!r}; valid: {', '.join(FLAVORS)}")
        self.flavor = flavor
        self.registry = CollectorRegistry(auto_describe=True)
        labels = {"model_name": model_name} if flavor == "vllm-v0" else {"model_name": model_name, "engine": "0"}
        names = list(labels)
        values = list(labels.values())
        self.registry.register(_EngineCollector(engine, labels, flavor))
        self._ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                               names, buckets=TTFT_BUCKETS, registry=self.registry).labels(*values)
        itl_name = ("vllm:time_per_output_token_seconds" if flavor == "vllm-v0"
                    else "vllm:inter_token_latency_seconds")
        self._itl = Histogram(itl_name, "Histogram of inter-token latency in seconds.", names,
                              buckets=ITL_BUCKETS, registry=self.registry).labels(*values)
        self._e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                              names, buckets=REQUEST_LATENCY_BUCKETS, registry=self.registry).labels(*values)
        self._success = Counter("vllm:request_success", "Count of successfully processed requests.",
                                [*names, "finished_reason"], registry=self.registry)
        self._label_values = values

    def observe_first_token(self, ttft_s: float) -> None:
        self._ttft.observe(ttft_s)

    def observe_inter_token(self, itl_s: float) -> None:
        self._itl.observe(itl_s)

    def observe_finished(self, e2e_s: float, finish_reason: str = "length") -> None:
        self._e2e.observe(e2e_s)
        self._success.labels(*self._label_values, finish_reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
