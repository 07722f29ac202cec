"""The closed-loop saturation estimate and the SLO-capacity search (fleetsim.capacity)."""

from __future__ import annotations

import pytest

from tidegate.fleetsim import capacity, workload
from tidegate.fleetsim.main import aggregate_capacity
from tidegate.simulator.profiles import get_profile

H100 = get_profile("llama3-8b-h100")
TINY = get_profile("tiny-h100")


def step_attainment(knee: float):
    """A fake fleet: full attainment up to `knee`, then falling linearly."""
    def measure(x: float) -> float:
        return 1.0 if x <= knee else max(0.0, 1.0 - (x - knee))
    return measure


@pytest.mark.parametrize("knee", [0.3, 0.77, 1.0, 1.04, 1.6, 3.1])
def test_search_finds_the_knee_within_two_percent(knee):
    # Attainment >= 0.95 up to knee + 0.05.
    found = capacity.search_capacity(step_attainment(knee), 0.95)
    edge = knee + 0.05
    assert found.load <= edge + 1e-9
    assert found.load >= edge / 1.02 - 1e-9
    assert found.attainment >= 0.95
    assert not found.capped
    assert len(found.probes) <= 12
    assert len({x for x, _ in found.probes}) == len(found.probes)  # no load measured twice


def test_search_capped_and_floor():
    up = capacity.search_capacity(lambda x: 1.0, 0.95, hi_limit=4.0)
    assert up.capped and up.load == 4.0
    down = capacity.search_capacity(lambda x: 0.5, 0.95, lo_limit=0.1)
    assert down.load == 0.0 and down.attainment == 0.5 and not down.capped
    assert min(x for x, _ in down.probes) == pytest.approx(0.1)


@pytest.mark.parametrize("kwargs", [{"target": 0.0}, {"target": 1.5}, {"target": 0.9, "tol": 0.0},
                                    {"target": 0.9, "grow": 1.0}, {"target": 0.9, "start": 10.0}])
def test_search_rejects_bad_arguments(kwargs):
    target = kwargs.pop("target")
    with pytest.raises(ValueError):
        capacity.search_capacity(lambda x: 1.0, target, **kwargs)


def test_saturation_is_deterministic_and_cached():
    lengths = [(600, 60), (2000, 20), (300, 400)] * 20
    a = capacity.saturation_rps(TINY, lengths, seed=1)
    assert a > 0
    assert capacity.saturation_rps(TINY, list(lengths), seed=1) == a  # cache hit (and same figure)
    capacity._cache.clear()
    assert capacity.saturation_rps(TINY, lengths, seed=1) == a


def test_saturation_falls_with_longer_outputs_and_scales_with_replicas():
    short = [workload.SimRequest(i, 0.0, 500, 50) for i in range(50)]
    long = [workload.SimRequest(i, 0.0, 500, 500) for i in range(50)]
    one = capacity.fleet_saturation_rps([TINY], short)
    assert capacity.fleet_saturation_rps([TINY] * 3, short) == pytest.approx(3 * one)
    assert capacity.fleet_saturation_rps([TINY], long) < one / 2


def test_saturation_leaves_out_requests_no_replica_fits():
    fits = [(500, 50)] * 10
    assert capacity.saturation_rps(TINY, fits + [(TINY.max_model_len, 10)]) == capacity.saturation_rps(TINY, fits)
    with pytest.raises(ValueError, match="no request"):
        capacity.saturation_rps(TINY, [(TINY.max_model_len, 10)])


def test_profile_groups():
    assert capacity.profile_groups([H100, TINY, H100]) == [(H100, 2), (TINY, 1)]


def test_aggregate_capacity_mean_and_spread():
    rows = [{"policy": "p", "routers": 1, "seed": s, "slo_capacity_rps": r, "load": 0.0, "attainment": a,
             "runs": 5, "capped": False} for s, r, a in [(0, 10.0, 0.96), (1, 12.0, 0.98)]]
    rows.append({"policy": "q", "routers": 4, "seed": 0, "slo_capacity_rps": 5.0, "load": 0.0, "attainment": 0.95,
                 "runs": 5, "capped": True})
    out = {(r["policy"], r["routers"]): r for r in aggregate_capacity(rows, cap=20.0)}
    p = out[("p", 1)]
    assert p["slo_capacity_rps"] == 11.0 and p["load"] == 0.55 and p["attainment"] == 0.97
    assert (p["slo_capacity_rps_min"], p["slo_capacity_rps_max"]) == (10.0, 12.0)
    assert p["slo_capacity_rps_stdev"] == pytest.approx(1.414, abs=1e-3) and p["seeds"] == [0, 1]
    q = out[("q", 4)]
    assert q["capped"] and "slo_capacity_rps_min" not in q
