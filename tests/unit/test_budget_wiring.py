"""Admission budgets between the leader and the routers, over an in-memory store: the leader's
records (BudgetPublisher), a router's view of its share (AdmissionBudgets) and its presence."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tidegate import codec, keys
from tidegate.controlplane.admission_budgets import BudgetPublisher
from tidegate.controlplane.fleet import FleetState
from tidegate.policy.admission_budget import Tokens
from tidegate.policy.weights import WeightPolicyConfig
from tidegate.router.admission_budgets import AdmissionBudgets, BudgetCollector
from tidegate.store.api import Fence, KeyValue
from tidegate.store.memory import InMemoryStore
from tidegate.v1 import records_pb2

RS = records_pb2.ReplicaState


def entry(rid: str, state: int = RS.REPLICA_STATE_READY) -> records_pb2.RouteEntry:
    return records_pb2.RouteEntry(replica_id=rid, state=state, weight=50, kv_capacity_tokens=100000,
                                  prefill_tokens_per_s=10000, decode_step_base_ms=20, decode_step_per_seq_ms=0.5)


SLO = {"m": records_pb2.PoolSlo(pool="m", ttft_s=2.0, tpot_s=0.1)}


FENCE_KEY = "/tidegate/v1/election/controlplane/1"


async def leader_fence(store: InMemoryStore) -> Fence:
    await store.put(FENCE_KEY, b"cp")
    return Fence(FENCE_KEY, store.create_revision(FENCE_KEY))


def test_publisher_splits_and_rewrites_only_on_a_real_move() -> None:
    async def go() -> None:
        store = InMemoryStore()
        fence = await leader_fence(store)
        pub = BudgetPublisher(store, "cp", wall_clock=lambda: 1000.0)
        fleet = FleetState(WeightPolicyConfig(), now=lambda: 0.0)
        tables = {"m": [entry("a"), entry("b"), entry("c", RS.REPLICA_STATE_CORDONED)], "n": [entry("x")]}
        out = pub.compute(tables, fleet, SLO, {"r1", "r2"}, {"m": {"r1": Tokens(30000, 0, 0)}})
        m = out["m"]
        assert (m.total.prefill_tokens, m.total.kv_tokens, m.total.sequences) == (40000, 200000, 320)
        assert m.share_by_router["r1"].prefill_tokens == 30000 + 4000   # its demand + half the leftover
        assert not out["n"].HasField("total") and out["n"].reason == "no SLO targets"
        assert await pub.publish(lambda: fence) == ["m", "n"]
        stored = codec.decode((await store.get(keys.admission("m"))).value, records_pb2.AdmissionBudget)
        assert set(stored.share_by_router) == {"r1", "r2"}
        pub.compute(tables, fleet, SLO, {"r1", "r2"}, {"m": {"r1": Tokens(30100, 0, 0)}})
        assert await pub.publish(lambda: fence) == []                    # under 2 % of the total
        pub.compute(tables, fleet, SLO, {"r1"}, {})
        assert await pub.publish(lambda: None) == []                     # not leading: nothing
        assert await pub.publish(lambda: fence) == ["m"]                 # a router left
    asyncio.run(go())


def test_publisher_refused_by_its_fence_writes_nothing_and_steps_down() -> None:
    async def go() -> None:
        store, reasons = InMemoryStore(), []
        stale = await leader_fence(store)
        await store.delete(FENCE_KEY)                                    # its term ended
        pub = BudgetPublisher(store, "cp", wall_clock=lambda: 1000.0, on_fenced=reasons.append)
        pub.compute({"m": [entry("a")]}, FleetState(WeightPolicyConfig(), now=lambda: 0.0), SLO, {"r1"}, {})
        assert await pub.publish(lambda: stale) == []
        assert reasons and "no longer holds" in reasons[0]
        assert await store.get(keys.admission("m")) is None
        fresh = await leader_fence(store)
        assert await pub.publish(lambda: fresh) == ["m"]                 # not marked written: retried
    asyncio.run(go())


def test_router_takes_its_own_share() -> None:
    rec = records_pb2.AdmissionBudget(pool="m", total=records_pb2.TokenBudget(prefill_tokens=100, kv_tokens=1000,
                                                                              sequences=10),
                                      class_fraction={"sheddable": 0.5})
    rec.share_by_router["me"].CopyFrom(records_pb2.TokenBudget(prefill_tokens=40, kv_tokens=400, sequences=4))
    b = AdmissionBudgets(None, "me")
    key = keys.admission("m")
    b.apply(key, KeyValue(key, codec.encode(rec), 1))
    pool = b.get("m")
    assert pool.share == Tokens(40, 400, 4) and pool.class_fraction["sheddable"] == 0.5
    pool.acquire_tokens(Tokens.request(20, 20))
    assert not pool.allows_tokens("sheddable", Tokens.request(1)) and pool.allows_tokens("critical", Tokens.request(20))
    pool.refused_tokens(Tokens.request(5))
    assert b.demand() == {"m": Tokens(25, 35, 2)}   # KV: 20 + 20 / 2 held, 5 refused
    other = AdmissionBudgets(None, "someone-else")
    other.apply(key, KeyValue(key, codec.encode(rec), 1))
    assert other.get("m").share is None                                # not listed yet: no limit
    b.apply(key, KeyValue(key, b"garbage", 2))                         # kept as it was
    assert pool.share == Tokens(40, 400, 4)
    b.apply(key, None)
    assert pool.share is None


def test_presence_carries_error_streaks_and_demand() -> None:
    from tidegate.router.inflight import InflightCounter
    from tidegate.router.presence import presence_record
    from tidegate.router.tables import RoutingTables

    inflight = InflightCounter()
    for _ in range(3):
        inflight.failed("a")
    inflight.failed("b")
    inflight.succeeded("b")                                            # a success ends the streak
    rec = presence_record("r1", "eu", "http://x", inflight, RoutingTables(), 1.0,
                          {"m": Tokens(100, 300, 2)})
    assert dict(rec.consecutive_errors_by_replica) == {"a": 3}
    d = rec.demand_by_pool["m"]
    assert (d.prefill_tokens, d.kv_tokens, d.sequences) == (100, 300, 2)
    inflight.prune(keep=set())
    assert dict(inflight.error_streaks()) == {}


def test_the_routers_share_and_what_it_holds_are_scraped_per_unit() -> None:
    budgets = AdmissionBudgets(None, "r1")
    registry = CollectorRegistry()
    registry.register(BudgetCollector(budgets))

    def scraped() -> dict[tuple[str, str, str], float]:
        return {(s.name, s.labels["model"], s.labels["unit"]): s.value
                for family in text_string_to_metric_families(generate_latest(registry).decode())
                for s in family.samples}

    assert scraped() == {}                               # no pool known yet
    rec = records_pb2.AdmissionBudget(total=records_pb2.TokenBudget(prefill_tokens=4000, kv_tokens=9000,
                                                                     sequences=20))
    rec.share_by_router["r1"].CopyFrom(records_pb2.TokenBudget(prefill_tokens=1500, kv_tokens=4000, sequences=8))
    budgets.apply(keys.admission("m"), KeyValue(keys.admission("m"), codec.encode(rec), 1))
    hold = budgets.get("m").acquire_tokens(Tokens(700, 1000, 1))
    got = scraped()
    assert got[("tidegate_router_admission_budget_share", "m", "prefill_tokens")] == 1500
    assert got[("tidegate_router_admission_budget_share", "m", "sequences")] == 8
    assert got[("tidegate_router_admission_budget_held", "m", "prefill_tokens")] == 700
    hold.first_token()                                   # its prefill gives its room back
    assert scraped()[("tidegate_router_admission_budget_held", "m", "prefill_tokens")] == 0
    assert scraped()[("tidegate_router_admission_budget_held", "m", "kv_tokens")] == 1000
    budgets.apply(keys.admission("m"), None)             # the record went: no share, still what it holds
    got = scraped()
    assert ("tidegate_router_admission_budget_share", "m", "prefill_tokens") not in got
    assert got[("tidegate_router_admission_budget_held", "m", "sequences")] == 1
