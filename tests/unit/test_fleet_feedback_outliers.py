"""FleetState wiring of the SLO feedback and outlier ejection, with a fake clock (no gRPC)."""

from __future__ import annotations

from tidegate.controlplane.fleet import FleetState
from tidegate.policy.outliers import OutlierConfig
from tidegate.policy.weights import WeightPolicyConfig, decide
from tidegate.v1 import records_pb2, telemetry_pb2

RS = records_pb2.ReplicaState


class FakeClock:
    """Settable monotonic seconds."""

    t = 1000.0

    def __call__(self) -> float:
        return self.t


def hello(rid: str) -> telemetry_pb2.Hello:
    return telemetry_pb2.Hello(replica_id=rid, pool="m", endpoint="http://127.0.0.1:9", protocol_version=1)


def report(ttft_ms: float = 500, itl_ms: float = 20, n: float = 50) -> telemetry_pb2.Report:
    return telemetry_pb2.Report(seq=1, engine=telemetry_pb2.EngineStats(
        healthy=True, num_requests_running=2, kv_capacity_tokens=1000, kv_free_tokens=500, has_kv_capacity=True,
        ttft=telemetry_pb2.LatencySummary(p95_ms=ttft_ms, count=n),
        itl=telemetry_pb2.LatencySummary(p95_ms=itl_ms, count=n)))


def fleet_of(n: int, clock: FakeClock, **outlier: object) -> FleetState:
    f = FleetState(WeightPolicyConfig(stale_after_s=30, remove_after_s=300), now=clock,
                   outlier_policy=OutlierConfig(**outlier) if outlier else None)
    for i in range(n):
        f.on_report(hello(f"r{i}"), report())
    return f


def state(f: FleetState, rid: str) -> tuple[str, float, str]:
    view = f.view(rid)
    assert view is not None
    d = decide(view, f.policy)
    return RS.Name(d.state), d.weight, d.reason


def test_feedback_cuts_the_weight_of_a_replica_over_its_pool_target() -> None:
    clock = FakeClock()
    f = fleet_of(2, clock)
    f.set_slo_targets({"m": (1000.0, 100.0)})
    for _ in range(2):
        f.on_report(hello("r0"), report(ttft_ms=1500))
        f.on_report(hello("r1"), report(ttft_ms=800))
    s0, s1 = state(f, "r0"), state(f, "r1")
    assert s0[1] < s1[1] and "slo feedback x0.80" in s0[2]
    assert s1[1] == 50.0


def test_feedback_uses_the_default_target_and_none_without() -> None:
    clock = FakeClock()
    f = fleet_of(1, clock)
    for _ in range(3):
        f.on_report(hello("r0"), report(ttft_ms=9000))
    assert state(f, "r0")[1] == 50.0       # no target anywhere: no feedback
    f.set_slo_targets({}, default=(1000.0, 0.0))
    for _ in range(2):
        f.on_report(hello("r0"), report(ttft_ms=9000))
    assert state(f, "r0")[1] < 50.0


def test_router_error_streak_ejects_then_readmits() -> None:
    clock = FakeClock()
    f = fleet_of(4, clock, backoff_initial_s=10, backoff_max_s=100)
    f.set_router_error_streaks({"r2": 7})
    f.evaluate_outliers()
    name, weight, reason = state(f, "r2")
    assert (name, weight) == ("REPLICA_STATE_EJECTED", 0.0) and "7 consecutive upstream errors" in reason
    assert [(e.kind, e.replica_id) for e in f.take_events()] == [("eject", "r2")]
    clock.t += 10
    f.evaluate_outliers()
    assert state(f, "r2")[0] == "REPLICA_STATE_READY"
    assert [(e.kind, e.replica_id) for e in f.take_events()] == [("readmit", "r2")]


def test_latency_outlier_and_panic() -> None:
    clock = FakeClock()
    f = fleet_of(3, clock, panic_threshold_percent=60, max_ejection_percent=100)
    f.on_report(hello("r1"), report(ttft_ms=5000))
    f.evaluate_outliers()
    assert state(f, "r1")[0] == "REPLICA_STATE_EJECTED"
    assert not f.outlier_panic("m")
    f.set_router_error_streaks({"r0": 5})
    f.evaluate_outliers()   # 1 of 3 healthy < 60%: panic, every replica routable again
    assert f.outlier_panic("m")
    assert [state(f, r)[0] for r in ("r0", "r1", "r2")] == ["REPLICA_STATE_READY"] * 3
    kinds = [e.kind for e in f.take_events()]
    assert kinds == ["eject", "eject", "outlier_panic"]
