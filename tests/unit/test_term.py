"""controlplane.term: a new term restores the last tables, holds until the agents report, then
publishes every replica (over InMemoryStore and a fake clock; no timings)."""

from __future__ import annotations

import structlog
from test_fleet_state import FakeClock, hello, report  # type: ignore[import-not-found]

from tidegate import codec, keys
from tidegate.controlplane.fleet import FleetState
from tidegate.controlplane.publisher import TablePublisher
from tidegate.controlplane.term import Term
from tidegate.policy.continuity import ContinuityConfig
from tidegate.policy.weights import WeightPolicyConfig
from tidegate.store.api import Fence
from tidegate.store.memory import InMemoryStore
from tidegate.v1 import records_pb2

RS = records_pb2.ReplicaState


async def _setup() -> tuple[InMemoryStore, FakeClock, FleetState, TablePublisher, Term]:
    store = InMemoryStore()
    last = records_pb2.RoutingTable(pool="m", generation=7, leader_id="old", replicas=[
        records_pb2.RouteEntry(replica_id=r, endpoint=f"http://{r}", weight=50, state=RS.REPLICA_STATE_READY)
        for r in ("r1", "r2")])
    await store.put(keys.table("m"), codec.encode(last))
    clock = FakeClock()
    fleet = FleetState(WeightPolicyConfig(stale_after_s=3, remove_after_s=30), now=clock)
    publisher = TablePublisher(store, "new")
    term = Term(fleet, publisher, ContinuityConfig(warmup_s=5, stale_after_s=3), now=clock)
    publisher.reset()
    term.begin()
    return store, clock, fleet, publisher, term


async def _publish(store: InMemoryStore, publisher: TablePublisher, term: Term) -> records_pb2.RoutingTable | None:
    await store.put("/tidegate/v1/election/controlplane/1", b"x")
    fence = Fence("/tidegate/v1/election/controlplane/1", store.create_revision("/tidegate/v1/election/controlplane/1"))
    plan = await term.plan()
    assert plan is not None
    written = await publisher.publish(plan.tables, lambda: fence, hold=plan.hold)
    if not written:
        return None
    kv = await store.get(keys.table("m"))
    assert kv is not None
    return codec.decode(kv.value, records_pb2.RoutingTable)


async def test_holds_until_every_replica_reports_then_publishes_all() -> None:
    store, clock, fleet, publisher, term = await _setup()
    with structlog.testing.capture_logs() as logs:
        assert await _publish(store, publisher, term) is None
    assert {v.replica_id for v in fleet.views()} == {"r1", "r2"}  # restored, not forgotten
    assert [e["event"] for e in logs] == ["term_restored", "term_warming_up"]
    fleet.on_report(hello("r1"), report())
    clock.t += 0.5
    assert await _publish(store, publisher, term) is None  # r2 not heard yet
    fleet.on_report(hello("r2"), report())
    table = await _publish(store, publisher, term)
    assert table is not None and table.generation == 8 and table.leader_id == "new"
    assert [(r.replica_id, r.weight > 0) for r in table.replicas] == [("r1", True), ("r2", True)]


async def test_after_the_warm_up_an_unheard_replica_is_carried_then_stale() -> None:
    store, clock, fleet, publisher, term = await _setup()
    fleet.on_report(hello("r1"), report())
    clock.t += 5.0
    fleet.on_report(hello("r1"), report())
    table = await _publish(store, publisher, term)
    assert table is not None
    r2 = next(r for r in table.replicas if r.replica_id == "r2")
    assert r2.weight == 50 and r2.endpoint == "http://r2"  # its last entry, verbatim
    clock.t += 3.0
    fleet.on_report(hello("r1"), report())
    table = await _publish(store, publisher, term)
    assert table is not None
    r2 = next(r for r in table.replicas if r.replica_id == "r2")
    assert r2.weight == 0 and r2.state == RS.REPLICA_STATE_STALE


async def test_a_plan_for_some_pools_computes_only_those() -> None:
    store, clock, fleet, publisher, term = await _setup()
    assert not term.ready
    for rid in ("r1", "r2"):
        fleet.on_report(hello(rid), report())
    fleet.on_report(hello("x1", pool="other"), report())
    plan = await term.plan({"other"})
    assert plan is not None and term.ready
    assert set(plan.tables) == {"other"} and [v.replica_id for v in plan.views] == ["x1"]
    full = await term.plan()
    assert full is not None and set(full.tables) == {"m", "other"} and full.at >= plan.at
