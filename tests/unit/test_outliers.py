"""Outlier ejection (tidegate.policy.outliers): tables, max ejection percent, panic, backoff."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidegate.policy.outliers import OutlierConfig, OutlierInput, OutlierState, evaluate

CFG = OutlierConfig(consecutive_errors=5, latency_factor=3.0, latency_min_samples=20, latency_min_replicas=3,
                    latency_floor_ms=100, max_ejection_percent=50, panic_threshold_percent=50,
                    backoff_initial_s=30, backoff_max_s=300, backoff_reset_after_s=600)


def inp(rid: str, errors: int = 0, ttft: float = 500, n: float = 100, candidate: bool = True) -> OutlierInput:
    return OutlierInput(rid, candidate, errors, ttft, n)


def pool(*special: OutlierInput, size: int = 4) -> list[OutlierInput]:
    ids = {i.replica_id for i in special}
    return list(special) + [inp(f"r{k}") for k in range(size) if f"r{k}" not in ids]


def ejected(res) -> list[str]:
    return sorted(rid for rid, s in res.states.items() if s.ejected)


CASES = [
    # id, inputs, ejected
    ("all-fine", pool(), []),
    ("errors-eject", pool(inp("r1", errors=5)), ["r1"]),
    ("errors-below-threshold", pool(inp("r1", errors=4)), []),
    ("slow-ejects", pool(inp("r2", ttft=2000)), ["r2"]),
    ("slow-but-few-samples", pool(inp("r2", ttft=2000, n=3)), []),
    ("slow-below-floor", [inp("a", ttft=10), inp("b", ttft=10), inp("c", ttft=90)], []),
    ("too-few-for-a-median", [inp("a"), inp("b", ttft=5000)], []),
    ("max-percent-caps", pool(inp("r0", errors=9), inp("r1", errors=7), inp("r2", errors=6)), ["r0", "r1"]),
    ("errors-before-latency", pool(inp("r0", ttft=5000), inp("r1", errors=5), inp("r2", errors=5)), ["r1", "r2"]),
    ("pool-of-one-never", [inp("only", errors=50)], []),
    ("non-candidate-ignored", pool(inp("r1", errors=50, candidate=False)), []),
]


@pytest.mark.parametrize("inputs,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_table(inputs: list[OutlierInput], expected: list[str]) -> None:
    res = evaluate(inputs, {}, 0.0, CFG)
    assert ejected(res) == expected
    assert [rid for rid, e in res.events if e.kind == "eject"] == expected


def test_backoff_grows_and_readmits_by_time() -> None:
    ins = pool(inp("r1", ttft=3000))
    res = evaluate(ins, {}, 0.0, CFG)
    assert res.states["r1"].readmit_at == 30
    assert res.ejected_reason("r1", 10).startswith("ejected (outlier): ttft p95 3000ms")
    res = evaluate(ins, res.states, 29.0, CFG)
    assert ejected(res) == ["r1"]
    res = evaluate(ins, res.states, 30.0, CFG)   # re-admitted and, still slow, ejected for twice as long
    kinds = [e.kind for _, e in res.events]
    assert kinds == ["readmit", "eject"]
    assert res.states["r1"].readmit_at == 90
    healthy = pool()
    res = evaluate(healthy, res.states, 90.0, CFG)
    assert ejected(res) == [] and res.states["r1"].ejections == 2
    res = evaluate(ins, res.states, 90.0 + 600, CFG)   # quiet long enough: backoff starts again
    assert res.states["r1"].readmit_at == 690 + 30


def test_a_stale_error_streak_does_not_eject_again() -> None:
    ins = pool(inp("r1", errors=6))
    res = evaluate(ins, {}, 0.0, CFG)
    res = evaluate(ins, res.states, 31.0, CFG)   # re-admitted; the router's streak did not grow
    assert ejected(res) == []
    res = evaluate(pool(inp("r1", errors=11)), res.states, 32.0, CFG)   # five new errors
    assert ejected(res) == ["r1"]
    res = evaluate(pool(inp("r1", errors=0)), res.states, 400.0, CFG)   # a success reset the router
    res = evaluate(pool(inp("r1", errors=5)), res.states, 401.0, CFG)
    assert ejected(res) == ["r1"]


def test_panic_lifts_outlier_ejections() -> None:
    # 4 candidates, two already ejected by outliers, a third one faulted away: healthy 1/3 < 50%
    prev = {"r0": OutlierState(ejected=True, cause="x", readmit_at=100),
            "r1": OutlierState(ejected=True, cause="x", readmit_at=100)}
    ins = [inp("r0"), inp("r1"), inp("r2"), inp("r3", candidate=False)]
    res = evaluate(ins, prev, 0.0, CFG)
    assert res.panic
    assert res.ejected_reason("r0", 0) == ""
    res = evaluate(ins + [inp("r4")], prev, 0.0, CFG)   # 2 of 4 healthy: 50%, not below
    assert not res.panic
    assert res.ejected_reason("r0", 0) != ""


@pytest.mark.parametrize("kw", [dict(latency_factor=0.5), dict(max_ejection_percent=120),
                                dict(latency_min_replicas=1), dict(backoff_initial_s=0)])
def test_config_rejects(kw: dict) -> None:
    with pytest.raises(ValueError):
        OutlierConfig(**kw)


replica = st.builds(OutlierInput, st.sampled_from([f"r{i}" for i in range(8)]), st.booleans(),
                    st.integers(-5, 50), st.floats(allow_nan=True, allow_infinity=True),
                    st.floats(allow_nan=True, allow_infinity=True))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(replica, max_size=8), min_size=1, max_size=8), st.floats(0, 100))
def test_never_more_than_max_percent(rounds: list[list[OutlierInput]], pct: float) -> None:
    cfg = OutlierConfig(max_ejection_percent=pct, backoff_initial_s=5, backoff_max_s=50)
    states: dict[str, OutlierState] = {}
    for t, ins in enumerate(rounds):
        res = evaluate(ins, states, float(t), cfg)
        uniq = {i.replica_id: i for i in ins}
        cands = [rid for rid, i in uniq.items() if i.candidate]
        newly = {rid for rid, e in res.events if e.kind == "eject"}
        assert newly <= set(cands)
        out = sum(1 for rid in cands if res.states[rid].ejected)
        # ejections only start while under the cap; older ones may exceed it when candidates leave
        if newly:
            assert out <= int(len(cands) * pct / 100 + 1e-9)
        states = res.states
