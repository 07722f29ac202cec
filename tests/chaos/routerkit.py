"""Real processes for the router chaos tests: `tidegate router` and `tidegate sim` subprocesses
on ephemeral loopback ports, routing tables written straight to etcd (no control plane), and
readings of a process's memory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

from tidegate import codec, keys
from tidegate.store.etcd import EtcdStore
from tidegate.v1.records_pb2 import RouteEntry, RoutingTable

TIDEGATE = Path(sys.executable).with_name("tidegate")
READY = 2  # ReplicaState READY


class Proc:
    """A tidegate subcommand that prints {"event": "listening", "port": N} on stdout."""

    def __init__(self, log_path: Path, *args: str) -> None:
        self.log_path = log_path
        self._log: IO[bytes] = open(log_path, "wb")  # noqa: SIM115  (closed in stop)
        self.proc = subprocess.Popen([str(TIDEGATE), *args, "--port", "0", "--log-json"],
                                     stdout=subprocess.PIPE, stderr=self._log, start_new_session=True)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            self.stop()
            raise AssertionError(f"{args[0]} exited: " + log_path.read_text()[-2000:])
        event = json.loads(line)
        assert event["event"] == "listening"
        self.port = int(event["port"])
        self.url = f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)

    def stop(self) -> int | None:
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                return self.proc.wait(5)
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self._log.close()


def start_router(tmp: Path, etcd: str, *extra: str, name: str = "router") -> Proc:
    return Proc(tmp / f"{name}.log", "router", "--etcd", etcd, "--seed", "1", "--shutdown-grace-s", "1", *extra)


def start_sim(tmp: Path, name: str, model: str, *extra: str) -> Proc:
    return Proc(tmp / f"{name}.log", "sim", "--model", model, "--profile", "tiny-h100", "--log-level", "warning",
                *extra)


async def put_table(etcd: str, pool: str, replicas: list[tuple[str, str]], generation: int = 1) -> None:
    """Writes a pool's routing table as the control plane would: every replica READY, weight 1."""
    t = RoutingTable(pool=pool, generation=generation, schema_version=1)
    t.computed_at.GetCurrentTime()
    for rid, url in replicas:
        t.replicas.append(RouteEntry(replica_id=rid, endpoint=url, weight=1.0, state=READY))
    store = EtcdStore([etcd])
    await store.connect()
    try:
        await store.put(keys.table(pool), codec.encode(t))
    finally:
        await store.close()


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))
