"""Pool SLO targets end to end: real etcd, a real control plane, the real CLI (subprocesses), a
simulated replica with its agent and a real router (a `tidegate up` fleet). `pool set-slo`
persists in etcd, shows in `get pools`, reaches the router's snapshot of the pool (its /health),
is audited, survives a control-plane restart, and clears."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from etcd_records import etcd_json  # type: ignore[import-not-found]
from livefleet import Cli, up_fleet, warm_rates  # type: ignore[import-not-found]
from polling import wait_until  # type: ignore[import-not-found]

from tidegate.fleet.up import Fleet
from tidegate.ops import exitcodes

pytestmark = pytest.mark.e2e

MODEL = "slo-model"


@pytest.fixture
def fleet(fresh_etcd: Any, tmp_path: Path) -> Iterator[tuple[Fleet, dict[str, Any], Cli]]:
    with up_fleet(tmp_path, fresh_etcd.endpoint, MODEL) as started:
        yield started


def _router_slo(info: dict[str, Any]) -> Any:
    with urllib.request.urlopen(info["router_url"] + "/health", timeout=5) as resp:
        return json.loads(resp.read())["pools"].get(MODEL, {}).get("slo", "no pool")


def _pool(cli: Cli) -> dict[str, Any]:
    return next(p for p in cli.json("get", "pools")["pools"] if p["pool"] == MODEL)


def _restart_controlplane(fl: Fleet, info: dict[str, Any]) -> None:
    """Stop the only control plane and start a fresh process on the same address (agents and
    the CLI keep their configured address)."""
    cp = fl.child("controlplane-0")
    cp.stop()
    port = info["controlplane"].rpartition(":")[2]
    cp.argv = [a if a != "127.0.0.1:0" else f"127.0.0.1:{port}" for a in cp.argv]
    cp.start()
    assert cp.wait_port() == int(port)


def test_pool_slo_end_to_end(fleet: tuple[Fleet, dict[str, Any], Cli]) -> None:
    fl, info, cli = fleet
    assert _router_slo(info) is None
    before = _pool(cli)
    assert before["slo"] is None and before["recommended_replicas"] == 0
    assert before["scale"]["binding"] == "none" and "no SLO" in before["scale"]["reason"]

    r = cli("pool", "set-slo", MODEL, "--ttft", "2s", "--tpot", "100ms")
    assert r.returncode == 0 and "SLO set" in r.stdout and "2.00s/100ms" in r.stdout, (r.stdout, r.stderr)
    again = cli.json("pool", "set-slo", MODEL, "--ttft", "2000ms", "--tpot", "0.1")
    assert again["message"] == "unchanged"

    # Persisted in etcd, readable by an operator, and copied into the pool's routing table.
    stored = etcd_json(info["etcd"], f"/tidegate/v1/slos/{MODEL}")
    assert (stored["ttftS"], stored["tpotS"], stored["actor"]) == (2.0, 0.1, "sre:local-operator")
    wait_until(lambda: _router_slo(info) == {"ttft_s": 2.0, "tpot_s": 0.1}, 10, "the router to hold the SLO")
    assert etcd_json(info["etcd"], f"/tidegate/v1/tables/{MODEL}")["slo"]["ttftS"] == 2.0

    # Shown by `get pools` (JSON and table) and `pool get-slo`; audited.
    pool = _pool(cli)
    assert pool["slo"]["ttft_s"] == 2.0 and pool["slo"]["tpot_s"] == 0.1
    assert pool["scale"] is not None and pool["scale"]["reason"]
    table = cli("get", "pools")
    assert table.returncode == 0 and "TTFT/TPOT" in table.stdout and "2.00s/100ms" in table.stdout
    slos = cli.json("pool", "get-slo")["slos"]
    assert [(s["pool"], s["ttft_s"], s["tpot_s"]) for s in slos] == [(MODEL, 2.0, 0.1)]
    kinds = [(e["kind"], e["pool"]) for e in cli.json("events")["events"]]
    assert ("slo_changed", MODEL) in kinds

    # With an SLO and engine rates fitted from the replica's telemetry, the pool gets a figure.
    # Distinct long prompts (no prefix-cache hits), enough evidence for the rate estimator.
    warm_rates(info["router_url"], info["etcd"], MODEL, replicas=1)
    try:
        wait_until(lambda: _pool(cli)["recommended_replicas"] >= 1, 30, "a scale recommendation")
    except AssertionError as e:
        raise AssertionError(f"{e}: {_pool(cli)['scale']}") from None
    scale = _pool(cli)["scale"]
    assert scale["binding"] != "none" and scale["current_replicas"] == 1, scale

    # A viewer may read but not set; garbage is refused before any call.
    viewer = {"TIDEGATE_TOKEN_FILE": info["tokens"]["viewer"]}
    assert cli("pool", "get-slo", MODEL, env=viewer).returncode == exitcodes.OK
    denied = cli("pool", "set-slo", MODEL, "--ttft", "1s", "--tpot", "50ms", env=viewer)
    assert denied.returncode == exitcodes.AUTH, denied.stderr
    assert cli("pool", "set-slo", MODEL, "--ttft", "0", "--tpot", "50ms").returncode == exitcodes.USAGE

    # The control plane goes away: the router keeps the SLO it holds; a fresh process reads it
    # back from etcd, shows it and publishes changes.
    cp = fl.child("controlplane-0")
    cp.stop()
    assert _router_slo(info) == {"ttft_s": 2.0, "tpot_s": 0.1}
    _restart_controlplane(fl, info)
    wait_until(lambda: cli("get", "pools", "-o", "json").returncode == 0 and _pool(cli)["slo"] is not None
               and _pool(cli)["available"] == 1, 30, "the restarted control plane to lead with the replica")
    assert _pool(cli)["slo"]["ttft_s"] == 2.0
    assert _router_slo(info) == {"ttft_s": 2.0, "tpot_s": 0.1}
    r = cli("pool", "set-slo", MODEL, "--ttft", "1500ms", "--tpot", "80ms")
    assert r.returncode == 0, r.stderr
    wait_until(lambda: _router_slo(info) == {"ttft_s": 1.5, "tpot_s": 0.08}, 10, "the router to get the new SLO")
    assert etcd_json(info["etcd"], f"/tidegate/v1/scale/{MODEL}")["pool"] == MODEL

    # Cleared: gone from etcd, from the table and from the router; get-slo of the pool says so.
    cleared = cli.json("pool", "clear-slo", MODEL)
    assert cleared["message"] == "cleared"
    assert cli.json("pool", "clear-slo", MODEL)["message"] == "no SLO set"
    wait_until(lambda: _router_slo(info) is None, 10, "the router to drop the SLO")
    assert etcd_json(info["etcd"], f"/tidegate/v1/slos/{MODEL}") == {}
    assert cli("pool", "get-slo", MODEL).returncode == exitcodes.NOT_FOUND
