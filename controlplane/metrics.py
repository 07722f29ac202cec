"""Prometheus metrics of one control-plane process (own registry: no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.reports = Counter("tidegate_cp_reports_received", "Telemetry reports received.", registry=r)
        self.streams_open = Gauge("tidegate_cp_streams_open", "Agent telemetry streams open.", registry=r)
        self.streams_refused = Counter(
            "tidegate_cp_streams_refused", "Telemetry streams refused by authentication or binding checks.",
            ["code"], registry=r)
        self.ticks = Counter("tidegate_cp_ticks", "Decision-loop ticks.", registry=r)
        self.tables_published = Counter(
            "tidegate_cp_tables_published", "Routing tables written to etcd.", ["pool"], registry=r)
        self.publish_errors = Counter(
            "tidegate_cp_publish_errors", "Failed attempts to write routing tables.", registry=r)
        self.leader = Gauge("tidegate_cp_leader", "1 while this instance leads, else 0.", registry=r)
        self.replicas = Gauge("tidegate_cp_replicas", "Replicas known to this instance.", registry=r)
        self.tick_seconds = Histogram(
            "tidegate_cp_tick_seconds", "Duration of one decision-loop tick.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0), registry=r)
