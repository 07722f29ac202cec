"""Pool SLOs and the scale recommendation in the control plane: validation, decoding, the
published records and gauge (ScaleReporter), pools listed with their SLO. In-memory store;
fakes for the fleet. (The SLO inside the routing table: test_publisher_slo.py.)"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry

from tidegate import codec, keys
from tidegate.controlplane.fleet import FleetState
from tidegate.controlplane.pools import pool_summaries
from tidegate.controlplane.slo import ScaleReporter, decode_all, validate
from tidegate.policy.weights import WeightPolicyConfig
from tidegate.store.api import Fence, KeyValue
from tidegate.store.memory import InMemoryStore
from tidegate.v1 import records_pb2, telemetry_pb2

RS = records_pb2.ReplicaState
FENCE_KEY = "/tidegate/v1/election/controlplane/1"


@pytest.mark.parametrize(("pool", "ttft", "tpot", "ok"), [
    ("m", 2.0, 0.1, True),
    ("meta-llama/Llama-3.1-8B-Instruct", 0.5, 0.02, True),
    ("", 2.0, 0.1, False),
    (" m", 2.0, 0.1, False),
    ("m\n", 2.0, 0.1, False),
    ("m", 0.0, 0.1, False),
    ("m", 2.0, -1.0, False),
    ("m", math.inf, 0.1, False),
    ("m", math.nan, 0.1, False),
    ("m", 7200.0, 0.1, False),
])
def test_validate(pool: str, ttft: float, tpot: float, ok: bool) -> None:
    slo = records_pb2.PoolSlo(pool=pool, ttft_s=ttft, tpot_s=tpot)
    if ok:
        validate(slo)
    else:
        with pytest.raises(ValueError):
            validate(slo)


def test_decode_all_skips_garbage_and_trusts_the_key() -> None:
    good = records_pb2.PoolSlo(pool="other", ttft_s=2.0, tpot_s=0.1)
    items = {
        keys.slo("a/b"): KeyValue(keys.slo("a/b"), codec.encode(good), 1),
        keys.slo("bad"): KeyValue(keys.slo("bad"), b"{not json", 2),
        keys.slo("zero"): KeyValue(keys.slo("zero"), codec.encode(records_pb2.PoolSlo(pool="zero")), 3),
    }
    out = decode_all(items)
    assert list(out) == ["a/b"] and out["a/b"].pool == "a/b" and out["a/b"].ttft_s == 2.0


@dataclass
class FakeRecord:
    report: telemetry_pb2.Report | None


class FakeFleet:
    def __init__(self, reports: dict[str, telemetry_pb2.Report]) -> None:
        self._reports = reports

    def get(self, rid: str) -> FakeRecord | None:
        return FakeRecord(self._reports[rid]) if rid in self._reports else None


def entry(rid: str, rated: bool = True) -> records_pb2.RouteEntry:
    return records_pb2.RouteEntry(replica_id=rid, endpoint="http://x", state=RS.REPLICA_STATE_READY, weight=1.0,
                                  kv_capacity_tokens=1000, kv_free_tokens=700,
                                  prefill_tokens_per_s=20_000.0 if rated else 0.0,
                                  decode_step_base_ms=10.0 if rated else 0.0,
                                  decode_step_per_seq_ms=0.3 if rated else 0.0)


def busy(p: float = 5000.0, g: float = 600.0) -> telemetry_pb2.Report:
    eng = telemetry_pb2.EngineStats(healthy=True, prompt_tokens_per_s=p, generation_tokens_per_s=g, window_s=10.0)
    eng.e2e.count = 25  # 2.5 requests/s: 2,000-token prompts
    return telemetry_pb2.Report(engine=eng)


SLO = records_pb2.PoolSlo(pool="m", ttft_s=2.0, tpot_s=0.1)


class FakeWall:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


def reporter(store: InMemoryStore, registry: CollectorRegistry, wall: FakeWall) -> ScaleReporter:
    return ScaleReporter(store, "cp-0", registry=registry, wall_clock=wall)


async def test_scale_reporter_records_gauge_and_change_rule() -> None:
    store, registry, wall = InMemoryStore(), CollectorRegistry(), FakeWall()
    rep = reporter(store, registry, wall)
    tables = {"m": [entry(f"r{i}") for i in range(4)], "n": [entry("n0", rated=False)]}
    fleet = FakeFleet({f"r{i}": busy() for i in range(4)} | {"n0": busy()})
    out = rep.compute(tables, fleet, {"m": SLO, "n": SLO})  # type: ignore[arg-type]
    # 20k prompt tok/s on 20k/replica and 2.4k gen tok/s on 3k/replica, 80 % headroom: 2.25 -> 3
    assert (out["m"].recommended_replicas, out["m"].binding, out["m"].current_replicas) == (3, "prefill", 4)
    assert out["n"].recommended_replicas == 0 and "rates not known" in out["n"].reason
    assert registry.get_sample_value("tidegate_pool_recommended_replicas", {"pool": "m"}) == 3
    assert registry.get_sample_value("tidegate_pool_recommended_replicas", {"pool": "n"}) is None

    fence: Fence | None = await leader_fence(store)
    assert await rep.publish(lambda: fence) == ["m", "n"]
    stored = codec.decode((await store.get(keys.scale("m"))).value, records_pb2.ScaleRecommendation)
    assert stored.recommended_replicas == 3 and stored.leader_id == "cp-0"
    wall.t += 1
    rep.compute(tables, fleet, {"m": SLO, "n": SLO})  # type: ignore[arg-type]
    assert await rep.publish(lambda: fence) == []             # same figures: no write
    fleet = FakeFleet({f"r{i}": busy(p=10_000.0, g=1200.0) for i in range(4)})
    rep.compute(tables, fleet, {"m": SLO, "n": SLO})  # type: ignore[arg-type]
    assert await rep.publish(lambda: fence) == ["m"]          # demand doubled: 5 replicas
    assert registry.get_sample_value("tidegate_pool_recommended_replicas", {"pool": "m"}) == 5
    wall.t += 31
    rep.compute(tables, fleet, {"m": SLO, "n": SLO})  # type: ignore[arg-type]
    held, fence = fence, None
    assert await rep.publish(lambda: fence) == []             # a standby writes nothing
    fence = held
    assert await rep.publish(lambda: fence) == ["m", "n"]     # refreshed after 30 s
    rep.compute(tables, fleet, {})  # type: ignore[arg-type]  # SLO cleared: no figure, no gauge sample
    assert registry.get_sample_value("tidegate_pool_recommended_replicas", {"pool": "m"}) is None


async def leader_fence(store: InMemoryStore) -> Fence:
    await store.put(FENCE_KEY, b"cp-0")
    return Fence(FENCE_KEY, store.create_revision(FENCE_KEY))


async def test_scale_reporter_refused_by_its_fence_writes_nothing_and_steps_down() -> None:
    store, wall, reasons = InMemoryStore(), FakeWall(), []
    rep = ScaleReporter(store, "cp-0", registry=CollectorRegistry(), wall_clock=wall, on_fenced=reasons.append)
    stale = await leader_fence(store)
    await store.delete(FENCE_KEY)                              # its term ended; another instance leads
    await store.put(keys.scale("m"), b"the new leader's")
    rep.compute({"m": [entry(f"r{i}") for i in range(4)]}, FakeFleet({f"r{i}": busy() for i in range(4)}),
                {"m": SLO})  # type: ignore[arg-type]
    assert await rep.publish(lambda: stale) == []
    assert reasons and "no longer holds" in reasons[0]
    assert (await store.get(keys.scale("m"))).value == b"the new leader's"  # type: ignore[union-attr]
    fresh = await leader_fence(store)                          # a new term: a new fence
    assert await rep.publish(lambda: fresh) == ["m"]


class FakeViewsFleet:
    """Just enough of FleetState for pool_summaries: no replicas."""

    policy = None

    def views(self) -> list[object]:
        return []


def test_pools_with_an_slo_but_no_replica_are_listed() -> None:
    scale = records_pb2.ScaleRecommendation(pool="m", recommended_replicas=2, binding="prefill", reason="why")
    pools = pool_summaries(FakeViewsFleet(), {}, lambda pool: 0, slos={"m": SLO},  # type: ignore[arg-type]
                           scale={"m": scale})
    assert [p.pool for p in pools] == ["m"]
    assert pools[0].slo.ttft_s == 2.0 and pools[0].recommended_replicas == 2 and pools[0].scale.binding == "prefill"


def test_attainment_uses_the_pool_slo_before_the_flags() -> None:
    fleet = FleetState(WeightPolicyConfig(), now=lambda: 1000.0)
    hello = telemetry_pb2.Hello(replica_id="r1", pool="m", endpoint="http://127.0.0.1:9", protocol_version=1)
    fleet.on_hello(hello)
    eng = telemetry_pb2.EngineStats(healthy=True, kv_capacity_tokens=1000, kv_free_tokens=500, has_kv_capacity=True,
                                    window_s=10.0)
    eng.ttft.count, eng.ttft.p50_ms, eng.ttft.p95_ms, eng.ttft.p99_ms = 100, 400.0, 1200.0, 1800.0
    eng.itl.count, eng.itl.p50_ms, eng.itl.p95_ms, eng.itl.p99_ms = 100, 20.0, 40.0, 60.0
    fleet.on_report(hello, telemetry_pb2.Report(seq=1, engine=eng))

    def attainment(**kw: object) -> float:
        return pool_summaries(fleet, {}, lambda pool: 0, **kw)[0].slo_attainment  # type: ignore[arg-type]

    assert attainment() == -1.0                                    # no targets anywhere: unknown
    assert attainment(slo_ttft_ms=1000.0, slo_itl_ms=100.0) == 0.5  # flags: TTFT p50 only within 1 s
    assert attainment(slo_ttft_ms=1000.0, slo_itl_ms=100.0, slos={"m": SLO}) == 1.0  # pool SLO 2 s: p99 within
    tight = records_pb2.PoolSlo(pool="m", ttft_s=2.0, tpot_s=0.05)
    assert attainment(slos={"m": tight}) == 0.95                   # ITL p99 60 ms > 50 ms, p95 within
