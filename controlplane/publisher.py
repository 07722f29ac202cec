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
- Every write is fenced (`Store.put_fenced`): a transaction conditioned on the writer's
  election key, so a deposed leader's write cannot land. A refused fence calls `on_fenced`
  (the control plane steps down) and stops this round.
- The last table of each pool (read from etcd on becoming leader, then what we wrote) is kept:
  `previous()` is what `tidegate.policy.continuity` compares a new table against, and pools the
  caller puts in `hold` are not written this round.
- The pool's SLO record (`slos`, from /tidegate/v1/slos/) travels inside its table, so a router
  reads the targets and the replicas they judge at one revision; a changed target is a change.
  `slos=None` (not read from etcd yet) writes nothing.
- The changed pools are written concurrently, all under one fence taken before the writes; a
  pool whose write failed stays unpublished and is retried next tick.
- etcd errors are logged once (and once when they clear); the next tick retries.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from types import MappingProxyType

import structlog
from google.protobuf import timestamp_pb2

from tidegate import codec, keys
from tidegate.controlplane.fenced import put_all
from tidegate.controlplane.metrics import Metrics
from tidegate.errors import StoreError
from tidegate.policy.weights import routing_key
from tidegate.store.api import Fence, FencedError, Store
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
        on_fenced: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self._store = store
        self._on_fenced = on_fenced
        self._previous: dict[str, tuple[records_pb2.RouteEntry, ...]] = {}
        self._id = controlplane_id
        self._metrics = metrics
        self._wall = wall_clock
        self._generation: dict[str, int] = {}
        self._published: dict[str, tuple[object, ...]] = {}
        self._known_pools: set[str] = set()
        self._computed_at: dict[str, float] = {}   # pool -> when the views behind its last write were taken
        self._lock = asyncio.Lock()   # the tick and the urgent republish of one pool may overlap
        self._synced = False
        self._failing = False

    def reset(self) -> None:
        """Call on becoming leader: re-read generations, then write every known pool."""
        self._synced = False
        self._published.clear()

    @property
    def synced(self) -> bool:
        return self._synced

    def generation(self, pool: str) -> int:
        return self._generation.get(pool, 0)

    def previous(self) -> Mapping[str, tuple[records_pb2.RouteEntry, ...]]:
        """The last table of each pool: as read from etcd on becoming leader, then as written."""
        return dict(self._previous)

    async def sync(self) -> bool:
        """Reads the tables in etcd once per term (generations and `previous()`). Returns
        whether this is done; never raises StoreError."""
        if self._synced:
            return True
        try:
            listing = await self._store.list_prefix(keys.TABLES)
        except StoreError as e:
            self._store_failed(e)
            return False
        for kv in listing.items:
            pool = keys.leaf(keys.TABLES, kv.key)
            try:
                table = codec.decode(kv.value, records_pb2.RoutingTable)
            except codec.DecodeError:
                log.warning("table_undecodable", pool=pool)
                continue
            self._generation[pool] = max(self._generation.get(pool, 0), table.generation)
            self._previous[pool] = tuple(table.replicas)
        self._synced = True
        return True

    def _store_failed(self, e: StoreError) -> None:
        if self._metrics:
            self._metrics.publish_errors.inc()
        if not self._failing:
            self._failing = True
            log.warning("publish_failed", error=str(e))

    async def publish(
        self, tables: Mapping[str, Sequence[records_pb2.RouteEntry]], fence: Callable[[], Fence | None],
        *, hold: Collection[str] = (), slos: Mapping[str, records_pb2.PoolSlo] | None = NO_SLOS,
        only: Collection[str] | None = None, computed_at: float | None = None,
    ) -> list[str]:
        """Writes the changed pools, except those in `hold`, each fenced by `fence()` (nothing is
        written while it is None); returns their names. With `only`, looks at those pools alone
        (the others are left as they are, not treated as empty). `computed_at` (monotonic time of
        the views behind `tables`): a pool last written from newer views is skipped, so a slow
        tick cannot overwrite what an urgent republish wrote meanwhile. Never raises StoreError."""
        async with self._lock:
            return await self._publish(tables, fence, hold, slos, only, computed_at)

    async def _publish(
        self, tables: Mapping[str, Sequence[records_pb2.RouteEntry]], fence: Callable[[], Fence | None],
        hold: Collection[str], slos: Mapping[str, records_pb2.PoolSlo] | None, only: Collection[str] | None,
        computed_at: float | None,
    ) -> list[str]:
        written: list[str] = []
        if slos is None:  # not read yet: a table without its SLO would loosen every router's targets
            return written
        if not await self.sync():
            return written
        try:
            self._known_pools.update(tables)
            changed: list[tuple[str, int, tuple[object, ...], list[records_pb2.RouteEntry], bytes]] = []
            for pool in sorted(self._known_pools if only is None else self._known_pools & set(only)):
                if pool in hold or computed_at is not None and computed_at < self._computed_at.get(pool, computed_at):
                    continue
                entries = list(tables.get(pool, ()))
                slo = slos.get(pool)  # routing-relevant: a new target changes every pick
                rkey: tuple[object, ...] = routing_key(entries) + ((slo.ttft_s, slo.tpot_s) if slo is not None else (),)
                if self._published.get(pool) == rkey:
                    continue
                gen = self._generation.get(pool, 0) + 1
                table = records_pb2.RoutingTable(
                    pool=pool, generation=gen, leader_id=self._id, replicas=entries,
                    schema_version=SCHEMA_VERSION,
                    computed_at=_timestamp(self._wall()),
                )
                if slo is not None:
                    table.slo.CopyFrom(slo)
                changed.append((pool, gen, rkey, entries, codec.encode(table)))
            current = fence() if changed else None
            if current is not None:
                # Every changed pool at once: a tick's writes cost one etcd round trip, not one per
                # pool (sequential writes made a tick of tens of pools, and so propagation, slow).
                landed, error = await put_all(self._store, [(keys.table(c[0]), c[4]) for c in changed],
                                              current)
                for (pool, gen, rkey, entries, _), ok in zip(changed, landed, strict=True):
                    if not ok:
                        continue
                    self._generation[pool] = gen
                    self._published[pool] = rkey
                    self._previous[pool] = tuple(entries)
                    if computed_at is not None:
                        self._computed_at[pool] = computed_at
                    written.append(pool)
                    if self._metrics:
                        self._metrics.tables_published.labels(pool=pool).inc()
                    log.info("table_published", pool=pool, generation=gen, replicas=len(entries),
                             routable=sum(1 for e in entries if e.weight > 0))
                if error is not None:
                    raise error
        except FencedError as e:
            log.warning("publish_fenced", error=str(e))
            self._on_fenced(str(e))
            return written
        except StoreError as e:
            self._store_failed(e)
            return written
        if self._failing:
            self._failing = False
            log.info("publish_recovered")
        return written


def _timestamp(t: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(t * 1e9))
    return ts
