"""Two real routers on one real etcd (a `tidegate up` fleet plus a second router process) share
their load: a router that placed requests writes its router-load record (binary protobuf, under
its presence lease) with its per-replica load and the prefix blocks it placed; the other router
counts it (`tidegate_router_peer_routers`); a router that stops takes its record with it (its
lease is revoked) and its peer stops counting it."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from etcd_records import etcdctl_path  # type: ignore[import-not-found]
from livefleet import Cli, distinct_prompts, up_fleet  # type: ignore[import-not-found]
from polling import wait_until  # type: ignore[import-not-found]

from tidegate.fleet.up import Fleet
from tidegate.router.peer_load import peer_reports
from tidegate.v1.records_pb2 import RouterLoad

pytestmark = pytest.mark.e2e

MODEL = "peer-model"


@pytest.fixture
def fleet(fresh_etcd: Any, tmp_path: Path) -> Iterator[tuple[Fleet, dict[str, Any], Cli, str]]:
    with up_fleet(tmp_path, fresh_etcd.endpoint, MODEL, replicas=2) as (fl, info, cli):
        yield fl, info, cli, fl.add_router("router-1")


def _record(etcd: str, router_id: str) -> RouterLoad | None:
    out = subprocess.run([etcdctl_path(), f"--endpoints={etcd}", "get", f"/tidegate/v1/router-load/{router_id}",
                          "-w", "json"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    kvs = json.loads(out.stdout).get("kvs", [])
    return RouterLoad.FromString(base64.b64decode(kvs[0]["value"])) if kvs else None


def _peers(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("tidegate_router_peer_routers "):
                return float(line.split()[1])
    raise AssertionError("tidegate_router_peer_routers not exported")


def _chat(url: str, text: str) -> int:
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": text}]}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        resp.read()
        return resp.status


def test_routers_share_their_load_and_blocks_through_etcd(fleet: tuple[Fleet, dict[str, Any], Cli, str]) -> None:
    fl, info, _cli, second = fleet
    first = info["router_url"]
    assert _peers(first) == 0 and _peers(second) == 0        # nobody has placed anything yet
    assert _record(info["etcd"], "router-0") is None

    for prompt in distinct_prompts(3, 4, 400):               # ~6 blocks of 64 tokens each
        assert _chat(first, prompt) == 200
    wait_until(lambda: _record(info["etcd"], "router-0") is not None, 10, "router-0's load record")
    rec = _record(info["etcd"], "router-0")
    assert rec is not None and rec.router_id == "router-0"
    report = peer_reports(rec)[MODEL]                        # it decodes and passes validation
    assert report.loads, rec
    assert set(report.loads) <= {r["id"] for r in info["replicas"]}
    wait_until(lambda: _peers(second) == 1, 10, "router-1 to count router-0")

    assert _chat(second, "a question for the second router " * 40) == 200
    wait_until(lambda: _peers(first) == 1, 10, "router-0 to count router-1")

    child = fl.child("router-1")
    assert child.proc is not None
    child.proc.send_signal(signal.SIGTERM)                   # a clean stop revokes its lease
    child.proc.wait(timeout=20)
    wait_until(lambda: _peers(first) == 0, 5, "router-0 to forget the stopped router")
    assert _record(info["etcd"], "router-1") is None
