"""A whole local fleet under steady load for the control-plane chaos tests.

The fleet is `tidegate up`'s own `Fleet` (etcd given by the test, control planes, simulated
replicas with agents, a router, with the credentials `up` makes). Around it:

- `SteadyLoad`: a few client threads sending short completions through the router, recording
  for each request when it was dispatched, its status and which replica served it;
- `TableLog`: every routing-table write, seen through a `WatchCache` in a thread of its own, so
  writes made while etcd was paused are seen when it resumes (the watch resumes from the last
  revision: nothing is lost) and the test can check the whole history, not a few samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidegate import codec, keys
from tidegate.fleet.procs import Child
from tidegate.fleet.up import Fleet, UpConfig
from tidegate.store.api import KeyValue
from tidegate.store.etcd import EtcdStore
from tidegate.store.watchcache import WatchCache
from tidegate.v1 import records_pb2

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from polling import wait_until  # type: ignore[import-not-found]  # noqa: E402

__all__ = ["MODEL", "Fleet", "Outcome", "SteadyLoad", "TableLog", "fleet", "child", "wait_until", "routable"]

MODEL = "sim-model"
REPLICA_HEADER = "X-Tidegate-Replica"


@contextlib.contextmanager
def fleet(etcd_endpoint: str, run_dir: Path, *, replicas: int = 3, controlplanes: int = 2) -> Iterator[
        tuple[Fleet, dict[str, Any]]]:
    cfg = UpConfig(replicas=replicas, controlplanes=controlplanes, model=MODEL, profile="instant",
                   etcd=(etcd_endpoint,), run_dir=run_dir, report_interval_s=0.5, ready_timeout_s=90,
                   log_level="info")
    fl = Fleet(cfg)
    try:
        yield fl, fl.start()
    finally:
        fl.stop()


def child(fl: Fleet, name: str) -> Child:
    return next(c for c in fl.children if c.name == name)


def routable(table: records_pb2.RoutingTable) -> set[str]:
    return {r.replica_id for r in table.replicas if r.weight > 0}


@dataclass(frozen=True)
class Outcome:
    dispatched_at: float     # monotonic
    status: int              # 0 when no HTTP answer
    replica: str
    detail: str


class SteadyLoad:
    """`workers` threads, each sending one short completion every `pause_s` plus its latency."""

    def __init__(self, router_url: str, workers: int = 2, pause_s: float = 0.1) -> None:
        self._url = router_url + "/v1/completions"
        self._workers = workers
        self._pause_s = pause_s
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.outcomes: list[Outcome] = []

    def _one(self) -> Outcome:
        body = json.dumps({"model": MODEL, "prompt": "hello there", "max_tokens": 4}).encode()
        req = urllib.request.Request(self._url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                resp.read()
                return Outcome(t0, resp.status, resp.headers.get(REPLICA_HEADER, ""), "")
        except urllib.error.HTTPError as e:
            return Outcome(t0, e.code, e.headers.get(REPLICA_HEADER, "") or "", e.read()[:300].decode(errors="replace"))
        except (urllib.error.URLError, OSError) as e:
            return Outcome(t0, 0, "", repr(e))

    def _run(self) -> None:
        while not self._stop.is_set():
            out = self._one()
            with self._lock:
                self.outcomes.append(out)
            self._stop.wait(self._pause_s)

    def __enter__(self) -> SteadyLoad:
        for i in range(self._workers):
            t = threading.Thread(target=self._run, name=f"load-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(35)

    def snapshot(self) -> list[Outcome]:
        with self._lock:
            return list(self.outcomes)

    def failures(self) -> list[Outcome]:
        return [o for o in self.snapshot() if o.status != 200]


@dataclass(frozen=True)
class TableWrite:
    seen_at: float           # monotonic, when the watch delivered it
    mod_revision: int
    table: records_pb2.RoutingTable


class TableLog:
    """Every write of `pool`'s routing table from the moment it starts."""

    def __init__(self, etcd_endpoint: str, pool: str = MODEL) -> None:
        self._endpoint = etcd_endpoint
        self._key = keys.table(pool)
        self._lock = threading.Lock()
        self.writes: list[TableWrite] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="table-log", daemon=True)

    def _on_change(self, key: str, kv: KeyValue | None) -> None:
        if key != self._key or kv is None:
            return
        table = codec.decode(kv.value, records_pb2.RoutingTable)
        with self._lock:
            self.writes.append(TableWrite(time.monotonic(), kv.mod_revision, table))

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        store = EtcdStore([self._endpoint], timeout_s=1.0)
        await store.connect()
        cache = WatchCache(store, keys.TABLES, on_change=self._on_change, backoff_max_s=0.5)
        task = asyncio.create_task(cache.run())
        await cache.synced.wait()
        self._ready.set()
        await self._stopped.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await store.close()

    def __enter__(self) -> TableLog:
        self._thread.start()
        assert self._ready.wait(15), "the table watch did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(10)

    def since(self, t: float) -> list[TableWrite]:
        with self._lock:
            return [w for w in self.writes if w.seen_at >= t]

    def all(self) -> list[TableWrite]:
        with self._lock:
            return list(self.writes)
