"""One leadership term: restore the fleet from the last tables, warm up, then publish.

The driver around `tidegate.policy.continuity` (the pure rules). On becoming leader the term
begins: the publisher reads the last table of every pool from etcd, the replicas in them are
restored into the fleet as "unknown" (endpoint and location known, no report yet), and each
tick's computed tables pass through `continuity.check` before the publisher sees them. The
fault policy's state (ejections, backoff) is restored from etcd too and saved when it changes
(`controlplane.faultbook`).
Holds and carry-overs are logged when they start and when they end, not on every tick.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import structlog

from tidegate.controlplane.faultbook import FaultBook
from tidegate.controlplane.fleet import FleetState
from tidegate.controlplane.publisher import TablePublisher
from tidegate.errors import StoreError
from tidegate.policy import continuity
from tidegate.policy.weights import ReplicaView, compute_pool_tables
from tidegate.store.api import Fence
from tidegate.v1 import records_pb2

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Plan:
    tables: dict[str, Sequence[records_pb2.RouteEntry]]   # what may be published
    hold: frozenset[str]          # pools not to write this tick (warming up)
    computed: dict[str, list[records_pb2.RouteEntry]]    # what the views alone say
    views: list[ReplicaView]      # the fleet's views these tables were computed from
    at: float                     # when (monotonic) those views were taken


class Term:
    def __init__(self, fleet: FleetState, publisher: TablePublisher, cfg: continuity.ContinuityConfig, *,
                 faults: FaultBook | None = None, now: Callable[[], float] = time.monotonic) -> None:
        self._fleet = fleet
        self._faults = faults
        self._publisher = publisher
        self.cfg = cfg
        self._now = now
        self.started = now()
        self._restored = False
        self._holding: dict[str, tuple[str, ...]] = {}
        self._carrying: dict[str, tuple[str, ...]] = {}
        self._warm: set[str] = set()

    def begin(self) -> None:
        """Call on becoming leader (the publisher must have been `reset()`)."""
        self.started = self._now()
        self._restored = False
        self._holding.clear()
        self._carrying.clear()
        self._warm.clear()

    @property
    def ready(self) -> bool:
        """Whether this term restored its view (the last tables and fault states) yet."""
        return self._restored

    async def plan(self, pools: Collection[str] | None = None) -> Plan | None:
        """The tables to publish this tick (of `pools` only, when given); None until the last
        tables could be read."""
        if not await self._publisher.sync():
            return None
        previous = self._publisher.previous()
        if not self._restored:
            for pool, entries in previous.items():
                added = self._fleet.restore(entries, pool, at=self.started)
                if added:
                    log.info("term_restored", pool=pool, replicas=len(added))
            if self._faults is not None:
                try:
                    await self._faults.restore(self._fleet)
                except StoreError as e:
                    log.info("faults_restore_failed", error=str(e))
                    return None
            self._restored = True
        at = self._now()
        views = self._fleet.views(at, pools=pools)
        computed = compute_pool_tables(views, self._fleet.policy)
        heard = self._fleet.heard_since(self.started)
        age = self._now() - self.started
        tables: dict[str, Sequence[records_pb2.RouteEntry]] = {}
        hold = set()
        for pool in sorted((set(previous) | set(computed)) if pools is None else pools):
            v = continuity.check(previous.get(pool, ()), computed.get(pool, []), heard, age, self.cfg)
            self._log_changes(pool, v, age)
            if v.publish:
                tables[pool] = list(v.entries)
            else:
                hold.add(pool)
        return Plan(tables, frozenset(hold), computed, views, at)

    async def save_faults(self, fence: Callable[[], Fence | None]) -> None:
        """Persists fault states that changed (not before this term read the old ones)."""
        if self._faults is not None and self._restored:
            await self._faults.save(self._fleet, fence)

    def _log_changes(self, pool: str, v: continuity.Verdict, age: float) -> None:
        if v.publish:
            if pool not in self._warm:  # once per pool and term: how long the warm-up took
                self._warm.add(pool)
                self._holding.pop(pool, None)
                log.info("term_warm", pool=pool, term_age_s=round(age, 2), not_heard=len(v.waiting_for))
        elif v.waiting_for != self._holding.get(pool):
            self._holding[pool] = v.waiting_for
            log.info("term_warming_up", pool=pool, waiting_for=len(v.waiting_for), term_age_s=round(age, 2))
        if v.carried != self._carrying.get(pool, ()):
            log.info("term_carrying", pool=pool, carried=list(v.carried), term_age_s=round(age, 2))
        if v.carried:
            self._carrying[pool] = v.carried
        else:
            self._carrying.pop(pool, None)
