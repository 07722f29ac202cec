"""The router's Prometheus metrics, in a per-process registry (no global registry)."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

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


class _CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class _HistogramChild:
    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self._bounds, value)] += 1  # le: the first bound >= value
        self.sum += value


class _Hot(Collector):
    """A labelled metric for the proxy's per-request path: its children are plain numbers that
    the event loop's thread alone writes, read at scrape time (prometheus_client's own take a
    lock on every inc or observe, a few per request). `labels()` caches each child, so its bound
    method is what the proxy calls per request. Exposed as prometheus_client exposes the same
    metric, without the `_created` series; children in order of first use, as it does."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self._name, self._doc, self._labelnames = name, documentation, list(labelnames)
        self._children: dict[tuple[str, ...], Any] = {}

    def _child(self) -> Any:
        raise NotImplementedError

    def labels(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._child()
        return child


class HotCounter(_Hot):
    def _child(self) -> _CounterChild:
        return _CounterChild()

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self._name, self._doc, labels=self._labelnames)
        for values, child in self._children.items():
            family.add_metric(list(values), child.value)
        yield family


class HotHistogram(_Hot):
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]) -> None:
        super().__init__(name, documentation, labelnames)
        self._bounds = tuple(float(b) for b in buckets)
        self._les = [floatToGoString(b) for b in self._bounds] + ["+Inf"]

    def _child(self) -> _HistogramChild:
        return _HistogramChild(self._bounds)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self._name, self._doc, labels=self._labelnames)
        for values, child in self._children.items():
            cumulative, buckets = 0, []
            for le, n in zip(self._les, child.counts, strict=True):
                cumulative += n
                buckets.append((le, cumulative))
            family.add_metric(list(values), buckets, child.sum)
        yield family


class Children:
    """One metric's children by label values, each looked up once: prometheus_client's labels()
    checks, converts and locks on every call, a few times per request on the proxy's hot path.
    For label sets bounded by design (pools, statuses, classes); never removed from the metric."""

    __slots__ = ("_metric", "_children")

    def __init__(self, metric: Any) -> None:
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
        # The per-request series: HotCounter / HotHistogram (no lock per request).
        self.requests = HotCounter("tidegate_router_requests", "Requests answered, by model and HTTP status.",
                                   ["model", "status"])
        self.upstream_latency = HotHistogram(
            "tidegate_router_upstream_latency_seconds",
            "From sending to an engine to its response headers, per attempt.", ["model"], _LATENCY_BUCKETS)
        self.duration = HotHistogram("tidegate_router_request_duration_seconds",
                                     "Whole request at the router, until the last byte.", ["model"],
                                     _LATENCY_BUCKETS)
        self.ttft = HotHistogram("tidegate_router_ttft_seconds",
                                 "Streaming requests: arrival at the router to the first body chunk sent.",
                                 ["model"], _LATENCY_BUCKETS)
        # Per priority class (critical, standard, sheddable; "unknown" when refused before the
        # class was read). Separate series, so the per-model ones above keep their labels.
        self.class_requests = HotCounter(
            "tidegate_router_class_requests", "Requests answered, by model, priority class and HTTP status.",
            ["model", "priority", "status"])
        self.class_ttft = HotHistogram(
            "tidegate_router_class_ttft_seconds",
            "Streaming requests: arrival at the router to the first body chunk sent, by priority class.",
            ["model", "priority"], _LATENCY_BUCKETS)
        for hot in (self.requests, self.upstream_latency, self.duration, self.ttft, self.class_requests,
                    self.class_ttft):
            r.register(hot)
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
        self.requests_for = self.requests.labels     # the hot metrics cache their children themselves
        self.class_requests_for = self.class_requests.labels
        self.duration_for = self.duration.labels
        self.upstream_latency_for = self.upstream_latency.labels
        self.ttft_for = self.ttft.labels
        self.class_ttft_for = self.class_ttft.labels
        self.tpot_plan_margin_for = Children(self.tpot_plan_margin)
