#!/usr/bin/env python
"""Measure how long after `tidegate cordon` returns the routers stop sending requests to the replica.

Starts a local fleet (embedded etcd, one control plane, N `instant` simulated replicas with agents,
one router), keeps a steady stream of requests flowing through the router (several client
threads; the router names the replica that served each request in the X-Tidegate-Replica
header), then repeatedly runs `tidegate cordon replica-0` through the real CLI entry point (a
subprocess, as an operator would) and measures, from the moment the command returns:

  last   the send time of the last request that replica-0 served
  clear  the send time of the first request after which no request went to replica-0
(negative: routing to replica-0 had already stopped when the command returned)

Between trials it uncordons replica-0 and waits until replica-0 serves again.
Prints each trial and P50/P95/max; `--json` prints the figures as one JSON object.

    .venv/bin/python scripts/measure_cordon_propagation.py --trials 10 --replicas 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from tidegate import logs
from tidegate.etcd_server import EmbeddedEtcd
from tidegate.fleet import endpoints
from tidegate.fleet.up import Fleet, UpConfig

MODEL = "sim-model"
VICTIM = "replica-0"


class Load:
    def __init__(self, router: str, threads: int) -> None:
        self.router = router
        self.lock = threading.Lock()
        self.samples: list[tuple[float, str]] = []  # (send time, replica)
        self.failed = 0
        self.failures: dict[str, int] = {}
        self.measuring = False  # failures before the first trial (the router still syncing) are counted apart
        self.warmup_failed = 0
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1}).encode()
        while not self.stop.is_set():
            req = urllib.request.Request(self.router + "/v1/completions", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
            sent = time.monotonic()
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    resp.read()
                    replica = resp.headers.get("X-Tidegate-Replica", "")
            except urllib.error.HTTPError as e:
                self._fail(f"HTTP {e.code}: {e.read()[:200]!r}")
                continue
            except (urllib.error.URLError, OSError) as e:
                self._fail(repr(e)[:200])
                continue
            with self.lock:
                self.samples.append((sent, replica))

    def _fail(self, why: str) -> None:
        with self.lock:
            if not self.measuring:
                self.warmup_failed += 1
                return
            self.failed += 1
            self.failures[why] = self.failures.get(why, 0) + 1

    def since(self, t: float) -> list[tuple[float, str]]:
        with self.lock:
            return sorted(s for s in self.samples if s[0] >= t)


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tidegate.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def wait_serving(load: Load, since: float, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r == VICTIM for _, r in load.since(since)):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{VICTIM} did not serve again within {timeout}s")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--threads", type=int, default=4, help="Client threads sending requests back to back.")
    ap.add_argument("--settle-s", type=float, default=3.0, help="Load kept after each cordon before measuring.")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    logs.configure("warning", False, process="measure")

    tmp = Path(tempfile.mkdtemp(prefix="tidegate-propagation-"))
    with EmbeddedEtcd() as etcd:
        cfg = UpConfig(replicas=a.replicas, model=MODEL, profile="instant", etcd=(etcd.endpoint,),
                       run_dir=tmp / "run", report_interval_s=0.5, log_level="warning")
        with Fleet(cfg) as fleet:
            info = fleet.start()
            endpoints.write(tmp / "endpoints.json", info)
            env = dict(os.environ, TIDEGATE_HOME=str(tmp))
            load = Load(info["router_url"], a.threads)
            for t in load.threads:
                t.start()
            try:
                wait_serving(load, time.monotonic())
                time.sleep(1.0)
                load.measuring = True
                lasts: list[float] = []
                clears: list[float] = []
                for trial in range(a.trials):
                    r = cli(env, "cordon", VICTIM, "--reason", "propagation measurement")
                    returned = time.monotonic()
                    if r.returncode != 0:
                        raise RuntimeError(f"cordon failed ({r.returncode}): {r.stderr}")
                    time.sleep(a.settle_s)
                    after = load.since(returned - 5.0)
                    victim_sends = [t for t, rep in after if rep == VICTIM]
                    if not victim_sends:
                        raise RuntimeError(f"{VICTIM} served nothing in the 5 s before the cordon")
                    last = max(victim_sends)
                    if any(rep == VICTIM for t, rep in after if t > returned + a.settle_s - 1.0):
                        raise RuntimeError("requests still reach the cordoned replica after the settle time")
                    later = [t for t, _ in after if t > last]
                    first_clear = later[0] if later else last
                    # Negative: routing had already stopped when the command returned.
                    lasts.append(last - returned)
                    clears.append(first_clear - returned)
                    n = len([s for s in after if s[0] >= returned])
                    if not a.json:
                        print(f"trial {trial + 1:2d}: last request to {VICTIM} {lasts[-1] * 1000:+6.0f} ms from "
                              f"the command's return; none from {clears[-1] * 1000:+6.0f} ms "
                              f"({n} requests in {a.settle_s:.0f}s)", flush=True)
                    r = cli(env, "uncordon", VICTIM)
                    if r.returncode != 0:
                        raise RuntimeError(f"uncordon failed ({r.returncode}): {r.stderr}")
                    wait_serving(load, time.monotonic())
                    time.sleep(0.5)
            finally:
                load.stop.set()
                for t in load.threads:
                    t.join(timeout=30)
    result = {
        "trials": a.trials, "replicas": a.replicas, "client_threads": a.threads, "failed_requests": load.failed,
        "warmup_failed_requests": load.warmup_failed,
        "failures": load.failures,
        "last_request_ms": {"p50": pct(lasts, 0.5) * 1000, "p95": pct(lasts, 0.95) * 1000,
                            "max": max(lasts) * 1000},
        "clear_ms": {"p50": pct(clears, 0.5) * 1000, "p95": pct(clears, 0.95) * 1000, "max": max(clears) * 1000},
        "mean_clear_ms": statistics.fmean(clears) * 1000,
    }
    if a.json:
        print(json.dumps(result, indent=2))
    else:
        for k, label in (("last_request_ms", "last request routed to it"), ("clear_ms", "no more requests")):
            f = result[k]
            print(f"{label:>27}: P50 {f['p50']:+.0f} ms  P95 {f['p95']:+.0f} ms  max {f['max']:+.0f} ms")
        print(f"failed requests during the trials: {load.failed} (before them, while the router synced: "
              f"{load.warmup_failed})")
        for why, n in sorted(load.failures.items(), key=lambda kv: -kv[1]):
            print(f"  {n:5d} x {why}")
    return 0 if load.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
