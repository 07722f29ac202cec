"""Live routers share their load through etcd (tidegate/policy/peer_load.py says why).

Each router writes one `RouterLoad` record, under its presence lease, at
/tidegate/v1/router-load/<router_id>: per pool, its own load on each replica, the prefix blocks
its requests used since its previous record (peers pin them), those of its requests that finished
since (peers release them) and what its admission queue holds (prefill tokens per
class, its critical head's slack). `LoadPublisher` takes them every interval (0.05 s) and writes
only when something moved (an idle router writes nothing; one that hears no peer, at most once
a second). `PeerLoadWatcher` watches the prefix
and hands every other router's record to this router's pool policies (`on_peer_load`) and
admission queues (`on_held`: higher classes go first across routers); a record that goes (its
router stopped or lost its lease) is forgotten (`forget_peer`).

The publisher writes with the LeaseKeeper's lease but not through `LeaseKeeper.put`: that
remembers the value to re-put it after an outage, and logs every failure. A record's learned
and released blocks are those since the previous record, sent once; a failed write loses
them (peers' affinity is a little weaker; a lost release leaves a peer's pins only until the
router's record shows nothing in flight on that replica) and the next tick writes the load again.
Failures are logged when they start and when they stop, not ten times a second.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog
from google.protobuf.message import DecodeError

from tidegate import keys
from tidegate.errors import StoreError
from tidegate.policy.peer_load import LearnedBlocks, PeerReport, ReleasedBlocks, ReplicaLoadReport
from tidegate.policy.peer_queues import HeldReport
from tidegate.store.api import KeyValue, Store
from tidegate.store.lease import LeaseKeeper
from tidegate.store.watchcache import WatchCache
from tidegate.v1.records_pb2 import HeldHead, HeldLoad, ReplicaLoad, RouterLoad

log = structlog.get_logger(__name__)

# How often a router that hears no peer writes its record at most: often enough for a router
# that starts to find it (and so start reporting at the full rate), not 20 writes a second that
# nobody reads (measured: ~4 % of a router core's CPU, docs/BENCHMARKS.md "Router overhead").
LONE_INTERVAL_S = 1.0

# Prefix-block keys one record carries at most, over all its pools (8 bytes each: 1 MiB, under
# etcd's default 1.5 MiB request limit). Past it the rest of the delta is dropped: peers miss
# some blocks, as they do when a write fails.
MAX_RECORD_KEYS = 131_072

Policies = Callable[[], Mapping[str, Any]]   # pool -> policy instance (Proxy.policies)
PolicyFor = Callable[[str], Any]             # pool -> policy instance, created if new (Proxy.policy)
Held = Callable[[], Mapping[str, HeldReport]]  # pool -> what the admission queue holds (Gate.held_reports)
OnHeld = Callable[[str, str, HeldReport | None], None]   # (peer, pool, its report or None: nothing held)


# ---------------------------------------------------------------------- record <-> reports (pure)

def load_record(router_id: str, wall_s: float, reports: Mapping[str, PeerReport],
                max_keys: int = MAX_RECORD_KEYS, held: Mapping[str, HeldReport] | None = None) -> RouterLoad:
    """The record of a router's per-pool reports and admission queues; learned keys past
    `max_keys` are left out."""
    rec = RouterLoad(router_id=router_id)
    rec.updated_at.FromNanoseconds(int(wall_s * 1e9))
    for pool, h in (held or {}).items():
        rec.pools[pool].held.CopyFrom(HeldLoad(
            tokens=dict(h.tokens), critical_slack_s=h.critical_slack_s,
            heads={c: HeldHead(age_s=age, prefill_tokens=t) for c, (age, t) in h.heads.items()}))
    room = max_keys
    for pool, report in reports.items():
        p = rec.pools[pool]
        for rid, r in report.loads.items():
            p.replicas[rid].CopyFrom(ReplicaLoad(queued_prefill=r.queued_prefill, waiting=r.waiting,
                                                 decoding=r.decoding, kv=r.kv, placed_s=r.placed_s,
                                                 budgets=r.budgets))
        for b in report.learned:
            if room <= 0:
                break
            keys_ = b.keys[:room]
            room -= len(keys_)
            p.learned.add(replica_id=b.replica_id, keys=keys_, tokens_per_block=b.tokens_per_block)
    # Releases after every pool's learned blocks, in the same budget: a release cut off leaves
    # the peer's pins until it reports nothing in flight there (PeerPins.settle); a learned key
    # cut off is released by nobody, since a release applies only to what was pinned.
    for pool, report in reports.items():
        for rel in report.released:
            if room <= 0:
                break
            keys_ = rel.keys[:room]
            room -= len(keys_)
            rec.pools[pool].released.add(replica_id=rel.replica_id, keys=keys_)
    return rec


def peer_reports(rec: RouterLoad) -> dict[str, PeerReport]:
    """Per pool, the report a record carries. Raises ValueError when a figure is out of range
    (negative, NaN, infinite): the whole record is refused, not a part of it."""
    out = {}
    for pool, p in rec.pools.items():
        loads = {rid: ReplicaLoadReport(r.queued_prefill, r.waiting, r.decoding, r.kv, r.placed_s, tuple(r.budgets))
                 for rid, r in p.replicas.items()}
        learned = tuple(LearnedBlocks(b.replica_id, tuple(b.keys), b.tokens_per_block) for b in p.learned)
        released = tuple(ReleasedBlocks(r.replica_id, tuple(r.keys)) for r in p.released)
        out[pool] = PeerReport(loads, learned, released)
    return out


def held_reports(rec: RouterLoad) -> dict[str, HeldReport]:
    """Per pool whose queue holds something, what the record says it holds. Raises ValueError
    on an unknown class or a figure out of range (the whole record is refused)."""
    out = {}
    for pool, p in rec.pools.items():
        if p.HasField("held"):
            slack = p.held.critical_slack_s if p.held.HasField("critical_slack_s") else None
            heads = {c: (h.age_s, h.prefill_tokens) for c, h in p.held.heads.items()}
            out[pool] = HeldReport(dict(p.held.tokens), slack, heads)
    return out


# ---------------------------------------------------------------------- publisher

class LoadPublisher:
    def __init__(self, store: Store, keeper: LeaseKeeper, router_id: str, policies: Policies,
                 interval_s: float = 0.05, wall: Callable[[], float] = time.time,
                 on_write: Callable[[], None] = lambda: None, held: Held = dict,
                 alone: Callable[[], bool] = lambda: False, lone_interval_s: float = LONE_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._keeper = keeper
        self._router_id = router_id
        self._key = keys.router_load(router_id)
        self._policies = policies
        self._interval_s = interval_s
        self._wall = wall
        self._on_write = on_write
        self._held = held
        self._alone = alone
        self._lone_interval_s = lone_interval_s
        self._clock = clock
        # What the last landed write said of the load, and under which lease (a new lease has
        # no record yet: the old one went with the old lease).
        self._written: dict[str, Mapping[str, ReplicaLoadReport]] = {}
        self._written_held: Mapping[str, HeldReport] = {}
        self._written_lease = 0
        self._failing = False
        self.writes = 0   # records written (landed)

    def _take(self) -> dict[str, PeerReport]:
        return {pool: p.take_report() for pool, p in self._policies().items() if hasattr(p, "take_report")}

    async def publish_once(self) -> bool:
        """Takes the pools' reports and writes them when they say something new. True when a
        record landed. Never raises StoreError: a failed write loses its learned blocks."""
        reports = self._take()   # empties the policies' learned blocks whether or not it lands
        lease = self._keeper.lease_id
        held = dict(self._held())
        loads = {pool: r.loads for pool, r in reports.items() if r.loads}
        learned = any(r.learned or r.released for r in reports.values())
        if not lease:
            return False
        if (not learned and loads == self._written and held == self._written_held
                and (lease == self._written_lease or not (loads or held))):
            return False
        value = load_record(self._router_id, self._wall(), reports, held=held).SerializeToString()
        try:
            await self._store.put(self._key, value, lease=lease)
        except StoreError as e:   # LeaseNotFoundError too: the keeper finds out on its next refresh
            if not self._failing:
                self._failing = True
                log.warning("peer_load_write_failed", error=str(e))
            return False
        if self._failing:
            self._failing = False
            log.info("peer_load_write_recovered")
        self._written, self._written_held, self._written_lease = loads, held, lease
        self.writes += 1
        self._on_write()
        return True

    async def run(self) -> None:
        """Publishes every interval until cancelled. Never raises: a bug in one tick must not end
        the router's reports silently (logged once until a tick succeeds)."""
        broken = False
        last = -math.inf
        while True:
            try:
                now = self._clock()
                if not self._alone() or now - last >= self._lone_interval_s:
                    last = now
                    await self.publish_once()
                broken = False
            except Exception:
                if not broken:
                    broken = True
                    log.exception("peer_load_publish_failed")
            await asyncio.sleep(self._interval_s)


# ---------------------------------------------------------------------- watcher

class PeerLoadWatcher:
    def __init__(self, store: Store, router_id: str, policy_for: PolicyFor, policies: Policies,
                 on_held: OnHeld | None = None) -> None:
        self._router_id = router_id
        self._policy_for = policy_for
        self._policies = policies
        self._on_held = on_held
        self._pools: dict[str, frozenset[str]] = {}   # peer router -> the pools of its last record
        self._refused: set[str] = set()               # peers whose last record was refused (logged once)
        self.cache = WatchCache(store, keys.ROUTER_LOADS, on_change=self.on_change)

    @property
    def peers(self) -> int:
        """Peer routers whose load this router counts."""
        return len(self._pools)

    async def run(self) -> None:
        await self.cache.run()

    def on_change(self, key: str, kv: KeyValue | None) -> None:
        peer = keys.leaf(keys.ROUTER_LOADS, key)
        if peer == self._router_id:
            return
        if kv is None:
            gone = self._pools.pop(peer, frozenset())
            self._refused.discard(peer)
            self._forget(peer, frozenset(self._policies()) | gone)
            return
        try:
            rec = RouterLoad.FromString(kv.value)
            reports, held = peer_reports(rec), held_reports(rec)
        except (DecodeError, ValueError) as e:
            if peer not in self._refused:   # once per peer until it sends a good one: values not logged
                self._refused.add(peer)
                log.warning("peer_load_refused", peer=peer, error=type(e).__name__)
            return
        self._refused.discard(peer)
        for pool, report in reports.items():
            policy = self._policy_for(pool)
            if hasattr(policy, "on_peer_load"):
                # Its own id in the peers' namespace (slo_pick: the replicas it owns among them).
                if hasattr(policy, "bind_router"):
                    policy.bind_router(self._router_id)
                policy.on_peer_load(peer, report)
        if self._on_held is not None:
            for pool in reports:
                self._on_held(peer, pool, held.get(pool))
        before = self._pools.get(peer, frozenset())
        self._pools[peer] = frozenset(reports)
        self._forget(peer, before - self._pools[peer])

    def _forget(self, peer: str, pools: frozenset[str]) -> None:
        policies = self._policies()
        for pool in pools:
            policy = policies.get(pool)
            if policy is not None and hasattr(policy, "forget_peer"):
                policy.forget_peer(peer)
            if self._on_held is not None:
                self._on_held(peer, pool, None)
