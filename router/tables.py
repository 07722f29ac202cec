"""The router's view of the routing tables in etcd: one immutable snapshot per pool.

Fed by a `WatchCache` over `tidegate.keys.TABLES`. A value that does not decode is
logged once and ignored: the pool keeps its previous table. An etcd outage changes
nothing here (the cache keeps its state and so do we); only a delete in etcd removes a pool.

Panic threshold (as Envoy's healthy panic threshold): a new table in which fewer than
`panic_threshold` (50%) of the previously routable replicas are still routable, because
replicas *vanished* (absent, or STALE/JOINING with weight 0, i.e. not a decision such as
cordon, drain or eject), is suspect: more likely a control plane that lost its memory than
half a fleet dying at once. The router then keeps routing to the last known set: the new
table with each vanished replica's previous entry put back. It logs this (at most every 10 s
per pool), shows it in /health and `tidegate_router_table_suspect`, and accepts the new
table once a table is no longer suspect or after `panic_max_s`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import structlog

from tidegate import codec, keys
from tidegate.policy.registry import RouteInfo, SloTargets
from tidegate.store.api import KeyValue
from tidegate.v1.records_pb2 import ReplicaState, RoutingTable

log = structlog.get_logger(__name__)

PANIC_THRESHOLD = 0.5
PANIC_MAX_S = 60.0
_VANISHED_STATES = frozenset({ReplicaState.REPLICA_STATE_STALE, ReplicaState.REPLICA_STATE_JOINING})
_PANIC_LOG_EVERY_S = 10.0


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


def vanished(trusted: PoolTable, new: PoolTable) -> tuple[str, ...]:
    """Replicas routable in `trusted` that `new` lost without a decision: absent, or weight 0 in
    a STALE/JOINING state."""
    now = {e.replica_id: e for e in new.entries}
    out = []
    for e in trusted.entries:
        if e.weight <= 0:
            continue
        n = now.get(e.replica_id)
        if n is None or (n.weight <= 0 and n.state in _VANISHED_STATES):
            out.append(e.replica_id)
    return tuple(out)


def is_suspect(trusted: PoolTable, new: PoolTable, threshold: float = PANIC_THRESHOLD) -> tuple[str, ...]:
    """The vanished replicas when `new` is suspect against `trusted` (see the module
    docstring), else (). Pure."""
    lost = vanished(trusted, new)
    if not lost:
        return ()
    base = sum(1 for e in trusted.entries if e.weight > 0)
    routable_now = sum(1 for e in new.entries if e.weight > 0)
    return lost if routable_now < threshold * base else ()


def keep_vanished(new: PoolTable, trusted: PoolTable, lost: tuple[str, ...]) -> PoolTable:
    """`new` with each lost replica's entry from `trusted` (the last known set)."""
    old = {e.replica_id: e for e in trusted.entries if e.replica_id in lost}
    entries = [old.pop(e.replica_id, e) for e in new.entries]
    entries.extend(old[rid] for rid in lost if rid in old)
    return replace(new, entries=tuple(entries))


@dataclass
class Panic:
    """A pool whose latest table is suspect."""

    since: float
    lost: tuple[str, ...]
    latest: PoolTable                # the suspect table as published
    logged_at: float
    suppressed: int = field(default=0)


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

    def __init__(self, *, panic_threshold: float = PANIC_THRESHOLD, panic_max_s: float = PANIC_MAX_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._panic_threshold = panic_threshold
        self._panic_max_s = panic_max_s
        self._clock = clock
        self._trusted: dict[str, PoolTable] = {}   # the last table that was not suspect
        self._panic: dict[str, Panic] = {}
        self._tables: dict[str, PoolTable] = {}
        self._view: Mapping[str, PoolTable] = MappingProxyType({})
        self._bad: dict[str, int] = {}  # key -> mod_revision of the value we could not decode
        self.synced = asyncio.Event()
        self.etcd_healthy = False
        self.changes = 0

    # -- reads ------------------------------------------------------------------------------

    def get(self, pool: str) -> PoolTable | None:
        if self._panic:
            self._expire_panics()
        return self._view.get(pool)

    def pools(self) -> Mapping[str, PoolTable]:
        """An immutable view of every pool's table (safe to keep across awaits)."""
        if self._panic:
            self._expire_panics()
        return self._view

    def suspect(self) -> Mapping[str, Panic]:
        """Pools whose latest table is suspect (we route on the last known set)."""
        if self._panic:
            self._expire_panics()
        return dict(self._panic)

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
            self._trusted.pop(pool, None)
            self._panic.pop(pool, None)
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
        self._tables[pool] = self._admit(pool, table)
        self._publish()

    def _admit(self, pool: str, table: PoolTable) -> PoolTable:
        """The table to route on: `table`, or the last known set when `table` is suspect."""
        trusted = self._trusted.get(pool)
        lost = is_suspect(trusted, table, self._panic_threshold) if trusted is not None else ()
        panic = self._panic.get(pool)
        now = self._clock()
        if not lost or (panic is not None and now - panic.since >= self._panic_max_s):
            if panic is not None:
                log.info("table_panic_cleared", pool=pool, generation=table.generation,
                         after_s=round(now - panic.since, 1), suppressed=panic.suppressed,
                         reason="table no longer suspect" if not lost else "panic_max_s reached")
                del self._panic[pool]
            self._trusted[pool] = table
            return table
        assert trusted is not None
        if panic is None:
            self._panic[pool] = Panic(since=now, lost=lost, latest=table, logged_at=now)
            log.warning("table_suspect", pool=pool, generation=table.generation, vanished=len(lost),
                        routable_before=sum(1 for e in trusted.entries if e.weight > 0),
                        routable_now=sum(1 for e in table.entries if e.weight > 0),
                        action="routing to the last known set")
        else:
            panic.lost, panic.latest = lost, table
            if now - panic.logged_at >= _PANIC_LOG_EVERY_S:
                log.warning("table_suspect", pool=pool, generation=table.generation, vanished=len(lost),
                            since_s=round(now - panic.since, 1), suppressed=panic.suppressed)
                panic.logged_at, panic.suppressed = now, 0
            else:
                panic.suppressed += 1
        return keep_vanished(table, trusted, lost)

    def _expire_panics(self) -> None:
        now = self._clock()
        expired = [p for p, panic in self._panic.items() if now - panic.since >= self._panic_max_s]
        for pool in expired:
            panic = self._panic[pool]
            self._tables[pool] = self._admit(pool, panic.latest)
        if expired:
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
