"""Writes one RoutingTable per pool to etcd, only when its routing content changed.

Decisions:
- The change test is `tidegate.policy.weights.routing_key` (replica, endpoint, location, state,
  weight); informational fields (KV tokens, queue, latencies, reason) are a snapshot taken at
  the last write and alone never cause one. Weights are quantised by the policy.
- `generation` increases by one per write of a pool. On becoming leader the publisher first
  reads the tables in etcd and continues from their generation, so generations never go back
  across leaders; then it writes every pool it knows, unconditionally.
- A pool this instance has seen but that has no replicas left gets an *empty* table (not a
  deleted key): routers then know the pool and answer "no capacity" rather than "unknown
  model", and the generation stays monotonic. Pools in etcd this instance never saw (an old
  leader's, whose agents have not reconnected here yet) are left untouched.
- The pool's SLO record (`slos`, from /tidegate/v1/slos/) travels inside its table, so a router
  reads the targets and the replicas they judge at one revision; a changed target is a change.
  `slos=None` (not read from etcd yet) writes nothing.
- etcd errors are logged once (and once when they clear); the next tick retries.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

import structlog
from google.protobuf import timestamp_pb2

from controlplane.metrics import Metrics
from tidegate import codec, keys
from tidegate.errors import StoreError
from tidegate.policy.weights import routing_key
from tidegate.store.api import Store
from tidegate.v1 import records_pb2

log = structlog.get_logger(__name__)

SCHEMA_VERSION = 1
NO_SLOS: Mapping[str, records_pb2.PoolSlo] = MappingProxyType({})


class TablePublisher:
    def __init__(
        self,
        store: Store,
        controlplane_id: str,
        *,
        metrics: Metrics | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._id = controlplane_id
        self._metrics = metrics
        self._wall = wall_clock
        self._generation: dict[str, int] = {}
        self._published: dict[str, tuple[object, ...]] = {}
        self._known_pools: set[str] = set()
        self._synced = False
        self._failing = False

    def reset(self) -> None:
        """Call on becoming leader: re-read generations, then write every known pool."""
        self._synced = False
        self._published.clear()

    def generation(self, pool: str) -> int:
        return self._generation.get(pool, 0)

    async def publish(
        self, tables: Mapping[str, Sequence[records_pb2.RouteEntry]], still_leader: Callable[[], bool],
        *, slos: Mapping[str, records_pb2.PoolSlo] | None = NO_SLOS,
    ) -> list[str]:
        """Writes the changed pools; returns their names. Never raises StoreError."""
        written: list[str] = []
        if slos is None:  # not read yet: a table without its SLO would loosen every router's targets
            return written
        try:
            if not self._synced:
                listing = await self._store.list_prefix(keys.TABLES)
                for kv in listing.items:
                    pool = keys.leaf(keys.TABLES, kv.key)
                    try:
                        gen = codec.decode(kv.value, records_pb2.RoutingTable).generation
                    except codec.DecodeError:
                        log.warning("table_undecodable", pool=pool)
                        continue
                    self._generation[pool] = max(self._generation.get(pool, 0), gen)
                self._synced = True
            self._known_pools.update(tables)
            for pool in sorted(self._known_pools):
                entries = list(tables.get(pool, ()))
                slo = slos.get(pool)  # routing-relevant: a new target changes every pick
                rkey = routing_key(entries) + ((slo.ttft_s, slo.tpot_s) if slo is not None else (),)
                if self._published.get(pool) == rkey:
                    continue
                if not still_leader():
                    break
                gen = self._generation.get(pool, 0) + 1
                self._generation[pool] = gen
                table = records_pb2.RoutingTable(
                    pool=pool, generation=gen, leader_id=self._id, replicas=entries,
                    schema_version=SCHEMA_VERSION,
                    computed_at=_timestamp(self._wall()),
                )
                if slo is not None:
                    table.slo.CopyFrom(slo)
                await self._store.put(keys.table(pool), codec.encode(table))
                self._published[pool] = rkey
                written.append(pool)
                if self._metrics:
                    self._metrics.tables_published.labels(pool=pool).inc()
                log.info("table_published", pool=pool, generation=gen, replicas=len(entries),
                         routable=sum(1 for e in entries if e.weight > 0))
        except StoreError as e:
            if self._metrics:
                self._metrics.publish_errors.inc()
            if not self._failing:
                self._failing = True
                log.warning("publish_failed", error=str(e))
            return written
        if self._failing:
            self._failing = False
            log.info("publish_recovered")
        return written


def _timestamp(t: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(t * 1e9))
    return ts
