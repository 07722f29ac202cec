"""The operations CLI through its real entry point (`python -m tidegate.cli.main ...` subprocesses)
against a real local fleet: etcd, a control plane with the tokens `tidegate up` writes, two
simulated replicas with agents, a router. The CLI finds the fleet through the endpoints file
($TIDEGATE_HOME/endpoints.json), as it does after `tidegate up`."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from etcd_records import etcdctl_path  # type: ignore[import-not-found]
from livefleet import Cli, up_fleet  # type: ignore[import-not-found]
from polling import wait_until  # type: ignore[import-not-found]

from tidegate.etcd_server import EmbeddedEtcd

pytestmark = pytest.mark.e2e

MODEL = "sim-model"


@pytest.fixture(scope="module")
def fleet(etcd_server: EmbeddedEtcd, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[dict[str, Any], Cli]]:
    tmp = tmp_path_factory.mktemp("cli")
    # A private key space on the session etcd: earlier tests' intents, budgets and events must not leak in.
    subprocess.run([etcdctl_path(), f"--endpoints={etcd_server.endpoint}", "del", "--prefix", "/tidegate/"],
                   check=True, capture_output=True, timeout=10)
    with up_fleet(tmp, etcd_server.endpoint, MODEL, replicas=2, profile="instant") as (_, info, cli):
        wait_until(lambda: _states(cli) == {"replica-0": "ready", "replica-1": "ready"}, 30, "both replicas ready")
        yield info, cli


@pytest.fixture
def uncordon_all(fleet: tuple[dict[str, Any], Cli]) -> Iterator[None]:
    yield
    _, cli = fleet
    cli("uncordon", "replica-0", "replica-1")


def _states(cli: Cli) -> dict[str, str]:
    r = cli("get", "replicas", "-o", "json")
    if r.returncode != 0:
        return {}
    return {x["id"]: x["state"] for x in json.loads(r.stdout)["replicas"]}


def _complete(router: str) -> tuple[int, str]:
    req = urllib.request.Request(router + "/v1/completions", method="POST",
                                 data=json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()
            return resp.status, resp.headers.get("X-Tidegate-Replica", "")
    except urllib.error.HTTPError as e:
        return e.code, ""


class Load:
    """A steady stream of requests through the router, recording which replica served each."""

    def __init__(self, router: str) -> None:
        self.router = router
        self.served: list[str] = []
        self.failed: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            status, replica = _complete(self.router)
            if status == 200:
                self.served.append(replica)
            else:
                self.failed.append(status)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def mark(self) -> int:
        return len(self.served)

    def avoided_since(self, start: int, replica: str, run: int) -> bool:
        """True once the last `run` requests after `start` all went elsewhere."""
        tail = self.served[start:]
        return len(tail) >= run and replica not in tail[-run:]


def test_get_replicas_and_pools(fleet: tuple[dict[str, Any], Cli]) -> None:
    _, cli = fleet
    r = cli("get", "replicas")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:5] == ["ID", "POOL", "REGION/ZONE", "STATE", "WEIGHT"]
    assert [ln.split()[0] for ln in lines[1:]] == ["replica-0", "replica-1"]
    assert "ready" in lines[1]
    wide = cli("get", "replicas", "-o", "wide")
    assert wide.returncode == 0 and "ENDPOINT" in wide.stdout and "http://127.0.0.1:" in wide.stdout
    doc = cli.json("get", "replicas")
    assert doc["kind"] == "ReplicaList" and [x["id"] for x in doc["replicas"]] == ["replica-0", "replica-1"]
    assert {x["pool"] for x in doc["replicas"]} == {MODEL}
    assert cli.json("get", "replicas", "--pool", "other")["replicas"] == []
    assert [x["id"] for x in cli.json("get", "replicas", "--state", "ready")["replicas"]] == ["replica-0",
                                                                                             "replica-1"]
    pools = cli("get", "pools")
    assert pools.returncode == 0 and pools.stdout.splitlines()[1].startswith(MODEL)
    pdoc = cli.json("get", "pools")
    assert pdoc["pools"][0]["pool"] == MODEL and pdoc["pools"][0]["replicas"] == 2


def test_describe(fleet: tuple[dict[str, Any], Cli]) -> None:
    _, cli = fleet
    r = cli("describe", "replica", "replica-0")
    assert r.returncode == 0, r.stderr
    for needle in ("Replica:     replica-0", f"Pool:        {MODEL}", "Hello:", "Engine:          tidegate-sim",
                   "Last report:", "Events:"):
        assert needle in r.stdout, needle
    doc = cli.json("describe", "replica", "replica-0")
    assert doc["summary"]["id"] == "replica-0" and doc["hello"]["replica_id"] == "replica-0"
    missing = cli("describe", "replica", "no-such-replica")
    assert missing.returncode == 6, missing.stderr
    assert "no-such-replica" in missing.stderr


def test_cordon_stops_new_requests_then_uncordon(fleet: tuple[dict[str, Any], Cli], uncordon_all: None) -> None:
    info, cli = fleet
    with Load(info["router_url"]) as load:
        wait_until(lambda: {"replica-0", "replica-1"} <= set(load.served), 20, "both replicas to serve")
        dry = cli("cordon", "replica-0", "--dry-run")
        assert dry.returncode == 0 and "dry run" in dry.stdout
        r = cli("cordon", "replica-0", "--reason", "kernel upgrade")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "replica/replica-0 cordoned"
        start = load.mark()
        wait_until(lambda: load.avoided_since(start, "replica-0", 50), 20, "requests to stop reaching replica-0")
        again = cli("cordon", "replica-0")
        assert again.returncode == 0 and "already cordoned" in again.stdout
        assert _states(cli)["replica-0"] == "cordoned"

        u = cli("uncordon", "replica-0")
        assert u.returncode == 0 and u.stdout.strip() == "replica/replica-0 uncordoned", u.stderr
        back = load.mark()
        wait_until(lambda: "replica-0" in load.served[back:], 20, "replica-0 to serve again")
    assert load.failed == []


def test_cordon_by_selector_json(fleet: tuple[dict[str, Any], Cli], uncordon_all: None) -> None:
    _, cli = fleet
    doc = cli.json("cordon", "--selector", "zone=local-b", "--dry-run")
    assert doc["kind"] == "IntentResult" and doc["dry_run"] is True
    assert [x["replica_id"] for x in doc["results"]] == ["replica-1"]
    assert _states(cli)["replica-1"] == "ready"


def test_usage_errors(fleet: tuple[dict[str, Any], Cli]) -> None:
    _, cli = fleet
    assert cli("cordon").returncode == 2
    assert cli("cordon", "--selector", "gpu=h100").returncode == 2
    assert cli("drain", "replica-0", "--timeout", "soon").returncode == 2
    assert cli("get", "replicas", "--state", "sleepy").returncode == 2
    assert cli("budget", "set", "zone:a", "--min-available", "1").returncode == 2
    nowhere = cli("get", "replicas", env={"TIDEGATE_HOME": "/nonexistent-tidegate-home"})
    assert nowhere.returncode == 2 and "no control-plane address" in nowhere.stderr


def test_tokens(fleet: tuple[dict[str, Any], Cli], tmp_path: Path) -> None:
    info, cli = fleet
    viewer = info["tokens"]["viewer"]
    assert cli("get", "replicas", "--token-file", viewer).returncode == 0
    denied = cli("cordon", "replica-0", "--token-file", viewer)
    assert denied.returncode == 5, denied.stderr
    assert "PERMISSION_DENIED" in denied.stderr
    secret = Path(viewer).read_text().strip()
    assert secret not in denied.stderr and secret not in denied.stdout
    assert _states(cli)["replica-0"] == "ready"
    bad = cli("get", "replicas", env={"TIDEGATE_TOKEN": "not-a-real-token"})
    assert bad.returncode == 5 and "UNAUTHENTICATED" in bad.stderr and "not-a-real-token" not in bad.stderr
    # --controlplane and TIDEGATE_CONTROLPLANE override the endpoints file; a dead address is skipped.
    dead = _dead_address()
    both = cli("get", "replicas", "--controlplane", f"{dead},{info['controlplane']}")
    assert both.returncode == 0, both.stderr
    env = cli("get", "replicas", env={"TIDEGATE_CONTROLPLANE": dead})
    assert env.returncode == 1 and "UNAVAILABLE" in env.stderr


def _dead_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_events_list_the_cordon_with_its_actor(fleet: tuple[dict[str, Any], Cli], uncordon_all: None) -> None:
    _, cli = fleet
    assert cli("cordon", "replica-1", "--reason", "audit me").returncode == 0
    assert cli("uncordon", "replica-1").returncode == 0
    doc = cli.json("events", "--replica", "replica-1")
    kinds = [(e["kind"], e["actor"], e["reason"]) for e in doc["events"]]
    assert ("cordon", "sre:local-operator", "audit me") in kinds, kinds
    assert any(k == "uncordon" for k, _, _ in kinds), kinds
    table = cli("events")
    assert table.returncode == 0 and "sre:local-operator" in table.stdout and "audit me" in table.stdout


def test_events_follow_prints_new_events(fleet: tuple[dict[str, Any], Cli], uncordon_all: None) -> None:
    _, cli = fleet
    proc = subprocess.Popen([sys.executable, "-m", "tidegate.cli.main", "events", "--follow", "--replica",
                             "replica-0", "-o", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=cli.env)
    try:
        time.sleep(1.5)  # let it list and open the watch; an event before that is listed instead, either way works
        assert cli("cordon", "replica-0", "--reason", "follow me").returncode == 0
        seen = []
        deadline = time.monotonic() + 20
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(json.loads(line))
            if any(e["reason"] == "follow me" for e in seen):
                break
        assert any(e["kind"] == "cordon" and e["reason"] == "follow me" for e in seen), seen
    finally:
        proc.terminate()
        rc = proc.wait(timeout=10)
    assert rc == 0, proc.stderr.read() if proc.stderr else ""


def test_top_once(fleet: tuple[dict[str, Any], Cli]) -> None:
    _, cli = fleet
    r = cli("top", "--once")
    assert r.returncode == 0, r.stderr
    assert "Pools" in r.stdout and "Replicas" in r.stdout and "replica-1" in r.stdout and MODEL in r.stdout
    assert "\x1b[" not in r.stdout  # no colour codes when stdout is not a terminal


def test_drain_completes(fleet: tuple[dict[str, Any], Cli], uncordon_all: None) -> None:
    _, cli = fleet
    r = cli("drain", "replica-1", "--timeout", "30s", "--grace-period", "0s", "--reason", "reboot")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "drained: replica-1" in r.stdout
    assert _states(cli)["replica-1"] == "drained"
    again = cli.json("drain", "replica-1", "--timeout", "10s", "--grace-period", "0s")
    assert again["timed_out"] is False and again["progress"][0]["done"] is True


class StalledClient:
    """A streaming request whose client stops reading: the router holds it in flight."""

    def __init__(self, router: str) -> None:
        host, port = router.removeprefix("http://").split(":")
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect((host, int(port)))
        body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 100_000, "stream": True,
                           "ignore_eos": True}).encode()
        self.sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        self.first = self.sock.recv(64)  # the response started; now stop reading

    def close(self) -> None:
        self.sock.close()


def test_drain_times_out_while_a_request_is_in_flight(fleet: tuple[dict[str, Any], Cli],
                                                      uncordon_all: None) -> None:
    info, cli = fleet
    assert cli("cordon", "replica-1").returncode == 0  # so the stalled request lands on replica-0
    wait_until(lambda: _states(cli)["replica-1"] == "cordoned", 10, "replica-1 cordoned")
    time.sleep(1.0)  # the router's table follows the leader's within its watch delay
    stalled = StalledClient(info["router_url"])
    try:
        assert stalled.first.startswith(b"HTTP/1.1 200"), stalled.first
        r = cli("drain", "replica-0", "--timeout", "3s", "--grace-period", "0s", "--force", "--reason", "x")
        # --force: at the deadline the server marks it drained even though work is left.
        assert r.returncode == 0, r.stdout + r.stderr
        cli("uncordon", "replica-0")
        wait_until(lambda: _states(cli)["replica-0"] == "ready", 10, "replica-0 ready")
        r = cli("drain", "replica-0", "--timeout", "3s", "--grace-period", "0s")
        assert r.returncode == 4, r.stdout + r.stderr
        assert "timed out" in r.stderr and "replica/replica-0" in r.stderr
    finally:
        stalled.close()


def test_budget_refusal(fleet: tuple[dict[str, Any], Cli], uncordon_all: None) -> None:
    _, cli = fleet
    s = cli("budget", "set", f"pool:{MODEL}", "--min-available", "2")
    assert s.returncode == 0, s.stderr
    try:
        listed = cli.json("budget", "list")
        assert [(b["scope"], b["min_available"]) for b in listed["budgets"]] == [(f"pool:{MODEL}", "2")]
        refused = cli("cordon", "replica-0")
        assert refused.returncode == 3, refused.stdout + refused.stderr
        assert "refused" in refused.stdout and f"pool:{MODEL}" in refused.stdout
        assert _states(cli)["replica-0"] == "ready"
        forced = cli("cordon", "replica-0", "--force")
        assert forced.returncode == 0, forced.stdout + forced.stderr
    finally:
        d = cli("budget", "delete", f"pool:{MODEL}")
        assert d.returncode == 0, d.stderr
    assert cli.json("budget", "list")["budgets"] == []
