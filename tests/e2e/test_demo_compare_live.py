"""`tidegate demo --compare` as a user runs it: a real subprocess starts etcd, a control plane,
simulated replicas with agents and a router, replays the same trace through two policies (the
router restarted in between) and prints, writes and charts both."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def test_compare_two_policies_side_by_side(tmp_path: Path) -> None:
    out_json, plot_dir = tmp_path / "out.json", tmp_path / "plot"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidegate.cli.main", "demo", "--replicas", "2", "--duration", "4", "--load", "0.5",
         "--compare", "round_robin", "--settle-s", "0.5", "--class-mix", "critical=0.5,sheddable=0.5", "--pool-slo",
         "--plot", str(plot_dir), "--json", str(out_json),
         "--endpoints-file", str(tmp_path / "endpoints.json"), "--run-dir", str(tmp_path / "run"),
         "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out

    header = next(line for line in out.splitlines() if "tidegate" in line and "round_robin" in line
                  and "policy" not in line)
    assert header.index("tidegate") < header.index("round_robin")
    assert any(line.startswith("SLO attainment") and line.count("%") == 2 for line in out.splitlines()), out

    rep = json.loads(out_json.read_text())
    runs = rep["compare"]
    assert [r["policy"] for r in runs] == ["tidegate", "round_robin"]
    for r in runs:
        assert r["sent"] > 0 and r["completed"] == r["sent"], r
        assert r["ttft_ms"]["p50"] > 0 and r["tpot_ms"]["p50"] > 0
        assert 0 <= r["slo_attainment"] <= 1 and r["goodput_rps"] >= 0
        assert r["rejected"] == {} and r["unavailable"] == 0 and r["errors"] == {}
        # Per-run replica counters: each run's own requests, not the fleet's since it started.
        assert sum(x["requests"] for x in r["replicas"]) == r["completed"]
        assert set(r["classes"]) == {"critical", "sheddable"}
        assert sum(c["sent"] for c in r["classes"].values()) == r["sent"]
    assert runs[0]["sent"] == runs[1]["sent"], "both policies get the same requests"
    assert runs[0]["classes"]["critical"]["sent"] == runs[1]["classes"]["critical"]["sent"]
    assert any(line.startswith("  attainment critical") for line in out.splitlines()), out
    assert rep["policy"] == "tidegate"  # the top level stays the first run's report

    chart = Path(rep["plot"])
    assert chart.parent == plot_dir and chart.stat().st_size > 0
    assert not (tmp_path / "endpoints.json").exists()
