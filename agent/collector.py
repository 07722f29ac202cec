"""One collector per engine replica: scrape /metrics and /health, read the GPUs, build a Report.

The GPUs are read from a GpuSource: agent.nvml.NvmlReader (real NVML, in a thread) or
agent.simgpu.SimulatedGpuReader (the simulator's labelled simulation; its reports carry
``simulated_gpu = true``, even when the simulated readings are unavailable).

Each `collect()` is one tick. It never raises for engine or GPU trouble: a failed scrape or an
unhealthy engine still yields a Report with `engine.healthy = false` and the error, because the
control plane (not the agent) decides what an unhealthy replica means. Errors are logged when
they start and when they clear, not on every tick.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Protocol

import aiohttp
import structlog
from google.protobuf.timestamp_pb2 import Timestamp

from tidegate.agent.histograms import HistogramWindow, LatencyWindow
from tidegate.agent.metrics import AgentMetrics
from tidegate.agent.nvml import GpuTelemetry
from tidegate.agent.rates import counter_rate, work_deltas
from tidegate.engine_metrics import EngineSample, TelemetryParseError, parse_metrics
from tidegate.v1 import telemetry_pb2

log = structlog.get_logger(__name__)

Clock = Callable[[], float]


class GpuSource(Protocol):
    """Where a replica's GPU telemetry comes from. `aread` must not block the event loop and should
    not raise (errors are `available=False`); `simulated` labels the readings as a simulation."""

    @property
    def simulated(self) -> bool: ...

    async def aread(self, indices: Sequence[int] = ()) -> GpuTelemetry: ...


def _latency(w: LatencyWindow) -> telemetry_pb2.LatencySummary:
    return telemetry_pb2.LatencySummary(p50_ms=w.p50_ms, p95_ms=w.p95_ms, p99_ms=w.p99_ms, count=w.count)


class Collector:
    def __init__(
        self,
        engine_url: str,
        session: aiohttp.ClientSession,
        *,
        model: str | None = None,
        gpu_reader: GpuSource | None = None,
        gpu_indices: Sequence[int] = (),
        scrape_timeout_s: float = 2.0,
        window_s: float = 30.0,
        clock: Clock = time.monotonic,
        wallclock: Clock = time.time,
        metrics: AgentMetrics | None = None,
        dialect: str = "auto",
        max_num_seqs: int = 0,
    ) -> None:
        self._base = engine_url.rstrip("/")
        self._max_num_seqs = max_num_seqs
        self._dialect = dialect
        self._session = session
        self._model = model
        self._gpu = gpu_reader
        self._gpu_indices = tuple(gpu_indices)
        self._timeout = aiohttp.ClientTimeout(total=scrape_timeout_s)
        self._gpu_timeout_s = scrape_timeout_s
        self._window_s = window_s
        self._clock = clock
        self._wallclock = wallclock
        self._metrics = metrics
        self._ttft = HistogramWindow(window_s)
        self._itl = HistogramWindow(window_s)
        self._e2e = HistogramWindow(window_s)
        self._prev: EngineSample | None = None
        self._prev_t: float | None = None
        self._seq = 0
        self._error = ""
        self._gpu_error: str | None = None

    async def _get(self, path: str) -> tuple[int, str]:
        async with self._session.get(self._base + path, timeout=self._timeout) as resp:
            return resp.status, await resp.text()

    async def _health(self) -> str:
        """Empty string when healthy, else why not."""
        try:
            status, _ = await self._get("/health")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return f"health: {type(exc).__name__}: {exc}".rstrip(": ")
        return "" if status == 200 else f"health: HTTP {status}"

    async def _scrape(self) -> tuple[EngineSample | None, str]:
        try:
            status, text = await self._get("/metrics")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return None, f"metrics: {type(exc).__name__}: {exc}".rstrip(": ")
        if status != 200:
            return None, f"metrics: HTTP {status}"
        try:
            return parse_metrics(text, self._model, self._dialect), ""
        except TelemetryParseError as exc:
            return None, f"metrics: {exc}"

    async def _read_gpus(self) -> GpuTelemetry:
        if self._gpu is None:
            return GpuTelemetry(available=False, error="GPU telemetry disabled")
        source = "simulated GPU" if self._gpu.simulated else "NVML"
        result = "unavailable"
        try:
            # Bounded: a hung driver must not hold back the engine's figures (a report waits for
            # all three reads). NVML's thread runs on; the reader answers "busy" until it returns.
            t = await asyncio.wait_for(self._gpu.aread(self._gpu_indices), self._gpu_timeout_s)
            result = "ok" if t.available else "busy" if t.busy else "unavailable"
            return t
        except TimeoutError:
            result = "timeout"
            return GpuTelemetry(available=False, error=f"{source} read timed out after {self._gpu_timeout_s:g} s")
        except Exception as exc:  # a driver bug must not stop the reports
            return GpuTelemetry(available=False, error=f"{source} read failed: {type(exc).__name__}: {exc}")
        finally:
            if self._metrics is not None:
                self._metrics.gpu_reads.labels(result=result).inc()

    async def collect(self) -> telemetry_pb2.Report:
        (sample, scrape_err), health_err, gpus = await asyncio.gather(
            self._scrape(), self._health(), self._read_gpus()
        )
        now = self._clock()
        error = "; ".join(e for e in (health_err, scrape_err) if e)
        if self._metrics is not None:
            self._metrics.scrapes.labels(result="failed" if scrape_err else "ok").inc()
        self._log_transition(error, gpus)

        engine = telemetry_pb2.EngineStats(healthy=not error, error=error, window_s=self._window_s)
        if sample is not None:
            self._fill_engine(engine, sample, now)
        self._seq += 1
        sent_at = Timestamp()
        sent_at.FromNanoseconds(int(self._wallclock() * 1e9))
        return telemetry_pb2.Report(
            seq=self._seq,
            sent_at=sent_at,
            engine=engine,
            gpu_telemetry_available=gpus.available,
            gpu_telemetry_error=gpus.error,
            gpus=[telemetry_pb2.GpuStats(**asdict(g)) for g in gpus.gpus],
            simulated_gpu=self._gpu is not None and self._gpu.simulated,
        )

    def _fill_engine(self, engine: telemetry_pb2.EngineStats, s: EngineSample, now: float) -> None:
        engine.num_requests_running = s.running
        engine.num_requests_waiting = s.waiting
        # The operator's figure first: it is the engine's configuration, where a page's is a report of it.
        engine.max_num_seqs = self._max_num_seqs or s.max_running
        usage = s.kv_usage if s.kv_usage is not None else 0.0
        engine.kv_cache_usage = usage
        engine.num_gpu_blocks = s.num_gpu_blocks
        engine.block_size = s.block_size
        engine.has_kv_capacity = s.has_kv_capacity and s.kv_usage is not None
        if engine.has_kv_capacity:
            engine.kv_capacity_tokens = s.kv_capacity_tokens
            engine.kv_free_tokens = int(s.kv_capacity_tokens * (1.0 - usage))
        engine.prompt_tokens_total = s.prompt_tokens_total or 0.0
        engine.generation_tokens_total = s.generation_tokens_total or 0.0
        engine.preemptions_total = s.preemptions_total or 0.0
        for window, buckets in ((self._ttft, s.ttft), (self._itl, s.itl), (self._e2e, s.e2e)):
            window.observe(now, buckets)
        engine.ttft.CopyFrom(_latency(self._ttft.summary(now)))
        engine.itl.CopyFrom(_latency(self._itl.summary(now)))
        engine.e2e.CopyFrom(_latency(self._e2e.summary(now)))
        if self._prev is not None and self._prev_t is not None:
            dt = now - self._prev_t
            engine.prompt_tokens_per_s = counter_rate(
                self._prev.prompt_tokens_total, s.prompt_tokens_total, dt
            )
            engine.generation_tokens_per_s = counter_rate(
                self._prev.generation_tokens_total, s.generation_tokens_total, dt
            )
            engine.work.CopyFrom(telemetry_pb2.EngineWork(**work_deltas(self._prev, s, dt)))
        self._prev, self._prev_t = s, now

    def _log_transition(self, error: str, gpus: GpuTelemetry) -> None:
        if error and not self._error:
            log.warning("engine_scrape_failed", engine_url=self._base, error=error)
        elif not error and self._error:
            log.info("engine_scrape_recovered", engine_url=self._base)
        self._error = error
        gpu_error = gpus.error if not gpus.available else ""
        if gpu_error != (self._gpu_error or ""):
            if gpu_error:
                log.warning("gpu_telemetry_unavailable", error=gpu_error)
            elif self._gpu_error is not None:
                log.info("gpu_telemetry_available", gpus=len(gpus.gpus))
        self._gpu_error = gpu_error
