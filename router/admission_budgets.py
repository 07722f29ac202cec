"""This router's share of every pool's admission budget (tidegate.policy.admission_budget).

Watches /tidegate/v1/admission/ and keeps one `RouterBudget` per pool, fed with the share the
leader wrote for this router id. What it holds is counted whether or not a share exists (so the
first share applies to the requests already in flight). A pool without a record, a record
without a total (no SLO, rates not fitted) or without this router's id (just started: the
leader lists it from its next presence write) has no share: requests pass. If etcd goes away
the last share stays in force: it was fair when written, and routers must keep serving.
The demand per pool (held + refused lately) goes into this router's presence record.
"""

from __future__ import annotations

from collections.abc import Iterator

import structlog
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tidegate import codec, keys
from tidegate.policy.admission_budget import RouterBudget, Tokens
from tidegate.store.api import KeyValue, Store
from tidegate.store.watchcache import WatchCache
from tidegate.v1 import records_pb2

log = structlog.get_logger(__name__)


def share_of(rec: records_pb2.AdmissionBudget, router_id: str) -> Tokens | None:
    if not rec.HasField("total") or router_id not in rec.share_by_router:
        return None
    s = rec.share_by_router[router_id]
    return Tokens(s.prefill_tokens, s.kv_tokens, s.sequences)


class AdmissionBudgets:
    def __init__(self, store: Store | None, router_id: str) -> None:
        self.router_id = router_id
        self._pools: dict[str, RouterBudget] = {}
        self.cache = WatchCache(store, keys.ADMISSION, on_change=self.apply) if store is not None else None

    def apply(self, key: str, kv: KeyValue | None) -> None:
        pool = keys.leaf(keys.ADMISSION, key)
        budget = self.get(pool)
        if kv is None:
            budget.set_share(None)
            return
        try:
            rec = codec.decode(kv.value, records_pb2.AdmissionBudget)
        except codec.DecodeError:
            log.warning("admission_budget_undecodable", pool=pool)
            return
        budget.set_share(share_of(rec, self.router_id), dict(rec.class_fraction))

    def get(self, pool: str) -> RouterBudget:
        budget = self._pools.get(pool)
        if budget is None:
            budget = self._pools[pool] = RouterBudget()
        return budget

    def pools(self) -> dict[str, RouterBudget]:
        """Every pool's budget this router knows (read-only use: metrics)."""
        return dict(self._pools)

    def demand(self) -> dict[str, Tokens]:
        """Per pool: held now + refused since the last call (resets the refused part)."""
        out = {}
        for pool, b in self._pools.items():
            d = b.demand()
            if any(d.values()):
                out[pool] = d
        return out

    async def run(self) -> None:
        if self.cache is not None:
            await self.cache.run()


UNITS = ("prefill_tokens", "kv_tokens", "sequences")   # Tokens.values() order


class BudgetCollector(Collector):
    """This router's share of each pool's budget and what it holds of it, per unit, read at scrape
    time from the ledger (no copy to keep in sync): how close the router is to refusing
    (`budget_exhausted`, or holding in the admission queue). A pool without a share has no share
    series: it admits on its other rules."""

    def __init__(self, budgets: AdmissionBudgets) -> None:
        self._budgets = budgets

    def collect(self) -> Iterator[GaugeMetricFamily]:
        share = GaugeMetricFamily("tidegate_router_admission_budget_share",
                                  "This router's share of the pool's admission budget, per unit.",
                                  labels=["model", "unit"])
        held = GaugeMetricFamily("tidegate_router_admission_budget_held",
                                 "What this router's admitted requests hold of the pool's budget now, per unit "
                                 "(prefill_tokens until their first token).", labels=["model", "unit"])
        for pool, b in sorted(self._budgets.pools().items()):
            for unit, v in zip(UNITS, b.held.values(), strict=True):
                held.add_metric([pool, unit], v)
            if b.share is not None:
                for unit, v in zip(UNITS, b.share.values(), strict=True):
                    share.add_metric([pool, unit], v)
        yield share
        yield held
