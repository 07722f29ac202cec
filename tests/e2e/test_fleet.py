"""The whole fleet as real processes on 127.0.0.1: etcd, control planes, simulated
replicas with agents, a router. Drives it over real HTTP and checks the routing
reacts to agents dying, etcd stopping and the leading control plane dying."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from etcd_records import etcd_json  # type: ignore[import-not-found]
from polling import wait_until  # type: ignore[import-not-found]

from tidegate.fleet.up import Fleet, UpConfig
from tidegate.simulator.profiles import get_profile

pytestmark = pytest.mark.e2e

MODEL = "sim-model"


def _post(url: str, body: dict[str, Any], timeout: float = 30.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _complete(router: str, max_tokens: int = 4) -> dict[str, Any]:
    status, body = _post(router + "/v1/completions",
                         {"model": MODEL, "prompt": "hello there", "max_tokens": max_tokens})
    assert status == 200, body
    return json.loads(body)


def _served_by_replica(info: dict[str, Any]) -> dict[str, float]:
    """Requests each simulated engine has finished, from its own /metrics."""
    out = {}
    for r in info["replicas"]:
        with urllib.request.urlopen(r["engine_url"] + "/metrics", timeout=5) as resp:
            text = resp.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith("vllm:e2e_request_latency_seconds_count"):
                total += float(line.rsplit(" ", 1)[1])
        out[r["id"]] = total
    return out


def _table(info: dict[str, Any]) -> dict[str, Any]:
    return etcd_json(info["etcd"], f"/tidegate/v1/tables/{MODEL}")


@pytest.fixture
def fleet(fresh_etcd: Any, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Fleet, dict[str, Any]]]:
    controlplanes = getattr(request, "param", 1)
    cfg = UpConfig(replicas=2, controlplanes=controlplanes, model=MODEL, profile="instant",
                   etcd=(fresh_etcd.endpoint,), run_dir=tmp_path / "run", report_interval_s=0.5,
                   ready_timeout_s=60)
    fl = Fleet(cfg)
    try:
        info = fl.start()
        yield fl, info
    finally:
        fl.stop()


def test_requests_stream_through_and_spread(fleet: tuple[Fleet, dict[str, Any]]) -> None:
    fl, info = fleet
    router = info["router_url"]
    body = _complete(router, max_tokens=5)
    assert body["usage"]["completion_tokens"] == 5

    status, raw = _post(router + "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": True})
    assert status == 200
    events = [e for e in raw.decode().split("\n\n") if e.startswith("data:")]
    assert events[-1].strip() == "data: [DONE]"
    assert len(events) >= 7  # one event per token, a final chunk, [DONE]

    for _ in range(30):
        _complete(router)
    served = _served_by_replica(info)
    assert all(v > 0 for v in served.values()), served

    table = _table(info)
    assert table["pool"] == MODEL
    assert {r["replicaId"] for r in table["replicas"]} == {"replica-0", "replica-1"}
    # The engines' seats (the agents' --engine-max-num-seqs, from the profile) reach the routers:
    # the pick's seat wait reads them.
    seats = get_profile("instant").max_num_seqs
    assert seats > 0 and all(r.get("maxNumSeqs") == seats for r in table["replicas"]), table["replicas"]


def test_dead_agent_stops_routing_to_its_replica(fleet: tuple[Fleet, dict[str, Any]]) -> None:
    fl, info = fleet
    router = info["router_url"]
    fl.child("agent-1").stop()

    def replica1_weight_zero() -> bool:
        entries = {r["replicaId"]: r for r in _table(info).get("replicas", [])}
        return "replica-1" not in entries or not entries["replica-1"].get("weight")

    wait_until(replica1_weight_zero, 20, "replica-1 to lose its weight after its agent died")
    time.sleep(0.5)  # etcd -> router watch propagation
    before = _served_by_replica(info)
    for _ in range(20):
        _complete(router)
    after = _served_by_replica(info)
    assert after["replica-1"] == before["replica-1"], (before, after)
    assert after["replica-0"] >= before["replica-0"] + 20


def test_router_keeps_serving_when_etcd_stops(fleet: tuple[Fleet, dict[str, Any]], fresh_etcd: Any) -> None:
    fl, info = fleet
    router = info["router_url"]
    _complete(router)
    fresh_etcd.stop()
    for _ in range(10):
        assert _complete(router)["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize("fleet", [2], indirect=True)
def test_standby_control_plane_takes_over(fleet: tuple[Fleet, dict[str, Any]]) -> None:
    fl, info = fleet
    wait_until(lambda: bool(_table(info).get("leaderId")), 20, "a leader to publish")
    leader = _table(info)["leaderId"]
    victim = {"cp-0": "controlplane-0", "cp-1": "controlplane-1"}[leader]
    os.killpg(fl.child(victim).pid, signal.SIGKILL)
    # The agents reconnect to the survivor; it wins the election once the dead leader's lease lapses
    # and republishes every table under its own id.
    wait_until(lambda: _table(info).get("leaderId") not in (None, "", leader), 30, "the standby to publish")
    assert _complete(info["router_url"])["usage"]["completion_tokens"] == 4


@pytest.fixture
def gpu_fleet(fresh_etcd: Any, tmp_path: Path) -> Iterator[tuple[Fleet, dict[str, Any]]]:
    cfg = UpConfig(replicas=2, model=MODEL, profile="instant", etcd=(fresh_etcd.endpoint,),
                   run_dir=tmp_path / "run", report_interval_s=0.5, ready_timeout_s=60, simulated_gpu=True)
    fl = Fleet(cfg)
    try:
        yield fl, fl.start()
    finally:
        fl.stop()


@pytest.mark.parametrize(("injected", "why"), [
    pytest.param({"xid": 79}, "79", id="xid-79"),
    pytest.param({"row_remap_failed": True}, "row remapping failed", id="row-remap-failed"),
])
def test_injected_gpu_fault_ejects_the_replica(gpu_fleet: tuple[Fleet, dict[str, Any]], injected: dict,
                                               why: str) -> None:
    """Simulated NVML (clearly labelled) reports a GPU fault on replica-1: the control plane ejects
    it, the router stops choosing it, requests keep succeeding, and the audit trail says why."""
    fl, info = gpu_fleet
    engine = next(r["engine_url"] for r in info["replicas"] if r["id"] == "replica-1")
    status, body = _post(engine + "/sim/faults", injected)
    assert status == 200 and json.loads(body)["simulated"] is True

    def ejected() -> bool:
        entries = {r["replicaId"]: r for r in _table(info).get("replicas", [])}
        e = entries.get("replica-1", {})
        return e.get("state") == "REPLICA_STATE_EJECTED" and not e.get("weight")

    wait_until(ejected, 20, f"replica-1 to be ejected after {injected}")
    time.sleep(0.5)  # etcd -> router watch propagation
    before = _served_by_replica(info)
    for _ in range(10):
        _complete(info["router_url"])
    after = _served_by_replica(info)
    assert after["replica-1"] == before["replica-1"], (before, after)

    cli = subprocess.run(
        [sys.executable, "-m", "tidegate.cli.main", "events", "--replica", "replica-1", "-o", "json",
         "--controlplane", info["controlplane"], "--token-file", info["tokens"]["viewer"]],
        capture_output=True, text=True, timeout=30)
    assert cli.returncode == 0, cli.stderr
    events = json.loads(cli.stdout)["events"]
    assert any(e["kind"] == "eject" and why in e["reason"] for e in events), events
