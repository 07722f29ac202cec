"""The router's view of the routing tables in etcd: one immutable snapshot per pool.

Fed by a `WatchCache` over `tidegate.keys.TABLES`. A value that does not decode is
logged once and ignored: the pool keeps its previous table. An etcd outage changes
nothing here (the cache keeps its state and so do we); only a delete in etcd removes a pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import structlog

from tidegate import codec, keys
from tidegate.policy.registry import RouteInfo, SloTargets
from tidegate.store.api import KeyValue
from tidegate.v1.records_pb2 import RoutingTable

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class PoolTable:
    pool: str
    generation: int
    mod_revision: int
    computed_at_s: float | None      # unix seconds, None when the leader did not set it
    entries: tuple[RouteInfo, ...]
    slo: SloTargets | None = None    # the pool's SLO, carried in the same record (one revision)

    @property
    def has_replicas(self) -> bool:
        return bool(self.entries)


def to_pool_table(pool: str, kv: KeyValue) -> PoolTable:
    """Decode one stored RoutingTable (raises codec.DecodeError)."""
    msg = codec.decode(kv.value, RoutingTable)
    computed = msg.computed_at.ToMicroseconds() / 1e6 if msg.HasField("computed_at") else None
    entries = tuple(
        RouteInfo.from_entry(r)
        for r in msg.replicas
        if r.replica_id and r.endpoint
    )
    return PoolTable(pool, msg.generation, kv.mod_revision, computed, entries, _slo(msg))


def _slo(msg: RoutingTable) -> SloTargets | None:
    if not msg.HasField("slo"):
        return None
    try:
        return SloTargets(ttft_s=msg.slo.ttft_s, tpot_s=msg.slo.tpot_s)
    except ValueError:  # the control plane validates; a bad record means the policy default
        return None


class RoutingTables:
    """Snapshots per pool, updated by `on_change` (give it to the WatchCache).

    `synced` is set once the cache has listed the prefix; it never clears, so the
    router keeps routing with the last tables through an etcd outage.
    """

    def __init__(self) -> None:
        self._tables: dict[str, PoolTable] = {}
        self._view: Mapping[str, PoolTable] = MappingProxyType({})
        self._bad: dict[str, int] = {}  # key -> mod_revision of the value we could not decode
        self.synced = asyncio.Event()
        self.etcd_healthy = False
        self.changes = 0

    # -- reads ------------------------------------------------------------------------------

    def get(self, pool: str) -> PoolTable | None:
        return self._view.get(pool)

    def pools(self) -> Mapping[str, PoolTable]:
        """An immutable view of every pool's table (safe to keep across awaits)."""
        return self._view

    # -- writes (from the watch cache) ------------------------------------------------------

    def on_change(self, key: str, kv: KeyValue | None) -> None:
        try:
            pool = keys.leaf(keys.TABLES, key)
        except ValueError:
            return
        # Pool names are model names and may hold "/" (e.g. "meta-llama/Llama-3.1-8B-Instruct").
        if not pool:
            return
        if kv is None:
            self._bad.pop(key, None)
            if self._tables.pop(pool, None) is not None:
                log.info("table_removed", pool=pool)
                self._publish()
            return
        current = self._tables.get(pool)
        if current is not None and current.mod_revision == kv.mod_revision:
            return
        try:
            table = to_pool_table(pool, kv)
        except codec.DecodeError as exc:
            if self._bad.get(key) != kv.mod_revision:
                self._bad[key] = kv.mod_revision
                log.warning("table_decode_failed", pool=pool, mod_revision=kv.mod_revision,
                            error=str(exc), kept_generation=current.generation if current else None)
            return
        self._bad.pop(key, None)
        self._tables[pool] = table
        self._publish()

    def reconcile(self, items: Mapping[str, KeyValue]) -> None:
        """Level-triggered catch-up from the cache's full state (after a (re)list)."""
        for key, kv in items.items():
            self.on_change(key, kv)
        present = {keys.leaf(keys.TABLES, k) for k in items if k.startswith(keys.TABLES)}
        for pool in [p for p in self._tables if p not in present]:
            self.on_change(keys.table(pool), None)

    def mark_synced(self) -> None:
        if not self.synced.is_set():
            log.info("tables_synced", pools=sorted(self._tables))
            self.synced.set()

    def _publish(self) -> None:
        self.changes += 1
        self._view = MappingProxyType(dict(self._tables))
