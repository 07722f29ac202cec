"""Table tests and properties of the weight policy (tidegate.policy.weights)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidegate.policy.weights import (
    ROUTABLE_STATES,
    ReplicaView,
    WeightPolicyConfig,
    compute_pool_tables,
    decide,
    routing_key,
)
from tidegate.v1 import records_pb2

RS = records_pb2.ReplicaState
CFG = WeightPolicyConfig()

BASE = ReplicaView(
    replica_id="r1", pool="m", endpoint="http://127.0.0.1:8000", has_report=True, report_age_s=0.5,
    healthy=True, running=4, waiting=0, kv_capacity_tokens=10_000, kv_free_tokens=8_000,
)


def v(**kw: object) -> ReplicaView:
    return replace(BASE, **kw)


CASES = [
    # id, view, expected state, expected weight (None: only check > 0)
    ("ready-kv-80pct-free", v(), RS.REPLICA_STATE_READY, 80.0),
    ("ready-empty", v(running=0, kv_free_tokens=10_000), RS.REPLICA_STATE_READY, 100.0),
    ("queue-halves-weight", v(running=4, waiting=4), RS.REPLICA_STATE_READY, 40.0),
    ("queue-with-zero-running", v(running=0, waiting=1, kv_free_tokens=10_000), RS.REPLICA_STATE_READY, 50.0),
    ("capacity-unknown-uses-usage", v(kv_capacity_tokens=0, kv_free_tokens=0, kv_usage=0.3),
     RS.REPLICA_STATE_READY, 70.0),
    ("kv-full-degraded-floor", v(kv_free_tokens=0), RS.REPLICA_STATE_DEGRADED, 1.0),
    ("kv-96pct-used-degraded", v(kv_free_tokens=400), RS.REPLICA_STATE_DEGRADED, 1.0),
    ("long-queue-degraded", v(running=64, waiting=64, kv_free_tokens=10_000), RS.REPLICA_STATE_DEGRADED, 12.0),
    ("unhealthy-ejected", v(healthy=False, engine_error="connection refused"), RS.REPLICA_STATE_EJECTED, 0.0),
    ("gpu-lost-ejected", v(gpu_telemetry_available=True, gpu_faults=("gpu 0 lost",)),
     RS.REPLICA_STATE_EJECTED, 0.0),
    ("stale", v(report_age_s=3.5), RS.REPLICA_STATE_STALE, 0.0),
    ("stale-beats-cordon", v(report_age_s=10.0, cordoned=True), RS.REPLICA_STATE_STALE, 0.0),
    ("cordoned", v(cordoned=True), RS.REPLICA_STATE_CORDONED, 0.0),
    ("cordoned-beats-unhealthy", v(cordoned=True, healthy=False), RS.REPLICA_STATE_CORDONED, 0.0),
    ("draining-busy", v(draining=True, cordoned=True), RS.REPLICA_STATE_DRAINING, 0.0),
    ("drained-idle", v(draining=True, running=0, waiting=0), RS.REPLICA_STATE_DRAINED, 0.0),
    ("draining-no-report-is-not-drained",
     ReplicaView(replica_id="r1", pool="m", draining=True), RS.REPLICA_STATE_DRAINING, 0.0),
    ("joining", ReplicaView(replica_id="r1", pool="m", report_age_s=1.0), RS.REPLICA_STATE_JOINING, 0.0),
    ("joining-too-long-is-stale", ReplicaView(replica_id="r1", pool="m", report_age_s=4.0),
     RS.REPLICA_STATE_STALE, 0.0),
]


@pytest.mark.parametrize(("view", "state", "weight"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide_table(view: ReplicaView, state: int, weight: float) -> None:
    d = decide(view, CFG)
    assert (RS.Name(d.state), d.weight) == (RS.Name(state), weight)
    assert d.reason


def test_targets_degrade_only_when_set() -> None:
    slow = v(ttft_p95_ms=900.0, itl_p95_ms=80.0, preemptions_per_s=5.0)
    assert decide(slow, CFG).state == RS.REPLICA_STATE_READY
    for cfg in (WeightPolicyConfig(ttft_p95_target_ms=500), WeightPolicyConfig(itl_p95_target_ms=50),
                WeightPolicyConfig(preemptions_per_s_max=1)):
        d = decide(slow, cfg)
        assert d.state == RS.REPLICA_STATE_DEGRADED and d.weight == 20.0, d


def test_edge_all_equal_single_and_all_filtered() -> None:
    equal = [v(replica_id=f"r{i}") for i in range(3)]
    tables = compute_pool_tables(equal, CFG)
    assert [e.weight for e in tables["m"]] == [80.0, 80.0, 80.0]
    single = compute_pool_tables([v(replica_id="only", kv_free_tokens=100)], CFG)
    assert len(single["m"]) == 1 and single["m"][0].weight > 0
    filtered = compute_pool_tables([v(replica_id="a", cordoned=True), v(replica_id="b", report_age_s=9)], CFG)
    assert [(e.replica_id, e.weight) for e in filtered["m"]] == [("a", 0.0), ("b", 0.0)]
    assert compute_pool_tables([], CFG) == {}


def test_tables_grouped_by_pool_sorted_and_carry_fields() -> None:
    views = [v(replica_id="b", pool="p2"), v(replica_id="z"), v(replica_id="a", region="eu", zone="eu-1")]
    tables = compute_pool_tables(views, CFG)
    assert sorted(tables) == ["m", "p2"]
    assert [e.replica_id for e in tables["m"]] == ["a", "z"]
    a = tables["m"][0]
    assert (a.endpoint, a.region, a.zone, a.kv_capacity_tokens, a.running) == (
        "http://127.0.0.1:8000", "eu", "eu-1", 10_000, 4)


def test_routing_key_ignores_informational_noise() -> None:
    one = compute_pool_tables([v(kv_free_tokens=8_010, ttft_p95_ms=10)], CFG)["m"]
    two = compute_pool_tables([v(kv_free_tokens=7_990, ttft_p95_ms=12)], CFG)["m"]
    assert one != two
    assert routing_key(one) == routing_key(two)
    three = compute_pool_tables([v(kv_free_tokens=5_000)], CFG)["m"]
    assert routing_key(three) != routing_key(one)


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        WeightPolicyConfig(stale_after_s=10, remove_after_s=5)
    with pytest.raises(ValueError):
        WeightPolicyConfig(weight_quantum=0)


floats = st.floats(allow_nan=True, allow_infinity=True)
views = st.builds(
    ReplicaView,
    replica_id=st.text(min_size=1, max_size=5), pool=st.sampled_from(["a", "b"]),
    has_report=st.booleans(), report_age_s=st.floats(0, 100), healthy=st.booleans(),
    running=st.integers(-10, 10_000), waiting=st.integers(-10, 10_000),
    kv_capacity_tokens=st.integers(-10, 10**9), kv_free_tokens=st.integers(-10**9, 10**9),
    kv_usage=floats, ttft_p95_ms=floats, itl_p95_ms=floats, preemptions_per_s=floats,
    gpu_faults=st.lists(st.just("gpu 0 lost"), max_size=1).map(tuple),
    cordoned=st.booleans(), draining=st.booleans(),
)
configs = st.builds(
    WeightPolicyConfig,
    kv_floor=st.floats(0, 1), weight_quantum=st.sampled_from([0.1, 0.5, 1.0]),
    degraded_factor=st.floats(0.01, 1), ttft_p95_target_ms=st.floats(0, 1000),
)


@given(view=views, cfg=configs)
def test_weight_is_finite_bounded_and_zero_iff_not_routable(view: ReplicaView, cfg: WeightPolicyConfig) -> None:
    d = decide(view, cfg)
    assert math.isfinite(d.weight) and 0 <= d.weight <= cfg.max_weight
    assert (d.weight > 0) == (d.state in ROUTABLE_STATES)
    if view.cordoned or view.draining or view.report_age_s > cfg.stale_after_s:
        assert d.weight == 0


@given(st.lists(views, max_size=8))
def test_tables_list_every_view_once(vs: list[ReplicaView]) -> None:
    tables = compute_pool_tables(vs, CFG)
    assert sum(len(t) for t in tables.values()) == len(vs)


def test_the_engines_seats_reach_the_table_and_move_its_routing_key() -> None:
    """The pick's seat wait reads RouteEntry.max_num_seqs: a change of seats (an engine restarted
    with another max_num_seqs) rewrites the table; 0 stays unknown."""
    unknown = compute_pool_tables([v()], CFG)["m"]
    seated = compute_pool_tables([v(max_num_seqs=256)], CFG)["m"]
    assert (unknown[0].max_num_seqs, seated[0].max_num_seqs) == (0, 256)
    assert routing_key(seated) != routing_key(unknown)
    assert routing_key(compute_pool_tables([v(max_num_seqs=256, ttft_p95_ms=12)], CFG)["m"]) == \
        routing_key(seated)
