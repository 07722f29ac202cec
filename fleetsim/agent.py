"""The agent of one simulated replica: what `agent.collector.Collector` would report.

Every report interval it samples the engine (running, waiting, KV usage and capacity, preemption
counter) and the windowed TTFT / ITL percentiles, and builds the same `telemetry_pb2.Report`.
The percentiles come from cumulative histograms with vLLM's bucket bounds, windowed like the
agent's `agent.histograms.HistogramWindow` and read with its `summarize` (histogram_quantile),
so they carry the same bucket quantisation as live ones. `RollingWindow` keeps a running sum of
the increments in the window instead of re-adding them at every report (HistogramWindow's cost
dominated a 16-replica hour); it gives the same buckets (tested) because a simulated counter
never resets.
ITL is observed per finished request as its mean inter-token time, counted once per token
after the first (the per-token gaps are not kept); a request's TTFT when its first token comes.
The rate estimator's window (`EngineWork`) comes from the engine's own counters, as vLLM exports
them (steps, prompt / cached / generated tokens, the ITL sum and count; no busy time), through the
agent's `work_deltas`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque

from tidegate.agent.histograms import LatencyWindow, summarize
from tidegate.agent.rates import work_deltas
from tidegate.engine_metrics import EngineSample
from tidegate.simulator.engine import Engine
from tidegate.simulator.metrics import ITL_BUCKETS, TTFT_BUCKETS
from tidegate.v1 import telemetry_pb2


class CumulativeHistogram:
    """A Prometheus-style cumulative histogram (bounds + +Inf) fed with observations."""

    __slots__ = ("_bounds", "_counts")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self._counts = [0.0] * (len(bounds) + 1)

    def observe(self, value: float, count: float = 1.0) -> None:
        self._counts[bisect_left(self._bounds, value)] += count

    def cumulative(self) -> tuple[tuple[float, float], ...]:
        out = []
        acc = 0.0
        for le, c in zip((*self._bounds, float("inf")), self._counts, strict=True):
            acc += c
            out.append((le, acc))
        return tuple(out)


class RollingWindow:
    """HistogramWindow's result (sum of per-report increments newer than window_s) kept incrementally.
    The first observation is a baseline, as in HistogramWindow."""

    __slots__ = ("_bounds", "_incs", "_prev", "_sum", "window_s")

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        self.window_s = window_s
        self._prev: list[float] | None = None
        self._bounds: tuple[float, ...] = ()
        self._sum: list[float] = []
        self._incs: deque[tuple[float, list[float]]] = deque()

    def observe(self, t: float, cumulative: tuple[tuple[float, float], ...]) -> None:
        counts = [c for _, c in cumulative]
        if self._prev is None:
            self._prev = counts
            self._bounds = tuple(le for le, _ in cumulative)
            self._sum = [0.0] * len(counts)
            return
        inc = [a - b for a, b in zip(counts, self._prev, strict=True)]
        self._prev = counts
        if any(inc):
            self._incs.append((t, inc))
            self._sum = [a + b for a, b in zip(self._sum, inc, strict=True)]
        self._prune(t)

    def _prune(self, now: float) -> None:
        incs = self._incs
        while incs and incs[0][0] <= now - self.window_s:
            _, inc = incs.popleft()
            self._sum = [a - b for a, b in zip(self._sum, inc, strict=True)]

    def buckets(self, now: float) -> tuple[tuple[float, float], ...]:
        self._prune(now)
        if not self._incs:
            return tuple((le, 0.0) for le in self._bounds)
        return tuple(zip(self._bounds, self._sum, strict=True))

    def summary(self, now: float) -> LatencyWindow:
        return summarize(self.buckets(now))


def _latency(w: LatencyWindow) -> telemetry_pb2.LatencySummary:
    return telemetry_pb2.LatencySummary(p50_ms=w.p50_ms, p95_ms=w.p95_ms, p99_ms=w.p99_ms, count=w.count)


class SimAgent:
    def __init__(self, replica_id: str, pool: str, window_s: float = 30.0) -> None:
        self.hello = telemetry_pb2.Hello(replica_id=replica_id, pool=pool, endpoint=f"sim://{replica_id}",
                                         engine_kind="tidegate-sim", protocol_version=1)
        self._window_s = window_s
        self._ttft = CumulativeHistogram(TTFT_BUCKETS)
        self._itl = CumulativeHistogram(ITL_BUCKETS)
        self._ttft_w = RollingWindow(window_s)
        self._itl_w = RollingWindow(window_s)
        self._seq = 0
        self._prev: tuple[float, EngineSample] | None = None

    def observe_ttft(self, ttft_s: float) -> None:
        self._ttft.observe(ttft_s)

    def observe_finished(self, first_token_s: float, finish_s: float, output_tokens: int) -> None:
        if output_tokens > 1:
            self._itl.observe((finish_s - first_token_s) / (output_tokens - 1), output_tokens - 1)

    def report(self, engine: Engine, now_s: float) -> telemetry_pb2.Report:
        s = engine.stats()
        self._ttft_w.observe(now_s, self._ttft.cumulative())
        self._itl_w.observe(now_s, self._itl.cumulative())
        capacity = s.num_gpu_blocks * s.block_size
        eng = telemetry_pb2.EngineStats(
            healthy=True,
            num_requests_running=s.running,
            num_requests_waiting=s.waiting,
            kv_cache_usage=s.kv_usage,
            num_gpu_blocks=s.num_gpu_blocks,
            block_size=s.block_size,
            kv_capacity_tokens=capacity,
            kv_free_tokens=int(capacity * (1.0 - s.kv_usage)),
            has_kv_capacity=True,
            prompt_tokens_total=s.prompt_tokens_total,
            generation_tokens_total=s.generation_tokens_total,
            preemptions_total=s.preemptions_total,
            window_s=self._window_s,
            # The operator's --engine-max-num-seqs: the simulated agent knows its engine's profile.
            max_num_seqs=engine.profile.max_num_seqs,
            ttft=_latency(self._ttft_w.summary(now_s)),
            itl=_latency(self._itl_w.summary(now_s)),
        )
        sample = EngineSample(
            engine="vllm", prompt_tokens_total=s.prompt_tokens_total, generation_tokens_total=s.generation_tokens_total,
            steps_total=s.steps_total, step_tokens_total=s.step_tokens_total, itl_sum_s=s.itl_sum_s,
            itl_count=s.itl_count, prefix_cache_hits_total=s.prefix_cache_hits_total,
            prefill_time_sum_s=s.prefill_time_sum_s, prefill_time_count=s.prefill_time_count,
            finished_total=s.requests_finished_total)
        if self._prev is not None:
            eng.work.CopyFrom(telemetry_pb2.EngineWork(**work_deltas(self._prev[1], sample, now_s - self._prev[0])))
        self._prev = (now_s, sample)
        self._seq += 1
        return telemetry_pb2.Report(seq=self._seq, engine=eng, gpu_telemetry_available=False,
                                    gpu_telemetry_error="simulated", simulated_gpu=True)
