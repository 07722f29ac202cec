"""controlplane.faultbook: ejections and their backoff survive a change of leader (InMemoryStore,
fake clocks)."""

from __future__ import annotations

from test_fleet_state import FakeClock, hello, report  # type: ignore[import-not-found]

from tidegate import keys
from tidegate.controlplane.faultbook import FaultBook, from_record, persisted, to_record
from tidegate.controlplane.fleet import FleetState
from tidegate.policy.faults import FaultPolicyConfig, FaultState
from tidegate.policy.weights import WeightPolicyConfig, decide
from tidegate.store.api import Fence
from tidegate.store.memory import InMemoryStore
from tidegate.v1 import records_pb2

RS = records_pb2.ReplicaState
FENCE_KEY = "/tidegate/v1/election/controlplane/1"


def _fleet(clock: FakeClock) -> FleetState:
    return FleetState(WeightPolicyConfig(stale_after_s=3, remove_after_s=30), now=clock,
                      fault_policy=FaultPolicyConfig(unhealthy_reports=1, backoff_initial_s=60))


async def _fence(store: InMemoryStore) -> Fence:
    if not store.create_revision(FENCE_KEY):
        await store.put(FENCE_KEY, b"x")
    return Fence(FENCE_KEY, store.create_revision(FENCE_KEY))


def test_record_round_trip_across_clocks() -> None:
    state = FaultState(ejected=True, cause="critical Xid 48", ejected_at=100.0, readmit_at=160.0, ejections=2,
                       last_readmit_at=50.0)
    rec = to_record("r1", state, mono_now=110.0, wall_now=1_000_000.0, controlplane_id="cp-a")
    assert rec.readmit_at.ToSeconds() == 1_000_050
    # Another process, 3 s later by the wall clock: its monotonic clock reads 8.0.
    back = from_record(rec, mono_now=8.0, wall_now=1_000_003.0)
    assert persisted(back) == (True, "critical Xid 48", False, -5.0, 55.0, 2, -55.0)
    assert persisted(FaultState()) is None


async def test_an_ejection_and_its_backoff_survive_a_new_leader() -> None:
    store, clock = InMemoryStore(), FakeClock()
    old = _fleet(clock)
    old.on_report(hello("r1"), report(healthy=False))
    assert decide(old.view("r1"), old.policy).state == RS.REPLICA_STATE_EJECTED  # type: ignore[arg-type]
    fence = await _fence(store)
    book = FaultBook(store, "cp-a", now=clock, wall=lambda: clock.t + 5000)
    await book.save(old, lambda: fence)
    assert await store.get(keys.fault("r1")) is not None

    clock.t += 10
    new = _fleet(clock)
    new.on_hello(hello("r1"))
    assert await FaultBook(store, "cp-b", now=clock, wall=lambda: clock.t + 5000).restore(new) == 1
    new.on_report(hello("r1"), report())  # healthy again, but 50 s of backoff are left
    assert decide(new.view("r1"), new.policy).state == RS.REPLICA_STATE_EJECTED  # type: ignore[arg-type]
    clock.t += 51
    new.on_report(hello("r1"), report())
    assert decide(new.view("r1"), new.policy).state == RS.REPLICA_STATE_READY  # type: ignore[arg-type]


async def test_clean_or_forgotten_replicas_lose_their_record_and_fenced_saves_write_nothing() -> None:
    store, clock = InMemoryStore(), FakeClock()
    fleet = _fleet(clock)
    fleet.on_report(hello("r1"), report(healthy=False))
    book = FaultBook(store, "cp-a", now=clock)
    await book.save(fleet, lambda: Fence(FENCE_KEY, 12345))  # not our term: refused
    assert await store.get(keys.fault("r1")) is None
    fence = await _fence(store)
    await book.save(fleet, lambda: fence)
    assert await store.get(keys.fault("r1")) is not None
    clock.t += 31
    fleet.prune()
    await book.save(fleet, lambda: fence)
    assert await store.get(keys.fault("r1")) is None


async def test_deposed_leader_keeps_its_successors_record_and_steps_down() -> None:
    store, clock, reasons = InMemoryStore(), FakeClock(), []
    fleet = _fleet(clock)
    fleet.on_report(hello("r1"), report(healthy=False))
    book = FaultBook(store, "cp-a", now=clock, on_fenced=reasons.append)
    stale = await _fence(store)
    await book.save(fleet, lambda: stale)
    await store.delete(FENCE_KEY)                    # its term ended; the successor writes its own record
    await store.put(keys.fault("r1"), b"the successor's")
    clock.t += 31
    fleet.prune()                                    # forgotten here: the deposed leader would delete it
    await book.save(fleet, lambda: stale)
    assert (await store.get(keys.fault("r1"))).value == b"the successor's"  # type: ignore[union-attr]
    assert reasons and "no longer holds" in reasons[0]


async def test_what_this_instance_learnt_itself_wins() -> None:
    store, clock = InMemoryStore(), FakeClock()
    a = _fleet(clock)
    a.on_report(hello("r1"), report(healthy=False))
    fence = await _fence(store)
    await FaultBook(store, "cp-a", now=clock).save(a, lambda: fence)
    b = _fleet(clock)
    b.on_report(hello("r1"), report(healthy=False, num_requests_running=1))
    mine = b.fault_states()["r1"]
    assert await FaultBook(store, "cp-b", now=clock).restore(b) == 0
    assert b.fault_states()["r1"] == mine
