"""scripts/peer_view_probe.py, the probe behind BENCHMARKS' 4-router diagnosis: with one router
nobody else's prefill is outstanding or counted; with two, peers' prefill is really outstanding on
the chosen replicas and the router counts some of it; prefill predicted and served are of one size."""

from __future__ import annotations

from pathlib import Path

import pytest
from module_file import load_module  # type: ignore[import-not-found]

from tidegate.fleetsim import main as fm
from tidegate.policy import slo_pick

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "peer_view_probe.py"


def _probe_module():
    return load_module(SCRIPT)


def _cfg(routers: int) -> fm.SimulateConfig:
    return fm.SimulateConfig(workload="poisson", rate=60.0, requests=600, prompt_mean=3000, output_mean=60,
                             replicas=4, profile=["llama3-8b-h100"], policy=["tidegate"], admission=True,
                             class_mix=fm.OVERLOAD_CLASS_MIX, load=[1.3], routers=[routers],
                             seed=3)


@pytest.mark.parametrize("routers", [1, 2])
def test_the_probe_sees_peers_only_where_there_are_some(routers: int) -> None:
    probe = _probe_module().probe
    hook = slo_pick.TidegatePolicy.on_dispatch
    out = probe(_cfg(routers), window_s=2.0)
    assert slo_pick.TidegatePolicy.on_dispatch is hook   # the policy is left as it was
    assert out["dispatches"] > 100
    peers = out["peers_outstanding_tokens"]
    if routers == 1:
        assert peers == {"real_mean": 0.0, "counted_mean": 0.0}
        assert out["outstanding_error_tokens"]["p50"] == pytest.approx(0.0, abs=1.0)
    else:
        assert peers["real_mean"] > 0 and peers["counted_mean"] > 0
    assert len(out["router_margins"]) == routers
    t = out["prefill_tokens"]
    assert 0.8 < t["predicted"] / t["served"] < 1.25
    assert sum(w["offered_rps"] for w in out["windows"]) * 2.0 == 600
    for w in out["windows"]:
        assert sum(w["met_rps_by_class"].values()) == pytest.approx(w["met_rps"]) and w["met_rps"] <= w["served_rps"]
