"""The router's Prometheus metrics, in a per-process registry (no global registry)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from tidegate.router.inflight import InflightCounter
from tidegate.router.tables import RoutingTables

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class _StateCollector(Collector):
    """Gauges read at scrape time from their single owners (no copies to keep in sync)."""

    def __init__(self, tables: RoutingTables, inflight: InflightCounter, wall: Callable[[], float]) -> None:
        self._tables = tables
        self._inflight = inflight
        self._wall = wall

    def collect(self) -> Iterator[GaugeMetricFamily]:
        pools = self._tables.pools()
        known = {e.replica_id for t in pools.values() for e in t.entries}
        self._inflight.prune(known)
        g = GaugeMetricFamily("tidegate_router_inflight", "Requests this router has in flight, per replica.",
                              labels=["replica_id"])
        for rid, n in sorted(self._inflight.snapshot().items()):
            g.add_metric([rid], n)
        yield g
        yield GaugeMetricFamily("tidegate_router_inflight_requests", "Requests in flight at this router.",
                                value=self._inflight.total)
        age = GaugeMetricFamily("tidegate_router_table_age_seconds",
                                "Seconds since the leader computed each pool's routing table.",
                                labels=["pool"])
        gen = GaugeMetricFamily("tidegate_router_table_generation", "Generation of each pool's table.",
                                labels=["pool"])
        now = self._wall()
        for pool, t in sorted(pools.items()):
            if t.computed_at_s is not None:
                age.add_metric([pool], max(0.0, now - t.computed_at_s))
            gen.add_metric([pool], t.generation)
        yield age
        yield gen
        yield GaugeMetricFamily("tidegate_router_etcd_healthy",
                                "1 when the table watch is connected to etcd.",
                                value=1.0 if self._tables.etcd_healthy else 0.0)
        yield GaugeMetricFamily("tidegate_router_tables_synced", "1 once the routing tables were listed.",
                                value=1.0 if self._tables.synced.is_set() else 0.0)
        suspect = GaugeMetricFamily("tidegate_router_table_suspect",
                                    "1 while a pool's latest table lost most of its replicas and the router "
                                    "routes on the last known set (panic threshold).", labels=["pool"])
        panics = self._tables.suspect()
        for pool in sorted(pools):
            suspect.add_metric([pool], 1.0 if pool in panics else 0.0)
        yield suspect


class Children:
    """One metric's children by label values, each looked up once: prometheus_client's labels()
    checks, converts and locks on every call, a few times per request on the proxy's hot path.
    For label sets bounded by design (pools, statuses, classes); never removed from the metric."""

    __slots__ = ("_metric", "_children")

    def __init__(self, metric: MetricWrapperBase) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


class RouterMetrics:
    def __init__(self, tables: RoutingTables, inflight: InflightCounter, wall: Callable[[], float]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("tidegate_router_requests", "Requests answered, by model and HTTP status.",
                                ["model", "status"], registry=r)
        self.upstream_latency = Histogram(
            "tidegate_router_upstream_latency_seconds",
            "From sending to an engine to its response headers, per attempt.", ["model"],
            buckets=_LATENCY_BUCKETS, registry=r)
        self.duration = Histogram("tidegate_router_request_duration_seconds",
                                  "Whole request at the router, until the last byte.", ["model"],
                                  buckets=_LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("tidegate_router_ttft_seconds",
                              "Streaming requests: arrival at the router to the first body chunk sent.",
                              ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        # Per priority class (critical, standard, sheddable; "unknown" when refused before the
        # class was read). Separate series, so the per-model ones above keep their labels.
        self.class_requests = Counter(
            "tidegate_router_class_requests", "Requests answered, by model, priority class and HTTP status.",
            ["model", "priority", "status"], registry=r)
        self.class_ttft = Histogram(
            "tidegate_router_class_ttft_seconds",
            "Streaming requests: arrival at the router to the first body chunk sent, by priority class.",
            ["model", "priority"], buckets=_LATENCY_BUCKETS, registry=r)
        self.retries = Counter("tidegate_router_retries", "Retries to another replica, by reason.",
                               ["model", "reason"], registry=r)
        self.retry_refused = Counter("tidegate_router_retry_budget_exhausted",
                                     "Retries refused by the router-wide retry budget.", registry=r)
        self.upstream_errors = Counter("tidegate_router_upstream_errors",
                                       "Failed attempts to an engine, by replica and kind.",
                                       ["replica_id", "kind"], registry=r)
        self.client_disconnects = Counter("tidegate_router_client_disconnects",
                                          "Requests the client abandoned before the end.", registry=r)
        self.client_connection_events = Counter(
            "tidegate_router_client_connection_events",
            "Front-door events: idle client connections evicted, connections refused at the limit, header "
            "timeouts, parser-level HTTP errors; by kind.", ["kind"], registry=r)
        self.client_connections = Gauge("tidegate_router_client_connections", "Open client connections.",
                                        registry=r)
        self.tpot_plan_margin = Gauge(
            "tidegate_router_tpot_plan_margin",
            "Under admission: what the pool's TPOT target is divided by when planning (the 0.99 quantile of "
            "realized over planned TPOT of recent requests, 1 to 2; 1 = plans are met).", ["model"], registry=r)
        self.peer_routers = Gauge("tidegate_router_peer_routers",
                                  "Other routers whose load this router counts (their router-load records).",
                                  registry=r)
        self.peer_load_writes = Counter("tidegate_router_peer_load_writes",
                                        "Router-load records this router wrote to etcd for its peers.", registry=r)
        r.register(_StateCollector(tables, inflight, wall))
        # the per-request series, pre-bound (Children)
        self.requests_for = Children(self.requests)
        self.class_requests_for = Children(self.class_requests)
        self.duration_for = Children(self.duration)
        self.upstream_latency_for = Children(self.upstream_latency)
        self.ttft_for = Children(self.ttft)
        self.class_ttft_for = Children(self.class_ttft)
        self.tpot_plan_margin_for = Children(self.tpot_plan_margin)
