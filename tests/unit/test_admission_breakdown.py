"""scripts/admission_breakdown.py, the split behind BENCHMARKS' admission diagnoses: every request
lands in exactly one path, and committing after 50 ms (--admission-decide) leaves no rejection
for a deadline after arrival, while without it an overloaded queue rejects some held requests late."""

from __future__ import annotations

from pathlib import Path

import pytest
from module_file import load_module  # type: ignore[import-not-found]

from tidegate.fleetsim import main as fm

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "admission_breakdown.py"
REQUESTS = 900


def _module():
    return load_module(SCRIPT)


def _breakdown():
    return _module().breakdown


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


def test_per_replica_split_counts_every_served_request_once_and_finds_the_slowed_replica() -> None:
    m = _module()
    cfg = _cfg("off").model_copy(update={"slow_replicas": "1:3", "load": (1.0,)})
    result, ttft_s, tpot_s = m.run(cfg)
    paths, replicas = m.paths(result, ttft_s, tpot_s), m.by_replica(result, ttft_s, tpot_s)
    served = {cls: sum(v for k, v in c.items() if not k.startswith("rejected")) for cls, c in paths.items()}
    for cls, n in served.items():
        assert sum(c[cls] for c in replicas.values()) == n
        missed = sum(v for k, v in paths[cls].items() if "missed" in k and not k.startswith("rejected"))
        assert sum(c[f"{cls} missed TTFT"] + c[f"{cls} missed TPOT"] for c in replicas.values()) == missed

    def miss_share(replica: str) -> float:
        c = replicas[replica]
        return sum(v for k, v in c.items() if "missed" in k) / max(1, sum(v for k, v in c.items() if "missed" not in k))

    # the last replica steps three times slower than its profile: its requests miss more often
    assert miss_share("replica-03") > max(miss_share(f"replica-0{i}") for i in range(3))
