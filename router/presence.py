"""Router presence: a leased `RouterPresence` record, refreshed with what we hold in flight."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

import structlog

from tidegate import codec, keys
from tidegate.policy.admission_budget import Tokens
from tidegate.router.admission_budgets import AdmissionBudgets
from tidegate.router.inflight import InflightCounter
from tidegate.router.tables import RoutingTables
from tidegate.store.lease import LeaseKeeper
from tidegate.v1.records_pb2 import RouterPresence, TokenBudget

log = structlog.get_logger(__name__)


def presence_record(router_id: str, region: str, url: str, inflight: InflightCounter, tables: RoutingTables,
                    wall_s: float, demand: Mapping[str, Tokens] | None = None) -> RouterPresence:
    rec = RouterPresence(router_id=router_id, region=region, url=url)
    rec.updated_at.FromNanoseconds(int(wall_s * 1e9))
    for rid, n in inflight.snapshot().items():
        if n > 0:
            rec.inflight_by_replica[rid] = n
    for pool, t in tables.pools().items():
        rec.table_generation_by_pool[pool] = t.generation
    for rid, n in inflight.error_streaks().items():
        rec.consecutive_errors_by_replica[rid] = min(n, 2**31 - 1)
    for pool, d in (demand or {}).items():
        rec.demand_by_pool[pool].CopyFrom(TokenBudget(prefill_tokens=d.prefill_tokens, kv_tokens=d.kv_tokens,
                                                      sequences=d.sequences))
    return rec


class PresencePublisher:
    def __init__(self, keeper: LeaseKeeper, router_id: str, region: str, url: str, inflight: InflightCounter,
                 tables: RoutingTables, interval_s: float = 2.0, wall: Callable[[], float] = time.time,
                 budgets: AdmissionBudgets | None = None) -> None:
        self._keeper = keeper
        self._key = keys.router(router_id)
        self._router_id = router_id
        self._region = region
        self._url = url
        self._inflight = inflight
        self._tables = tables
        self._interval_s = interval_s
        self._wall = wall
        self._budgets = budgets

    async def run(self) -> None:
        """Writes the record every interval until cancelled (LeaseKeeper.put never raises StoreError)."""
        while True:
            rec = presence_record(self._router_id, self._region, self._url, self._inflight, self._tables,
                                  self._wall(), self._budgets.demand() if self._budgets is not None else None)
            await self._keeper.put(self._key, codec.encode(rec))
            await asyncio.sleep(self._interval_s)
