"""Priority classes and deadline headers at the router: the pure header reading (table tests),
then over real HTTP: 400s with the OpenAI error body, what the policy receives, the per-class
metrics, and the pool SLO in /health."""

from __future__ import annotations

import random

import pytest
from multidict import CIMultiDict
from test_router_proxy import CHAT, Engine, Router, engines  # noqa: F401  (engines is a fixture)

from tidegate import codec, keys
from tidegate.policy import registry
from tidegate.policy.deadlines import TPOT_HEADER, TTFT_HEADER
from tidegate.policy.registry import SloTargets
from tidegate.router.reqclass import PRIORITY_HEADER, BadHeader, classify
from tidegate.router.tables import RoutingTables
from tidegate.store.api import KeyValue
from tidegate.v1.records_pb2 import PoolSlo, RouteEntry, RoutingTable

POOL_SLO = SloTargets(ttft_s=2.0, tpot_s=0.1)

CASES = [
    # id, headers, trusted, expected (class, priority, slo) or (header, code) of the 400
    ("nothing", {}, False, ("standard", 0, POOL_SLO)),
    ("untrusted-critical", {PRIORITY_HEADER: "critical"}, False, ("standard", 0, POOL_SLO)),
    ("untrusted-garbage", {PRIORITY_HEADER: "!!"}, False, ("standard", 0, POOL_SLO)),
    ("trusted-critical", {PRIORITY_HEADER: "critical"}, True, ("critical", 1, POOL_SLO)),
    ("trusted-sheddable", {PRIORITY_HEADER: "Sheddable"}, True, ("sheddable", -1, POOL_SLO)),
    ("trusted-absent", {}, True, ("standard", 0, POOL_SLO)),
    ("trusted-garbage", {PRIORITY_HEADER: "vip"}, True, (PRIORITY_HEADER, "invalid_priority")),
    ("trusted-twice", [(PRIORITY_HEADER, "critical"), (PRIORITY_HEADER, "sheddable")], True,
     (PRIORITY_HEADER, "invalid_priority")),
    ("untrusted-twice-ignored", [(PRIORITY_HEADER, "a"), (PRIORITY_HEADER, "b")], False, ("standard", 0, POOL_SLO)),
    ("tighter-ttft", {TTFT_HEADER: "500"}, False, ("standard", 0, SloTargets(0.5, 0.1))),
    ("looser-ttft", {TTFT_HEADER: "60000"}, False, ("standard", 0, POOL_SLO)),
    ("tighter-tpot", {TPOT_HEADER: "20"}, True, ("standard", 0, SloTargets(2.0, 0.02))),
    ("bad-ttft", {TTFT_HEADER: "soon"}, False, (TTFT_HEADER, "invalid_deadline")),
    ("bad-tpot", {TPOT_HEADER: "-3"}, True, (TPOT_HEADER, "invalid_deadline")),
    ("ttft-twice", [(TTFT_HEADER, "100"), (TTFT_HEADER, "200")], False, (TTFT_HEADER, "invalid_deadline")),
]


@pytest.mark.parametrize(("headers", "trusted", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_classify(headers: dict | list, trusted: bool, expected: tuple) -> None:
    h = CIMultiDict(headers.items() if isinstance(headers, dict) else headers)
    if len(expected) == 2:
        with pytest.raises(BadHeader) as exc:
            classify(h, trust_priority=trusted, pool_slo=POOL_SLO)
        assert (exc.value.header, exc.value.error_code) == expected
    else:
        c = classify(h, trust_priority=trusted, pool_slo=POOL_SLO)
        assert (c.name, c.priority, c.slo) == expected


def test_classify_without_pool_slo_keeps_the_policy_default() -> None:
    assert classify(CIMultiDict(), trust_priority=True, pool_slo=None).slo is None


class RecordingPolicy:
    """Picks the first candidate and records the snapshot's SLO and the request's priority."""

    name = "test_recording"
    seen: list[tuple[SloTargets | None, int]] = []

    def pick(self, snapshot: registry.PoolSnapshot, request: registry.RequestFeatures, rng: random.Random):
        RecordingPolicy.seen.append((snapshot.slo, request.priority))
        c = snapshot.candidates()
        return registry.make_pick(c[0], "first", 0.0, len(c)) if c else None


@pytest.fixture
def recording_policy(monkeypatch: pytest.MonkeyPatch) -> type[RecordingPolicy]:
    """Registered for this test only (other tests iterate over every registered policy)."""
    registry.names()  # loads the built-ins first
    monkeypatch.setitem(registry._FACTORIES, RecordingPolicy.name, RecordingPolicy)
    RecordingPolicy.seen = []
    return RecordingPolicy


def table_with_slo(tables: RoutingTables, engine: Engine) -> None:
    t = RoutingTable(pool="m", generation=3, replicas=[RouteEntry(replica_id="a", endpoint=engine.url, weight=1.0)],
                     slo=PoolSlo(pool="m", ttft_s=2.0, tpot_s=0.1))
    tables.on_change(keys.table("m"), KeyValue(keys.table("m"), codec.encode(t), 3))
    tables.mark_synced()


@pytest.mark.parametrize("trusted", [True, False])
async def test_classes_over_http(engines, recording_policy, trusted: bool) -> None:  # noqa: F811
    tables = RoutingTables()
    table_with_slo(tables, engines[0])
    async with Router(tables, policy=RecordingPolicy.name, trust_priority_header=trusted) as client:
        r = await client.get("/health")
        assert (await r.json())["pools"]["m"]["slo"] == {"ttft_s": 2.0, "tpot_s": 0.1}
        r = await client.post("/v1/chat/completions", json=CHAT, headers={PRIORITY_HEADER: "critical",
                                                                           TTFT_HEADER: "750"})
        assert r.status == 200
        r = await client.post("/v1/chat/completions", json=CHAT, headers={PRIORITY_HEADER: "vip"})
        if trusted:
            assert r.status == 400
            assert (await r.json())["error"] == {
                "message": "invalid priority 'vip'; valid: critical, standard, sheddable",
                "type": "invalid_request_error", "param": PRIORITY_HEADER, "code": "invalid_priority"}
        else:
            assert r.status == 200
        r = await client.post("/v1/chat/completions", json=CHAT, headers={TPOT_HEADER: "0"})
        assert r.status == 400 and (await r.json())["error"]["param"] == TPOT_HEADER
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True},
                              headers={PRIORITY_HEADER: "sheddable"})
        assert r.status == 200
        await r.read()
        metrics = (await (await client.get("/metrics")).read()).decode()
    first = "critical" if trusted else "standard"
    last = "sheddable" if trusted else "standard"
    expected = [(SloTargets(0.75, 0.1), 1 if trusted else 0)] + ([] if trusted else [(POOL_SLO, 0)]) + [
        (POOL_SLO, -1 if trusted else 0)]
    assert RecordingPolicy.seen == expected
    assert f'tidegate_router_class_requests_total{{model="m",priority="{first}",status="200"}}' in metrics
    assert 'tidegate_router_class_requests_total{model="m",priority="unknown",status="400"}' in metrics
    assert f'tidegate_router_class_ttft_seconds_count{{model="m",priority="{last}"}} 1.0' in metrics
    assert len(engines[0].seen) == (2 if trusted else 3)
