"""FleetState: staleness, removal and garbage telemetry, with a fake clock (no gRPC)."""

from __future__ import annotations

import math

import pytest

from tidegate.controlplane.fleet import FleetState, sanitize
from tidegate.policy.weights import WeightPolicyConfig, decide
from tidegate.v1 import records_pb2, telemetry_pb2

RS = records_pb2.ReplicaState


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def hello(rid: str = "r1", pool: str = "m") -> telemetry_pb2.Hello:
    return telemetry_pb2.Hello(replica_id=rid, pool=pool, endpoint="http://127.0.0.1:9", protocol_version=1)


def report(seq: int = 1, **engine: object) -> telemetry_pb2.Report:
    fields: dict[str, object] = dict(healthy=True, num_requests_running=2, kv_capacity_tokens=1000,
                                     kv_free_tokens=500, has_kv_capacity=True)
    fields.update(engine)
    return telemetry_pb2.Report(seq=seq, engine=telemetry_pb2.EngineStats(**fields))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fleet(clock: FakeClock) -> FleetState:
    return FleetState(WeightPolicyConfig(stale_after_s=3, remove_after_s=30), now=clock)


def state_of(fleet: FleetState, rid: str = "r1") -> tuple[str, float]:
    view = fleet.view(rid)
    assert view is not None
    d = decide(view, fleet.policy)
    return RS.Name(d.state), d.weight


def test_joining_then_ready_then_stale_then_removed(fleet: FleetState, clock: FakeClock) -> None:
    fleet.on_hello(hello())
    assert state_of(fleet) == ("REPLICA_STATE_JOINING", 0.0)
    d = fleet.on_report(hello(), report())
    assert (RS.Name(d.state), d.weight) == ("REPLICA_STATE_READY", 50.0)
    clock.t += 3.0
    assert state_of(fleet)[0] == "REPLICA_STATE_READY"      # exactly stale_after is not stale yet
    clock.t += 0.1
    assert state_of(fleet) == ("REPLICA_STATE_STALE", 0.0)
    clock.t += 26.8
    assert fleet.prune() == []
    clock.t += 0.2
    assert fleet.prune() == ["r1"]
    assert fleet.view("r1") is None and len(fleet) == 0


def test_report_after_prune_reregisters(fleet: FleetState, clock: FakeClock) -> None:
    fleet.on_report(hello(), report())
    clock.t += 60
    assert fleet.prune() == ["r1"]
    d = fleet.on_report(hello(), report(seq=2))
    assert d.state == RS.REPLICA_STATE_READY and len(fleet) == 1


def test_hello_without_reports_is_pruned(fleet: FleetState, clock: FakeClock) -> None:
    fleet.on_hello(hello())
    clock.t += 31
    assert fleet.prune() == ["r1"]


def test_bad_hello_rejected(fleet: FleetState) -> None:
    with pytest.raises(ValueError, match="replica_id"):
        fleet.on_hello(telemetry_pb2.Hello(pool="m"))
    with pytest.raises(ValueError, match="pool"):
        fleet.on_hello(telemetry_pb2.Hello(replica_id="x"))


def test_intents_apply_to_views(fleet: FleetState) -> None:
    fleet.on_report(hello(), report())
    fleet.set_intents({"r1": records_pb2.ReplicaIntent(replica_id="r1", cordoned=True)})
    assert state_of(fleet) == ("REPLICA_STATE_CORDONED", 0.0)
    fleet.set_intents({"r1": records_pb2.ReplicaIntent(replica_id="r1", draining=True)})
    assert state_of(fleet)[0] == "REPLICA_STATE_DRAINING"
    fleet.on_report(hello(), report(seq=2, num_requests_running=0))
    assert state_of(fleet)[0] == "REPLICA_STATE_DRAINED"
    fleet.set_intents({})
    assert state_of(fleet)[0] == "REPLICA_STATE_READY"


def test_views_sorted_and_age(fleet: FleetState, clock: FakeClock) -> None:
    fleet.on_report(hello("b"), report())
    clock.t += 1.5
    fleet.on_report(hello("a", pool="p"), report())
    vs = fleet.views()
    assert [(x.replica_id, x.pool, x.report_age_s) for x in vs] == [("a", "p", 0.0), ("b", "m", 1.5)]


def test_preemption_rate_and_counter_reset(fleet: FleetState, clock: FakeClock) -> None:
    fleet.on_report(hello(), report(preemptions_total=10))
    clock.t += 2
    fleet.on_report(hello(), report(preemptions_total=20))
    assert fleet.view("r1").preemptions_per_s == 5.0  # type: ignore[union-attr]
    clock.t += 1
    fleet.on_report(hello(), report(preemptions_total=1))  # engine restarted
    assert fleet.view("r1").preemptions_per_s == 0.0  # type: ignore[union-attr]


def work(finished: float, interval_s: float = 1.0) -> telemetry_pb2.EngineWork:
    return telemetry_pb2.EngineWork(interval_s=interval_s, finished_requests=finished)


def test_completion_rate_is_smoothed_and_garbage_leaves_it(fleet: FleetState, clock: FakeClock) -> None:
    rec = fleet.get("r1")
    assert rec is None
    for _ in range(40):   # a steady 20 completions per second, one report a second
        fleet.on_report(hello(), report(max_num_seqs=256, work=work(20.0)))
        clock.t += 1
    rec = fleet.get("r1")
    assert rec is not None and rec.completions_per_s == pytest.approx(20.0, rel=1e-3)
    assert rec.stats.max_num_seqs == 256
    fleet.on_report(hello(), report(work=work(math.nan)))
    fleet.on_report(hello(), report(work=work(5.0, interval_s=0.0)))
    fleet.on_report(hello(), report(work=work(-1.0)))
    assert rec.completions_per_s == pytest.approx(20.0, rel=1e-3)
    fleet.on_report(hello(), report(work=work(120.0, interval_s=2.0)))   # a step up to 60/s: a part of it
    assert 20.0 < rec.completions_per_s < 60.0
    for _ in range(5):    # within a few of its horizons the step has shown
        fleet.on_report(hello(), report(work=work(60.0)))
    assert rec.completions_per_s > 0.8 * 60.0


def test_budget_capacity_carries_the_engines_seats_and_drain(fleet: FleetState, clock: FakeClock) -> None:
    from tidegate.controlplane.admission_budgets import capacities

    for _ in range(30):
        fleet.on_report(hello(), report(max_num_seqs=64, work=work(10.0)))
        clock.t += 1
    entry = records_pb2.RouteEntry(replica_id="r1", state=records_pb2.REPLICA_STATE_READY, weight=1.0)
    (cap,) = capacities([entry], fleet)
    assert cap.seats == 64 and cap.completions_per_s == pytest.approx(10.0, rel=0.01)
    gone = records_pb2.RouteEntry(replica_id="gone", state=records_pb2.REPLICA_STATE_READY, weight=1.0)
    (unknown,) = capacities([gone], fleet)
    assert (unknown.seats, unknown.completions_per_s) == (0.0, 0.0)


GARBAGE = [
    ("negative-counts", dict(num_requests_running=-3, num_requests_waiting=-1), ["running -3 < 0", "waiting -1 < 0"]),
    ("nan-usage", dict(kv_capacity_tokens=0, kv_free_tokens=0, has_kv_capacity=False, kv_cache_usage=math.nan),
     ["kv_cache_usage not finite"]),
    ("usage-above-one", dict(kv_capacity_tokens=0, has_kv_capacity=False, kv_cache_usage=1.7),
     ["kv_cache_usage 1.7 > 1"]),
    ("capacity-zero-claimed", dict(kv_capacity_tokens=0, kv_free_tokens=50),
     ["kv_capacity_tokens 0 <= 0, treated as unknown"]),
    ("free-above-capacity", dict(kv_free_tokens=5000), ["kv_free_tokens 5000 > capacity 1000"]),
    ("free-negative", dict(kv_free_tokens=-5), ["kv_free_tokens -5 < 0"]),
    ("inf-latency", dict(ttft=telemetry_pb2.LatencySummary(p95_ms=math.inf)), ["ttft_p95_ms not finite"]),
    ("negative-seats", dict(max_num_seqs=-4), ["max_num_seqs -4 < 0"]),
]


@pytest.mark.parametrize(("engine", "flags"), [g[1:] for g in GARBAGE], ids=[g[0] for g in GARBAGE])
def test_garbage_telemetry_clamped_and_flagged(fleet: FleetState, engine: dict[str, object],
                                               flags: list[str]) -> None:
    stats = sanitize(report(**engine))
    assert list(stats.flags) == flags
    assert stats.running >= 0 and stats.waiting >= 0 and 0 <= stats.kv_usage <= 1
    assert 0 <= stats.kv_free_tokens <= max(stats.kv_capacity_tokens, 0)
    d = fleet.on_report(hello(), report(**engine))
    assert math.isfinite(d.weight) and d.weight >= 0
    assert "telemetry clamped" in d.reason


def test_missing_engine_and_gpu_faults(fleet: FleetState) -> None:
    d = fleet.on_report(hello(), telemetry_pb2.Report(seq=1))
    assert d.state == RS.REPLICA_STATE_EJECTED and "no engine stats" in d.reason
    r = report(seq=2)
    r.gpu_telemetry_available = True
    r.gpus.add(index=1, ecc_uncorrected_volatile=2)
    d = fleet.on_report(hello(), r)
    assert d.state == RS.REPLICA_STATE_EJECTED and "uncorrectable ECC" in d.reason
    assert [e.kind for e in fleet.take_events()] == ["eject"]
    # Fault numbers are ignored when the agent says GPU telemetry is unavailable; the replica
    # still waits out its re-admission backoff (10 s for a first ejection).
    r.gpu_telemetry_available = False
    assert fleet.on_report(hello(), r).state == RS.REPLICA_STATE_EJECTED


def test_failed_row_remapping_ejects_until_a_fresh_agent(fleet: FleetState, clock: FakeClock) -> None:
    fleet.on_report(hello(), report())
    r = report(seq=2)
    r.gpu_telemetry_available = True
    r.gpus.add(index=0, row_remap_failed=True)
    d = fleet.on_report(hello(), r)
    assert d.state == RS.REPLICA_STATE_EJECTED and "row remapping failed" in d.reason
    assert [e.kind for e in fleet.take_events()] == ["eject"]
    clock.t += 1000   # far past any backoff: the memory needs service, not time
    assert fleet.on_report(hello(), report(seq=3)).state == RS.REPLICA_STATE_EJECTED
    # A pending remap (waiting for a reset) is reported, not a fault: the GPU serves meanwhile.
    pending = report(seq=1)
    pending.gpu_telemetry_available = True
    pending.gpus.add(index=0, retired_pages_pending=1)
    assert fleet.on_report(hello("other"), pending).state != RS.REPLICA_STATE_EJECTED


def test_xid_ejects_then_readmits_after_backoff(fleet: FleetState, clock: FakeClock) -> None:
    fleet.on_report(hello(), report())
    r = report(seq=2)
    r.gpu_telemetry_available = True
    r.gpus.add(index=0, xid_events=[48])
    d = fleet.on_report(hello(), r)
    assert d.state == RS.REPLICA_STATE_EJECTED and "critical Xid 48" in d.reason
    assert [(e.kind, e.replica_id) for e in fleet.take_events()] == [("eject", "r1")]
    clock.t += 5
    assert fleet.on_report(hello(), report(seq=3)).state == RS.REPLICA_STATE_EJECTED
    clock.t += 5
    assert fleet.on_report(hello(), report(seq=4)).state == RS.REPLICA_STATE_READY
    assert [e.kind for e in fleet.take_events()] == ["readmit"]


def test_gpu_lost_stays_ejected_until_fresh_stream(fleet: FleetState, clock: FakeClock) -> None:
    fleet.on_hello(hello())
    fleet.stream_opened("r1")
    r = report()
    r.gpu_telemetry_available = True
    r.gpus.add(index=0, lost=True)
    fleet.on_report(hello(), r)
    clock.t += 3600
    assert fleet.on_report(hello(), report(seq=2)).state == RS.REPLICA_STATE_EJECTED
    fleet.stream_opened("r1")  # a new stream while another is open is not fresh
    assert fleet.on_report(hello(), report(seq=3)).state == RS.REPLICA_STATE_EJECTED
    fleet.stream_closed("r1")
    fleet.stream_closed("r1")
    fleet.stream_opened("r1")
    assert fleet.on_report(hello(), report(seq=4)).state == RS.REPLICA_STATE_READY
    assert [e.kind for e in fleet.take_events()] == ["eject", "readmit"]


def test_drain_counts_router_inflight_deadline_and_force(clock: FakeClock) -> None:
    wall = FakeClock()
    fleet = FleetState(WeightPolicyConfig(), now=clock, wall=wall)
    fleet.on_report(hello(), report(num_requests_running=0))
    deadline = records_pb2.ReplicaIntent(replica_id="r1", cordoned=True, draining=True)
    deadline.created_at.FromSeconds(1000)
    deadline.drain_deadline.FromSeconds(1010)
    fleet.set_intents({"r1": deadline})
    fleet.set_router_inflight({"r1": 2})
    assert state_of(fleet)[0] == "REPLICA_STATE_DRAINING"
    wall.t = 1010
    view = fleet.view("r1")
    assert view is not None and view.drain_expired
    assert "drain timed out: 2 in flight at routers" in decide(view, fleet.policy).reason
    deadline.force = True
    fleet.set_intents({"r1": deadline})
    assert state_of(fleet)[0] == "REPLICA_STATE_DRAINED"
    deadline.force = False
    fleet.set_intents({"r1": deadline})
    fleet.set_router_inflight({})
    assert state_of(fleet)[0] == "REPLICA_STATE_DRAINED"


def test_oom_error_cuts_weight(fleet: FleetState) -> None:
    d = fleet.on_report(hello(), report(error="CUDA out of memory"))
    assert d.state == RS.REPLICA_STATE_DEGRADED and "weight cut: out of memory" in d.reason


def test_state_change_hook_fires_on_state_changes_not_weight_changes(clock: FakeClock) -> None:
    changes: list[str] = []
    fleet = FleetState(WeightPolicyConfig(), now=clock, on_state_change=changes.append)
    fleet.on_hello(hello())
    fleet.on_report(hello(), report(1))                                  # JOINING -> READY
    fleet.on_report(hello(), report(2, kv_free_tokens=300))              # weight only
    assert len(changes) == 1
    fleet.on_report(hello(), report(3, kv_free_tokens=10))               # KV 99 % used: DEGRADED
    assert len(changes) == 2
    fleet.on_report(hello(), report(4, kv_free_tokens=500))              # READY again
    assert changes == ["m", "m", "m"]
    fleet.on_hello(hello("r2", pool="n"))
    assert [v.replica_id for v in fleet.views(pools={"n"})] == ["r2"]


def test_views_without_report_carry_no_engine_numbers(fleet: FleetState) -> None:
    fleet.on_hello(telemetry_pb2.Hello(replica_id="r1", pool="m", endpoint="http://127.0.0.1:9", protocol_version=1,
                                       prior_prefill_tokens_per_s=8000, prior_decode_step_base_ms=20,
                                       prior_decode_step_per_seq_ms=0.5))
    view = fleet.view("r1")
    assert view is not None and not view.has_report
    assert (view.healthy, view.running, view.prefill_tokens_per_s, view.slo_factor) == (False, 0, 0.0, 1.0)
    assert fleet.pools() == {"r1": "m"}


def test_the_table_carries_the_engines_seats(fleet: FleetState, clock: FakeClock) -> None:
    fleet.on_report(hello(), report(max_num_seqs=128))
    view = fleet.view("r1")
    assert view is not None and view.max_num_seqs == 128


def test_seats_an_engine_runs_past_read_as_unknown(fleet: FleetState, clock: FakeClock) -> None:
    """An agent told the wrong --engine-max-num-seqs: the engine runs more than that, so the figure
    is not believed (a replica with room would be predicted full and throttled), for as long as
    that figure is reported, with a reason; the right figure is believed again."""
    fleet.on_report(hello(), report(max_num_seqs=16, num_requests_running=12))
    assert fleet.view("r1").max_num_seqs == 16   # type: ignore[union-attr]
    fleet.on_report(hello(), report(max_num_seqs=16, num_requests_running=40))
    view = fleet.view("r1")
    assert view is not None and view.max_num_seqs == 0
    assert "max_num_seqs 16 < running 40 seen (seats unknown)" in view.telemetry_flags
    fleet.on_report(hello(), report(max_num_seqs=16, num_requests_running=3))   # quiet now: still refuted
    assert fleet.view("r1").max_num_seqs == 0   # type: ignore[union-attr]
    fleet.on_report(hello(), report(max_num_seqs=256, num_requests_running=40))  # restarted with the right one
    assert fleet.view("r1").max_num_seqs == 256   # type: ignore[union-attr]
