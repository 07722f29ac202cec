"""The agent's own Prometheus metrics, in a per-process registry (no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.scrapes = Counter(
            "tidegate_agent_scrapes", "Engine scrapes by result.", ["result"], registry=self.registry
        )
        self.reports_sent = Counter(
            "tidegate_agent_reports_sent", "Reports sent to the control plane.", registry=self.registry
        )
        self.stream_reconnects = Counter(
            "tidegate_agent_stream_reconnects", "Telemetry streams (re)opened after the first.",
            registry=self.registry,
        )
        # ok / unavailable (no driver, no GPU visible, a driver error) / timeout and busy (a read
        # hung in the driver, and the reads it held up: docs/RELIABILITY.md)
        self.gpu_reads = Counter(
            "tidegate_agent_gpu_reads", "GPU telemetry reads by result.", ["result"], registry=self.registry
        )
        self.stream_up = Gauge(
            "tidegate_agent_stream_up", "1 while a telemetry stream is open.", registry=self.registry
        )
