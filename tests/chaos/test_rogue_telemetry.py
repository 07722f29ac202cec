"""Chaos: rogue telemetry clients under steady load route nothing.

A real local fleet (etcd, control plane, two simulated replicas with their agents, a router, as
`tidegate up` starts it, with the credentials it makes for itself) serves steady traffic while
rogue clients keep trying to register a replica at an endpoint of theirs, which records every
request it gets: with no token, with a made-up token, and with the real token of another
replica's agent; each claiming a new replica id and an existing one. Every attempt is refused,
the rogue endpoint receives no request, every user request succeeds, and etcd never holds the
rogue endpoint in any key under /tidegate/v1/. The figures are printed (pytest -s)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest

from tidegate.fleet.up import Fleet, UpConfig
from tidegate.v1 import telemetry_pb2, telemetry_pb2_grpc

pytestmark = pytest.mark.e2e

MODEL = "sim-model"
REQUESTS = 40
REFUSED = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.ALREADY_EXISTS}


class RogueEngine:
    """An OpenAI-looking server that counts what reaches it."""

    def __init__(self) -> None:
        hits = self.hits = [0]

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                hits[0] += 1
                body = json.dumps({"id": "x", "object": "text_completion", "model": MODEL,
                                   "choices": [{"index": 0, "text": "stolen", "finish_reason": "stop"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer  # noqa: N815 (http.server's method names)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> RogueEngine:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


def rogue_attempt(address: str, token: str | None, replica_id: str, endpoint: str) -> tuple[grpc.StatusCode, int]:
    """One registration attempt: Hello, a pause (so the refusal does not race a write), reports.
    Returns the stream's status and how many Acks it got."""
    def messages() -> Iterator[telemetry_pb2.AgentMessage]:
        yield telemetry_pb2.AgentMessage(hello=telemetry_pb2.Hello(
            replica_id=replica_id, pool=MODEL, endpoint=endpoint, region="local", zone="local-a",
            protocol_version=1, engine_kind="vllm"))
        time.sleep(0.5)
        for seq in range(1, 6):
            yield telemetry_pb2.AgentMessage(report=telemetry_pb2.Report(seq=seq, engine=telemetry_pb2.EngineStats(
                healthy=True, kv_capacity_tokens=10**6, kv_free_tokens=10**6, has_kv_capacity=True)))
            time.sleep(0.2)

    acks = 0
    with grpc.insecure_channel(address) as ch:
        md = (("authorization", f"Bearer {token}"),) if token else None
        try:
            for msg in telemetry_pb2_grpc.TelemetryStub(ch).Stream(messages(), metadata=md, timeout=10):
                acks += msg.WhichOneof("msg") == "ack"
        except grpc.RpcError as e:
            return e.code(), acks
    return grpc.StatusCode.OK, acks


def etcdctl() -> str:
    return shutil.which("etcdctl") or str(Path(sys.executable).parent / "etcdctl")


def complete(router: str) -> int:
    req = urllib.request.Request(router + "/v1/completions", method="POST",
                                 data=json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 4}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def test_rogue_telemetry_clients_route_nothing(fresh_etcd: Any, tmp_path: Path) -> None:
    cfg = UpConfig(replicas=2, model=MODEL, profile="instant", etcd=(fresh_etcd.endpoint,),
                   run_dir=tmp_path / "run", report_interval_s=0.5, ready_timeout_s=60)
    with Fleet(cfg) as fleet, RogueEngine() as rogue:
        info = fleet.start()
        # Every value written under /tidegate/v1/ from now on, as an operator would watch it.
        watch_out = (tmp_path / "watch.txt").open("wb")
        watch = subprocess.Popen([etcdctl(), f"--endpoints={info['etcd']}", "watch", "--prefix", "/tidegate/v1/"],
                                 stdout=watch_out, stderr=subprocess.STDOUT)
        stop = threading.Event()
        outcomes: list[tuple[str, grpc.StatusCode, int]] = []
        other_agents_token = Path(tmp_path / "run" / "agent-tokens" / "replica-1.token").read_text().strip()
        attempts = [(name, token, rid) for name, token in
                    (("no-token", None), ("made-up", "made-up-token"), ("replica-1's token", other_agents_token))
                    for rid in ("replica-0", "replica-99")]

        def rogues() -> None:
            while not stop.is_set():
                for name, token, rid in attempts:
                    code, acks = rogue_attempt(info["controlplane"], token, rid, rogue.url)
                    outcomes.append((f"{name} as {rid}", code, acks))
                    stop.wait(0.02)  # a tight loop, but leaves the two-core CI machine to the fleet

        thread = threading.Thread(target=rogues, daemon=True)
        thread.start()
        try:
            time.sleep(1.0)  # the first attempts are in before the load starts
            statuses = []
            for _ in range(REQUESTS):
                statuses.append(complete(info["router_url"]))
                time.sleep(0.1)
            time.sleep(1.0)  # a few control-plane ticks for anything that got in to be published
        finally:
            stop.set()
            thread.join(30)
            watch.terminate()
            watch.wait(10)
            watch_out.close()
        table = subprocess.run([etcdctl(), f"--endpoints={info['etcd']}", "get", f"/tidegate/v1/tables/{MODEL}",
                                "--print-value-only"], capture_output=True, text=True, timeout=10, check=True)

    codes = Counter(code.name for _, code, _ in outcomes)
    print(f"\nrogue telemetry: {len(outcomes)} registration attempts ({dict(codes)}), "
          f"{sum(a for *_, a in outcomes)} acks; {statuses.count(200)}/{REQUESTS} user requests OK; "
          f"{rogue.hits[0]} reached the rogue endpoint")
    assert statuses == [200] * REQUESTS
    assert rogue.hits[0] == 0
    assert len(outcomes) >= len(attempts)
    assert all(code in REFUSED and acks == 0 for _, code, acks in outcomes), outcomes
    by_attempt = {what: code for what, code, _ in outcomes}
    assert by_attempt["no-token as replica-99"] == grpc.StatusCode.UNAUTHENTICATED
    assert by_attempt["replica-1's token as replica-0"] == grpc.StatusCode.PERMISSION_DENIED
    # Some records are binary protobuf (routers' load records): the search is for ASCII text,
    # which survives a lossy decode of everything else.
    watched = (tmp_path / "watch.txt").read_bytes().decode("utf-8", "replace")
    assert "/tidegate/v1/" in watched  # the watch saw the fleet's own writes...
    assert rogue.url not in watched and "replica-99" not in watched  # ...and never the rogue's
    entries = {r["replicaId"]: r["endpoint"] for r in json.loads(table.stdout)["replicas"]}
    assert entries == {r["id"]: r["engine_url"] for r in info["replicas"]}
