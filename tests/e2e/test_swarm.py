"""scripts/swarm.py end to end: 20 fake agents against a real control plane and etcd (real
processes, real gRPC). Checks the figures are sane, not how fast anything is."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
SWARM = Path(__file__).resolve().parents[2] / "scripts" / "swarm.py"


def test_swarm_of_20_is_ingested_and_flips_propagate(tmp_path: Path) -> None:
    argv = [sys.executable, str(SWARM), "--agents", "20", "--duration-s", "4", "--settle-s", "1",
            "--processes", "1", "--markers", "5", "--marker-period-s", "1.5", "--cp-cpu", "", "--swarm-cpu", "",
            "--workdir", str(tmp_path), "--json"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the script stops etcd and the control plane on SIGTERM
        out, err = proc.communicate(timeout=30)
        raise AssertionError("swarm did not finish in 150 s: " + err[-2000:]) from None
    assert proc.returncode == 0, err[-3000:]
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(lines) == 1, out
    r = lines[0]
    assert r["agents"] == 20 and r["streams_acked"] == 20
    assert r["errors"] == {} and r["reconnects"] == 0
    assert 0 < r["reports_per_s"] <= 20 * 1.5 and 0 < r["acks_per_s"] <= 20 * 1.5
    assert r["cp_cpu_pct"] > 0 and r["ticks_per_s"] > 0 and r["tables_per_s"] > 0
    assert r["flips"] > 0 and r["flips"] > r["flips_missed"]
    p = r["propagation_ms"]
    assert 0 < p["p50"] <= p["p95"] <= p["p99"] <= p["max"]
    # The control plane saw the swarm's identity: every stream authenticated, none refused.
    assert "stream_refused" not in (tmp_path / "controlplane-20.log").read_text()
