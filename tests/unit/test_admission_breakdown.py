"""scripts/admission_breakdown.py, the split behind BENCHMARKS' admission diagnoses: every request
lands in exactly one path, and committing after 50 ms (--admission-decide) leaves no rejection
for a deadline after arrival, while without it an overloaded queue rejects some held requests late."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tidegate.fleetsim import main as fm

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "admission_breakdown.py"
REQUESTS = 900


def _breakdown():
    spec = importlib.util.spec_from_file_location("admission_breakdown", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.breakdown


def _cfg(decide: str) -> fm.SimulateConfig:
    # Bursty arrivals at twice the fleet's estimated capacity: the queue holds requests it later
    # finds it cannot serve in time.
    return fm.SimulateConfig(workload="gamma", burstiness=4.0, rate=60.0, requests=REQUESTS, prompt_mean=3000,
                             output_mean=60, replicas=4, profile=["llama3-8b-h100"], policy=["tidegate"],
                             admission=True, class_mix=fm.OVERLOAD_CLASS_MIX, load=[2.0],
                             seed=3, admission_decide=decide)


@pytest.mark.parametrize("decide", ["off", "50ms"])
def test_every_request_has_one_path_and_committing_ends_late_deadline_rejections(decide: str) -> None:
    out = _breakdown()(_cfg(decide))
    assert sum(sum(c.values()) for c in out.values()) == REQUESTS
    paths = {k for c in out.values() for k in c}
    late_deadline = sum(c[k] for c in out.values() for k in c if k == "rejected deadline_unmeetable late")
    assert any(k.startswith("rejected") for k in paths) and any(k.endswith("met") for k in paths)
    if decide == "off":
        assert late_deadline > 0
    else:
        assert late_deadline == 0
