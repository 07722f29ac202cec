"""What the rate fit learns from a live engine under two traffic shapes.

A `tidegate up` fleet of one simulated replica (real processes on 127.0.0.1: etcd, control plane,
engine, agent, router) serves distinct prompts through the router for `--duration` seconds in one
of two shapes:

- `waves`: rounds of `--clients` prompts sent at once, the next round once all have finished
  (what tests/e2e/livefleet.py's warm-up did, and what a batch job sending waves does);
- `steady`: `--clients` closed-loop clients, each sending its next prompt when its last one ends,
  started at random offsets, so prompts arrive while others decode.

This script scrapes the engine's /metrics every `--interval` seconds itself and runs the windows
through the agent's path (tidegate.engine_metrics.parse_metrics, agent.rates.work_deltas) into a
RateEstimator, as the control plane does with the agent's reports. It prints, per window, the
regressors (decoding sequences and uncached prompt tokens per step) and the mean inter-token time
next to the profile's cost model (linearised at a 1k context), then the fit.

Why the shapes differ: the fit reads step times from the inter-token latency, which only decoding
sequences observe. A prefill that runs on an engine with nothing decoding (every prompt of a wave)
slows no token, so the windows that count those prompts show no slower steps, and the fit takes
prefill for free (docs/BENCHMARKS.md, "A blind spot of the rate fit").

    .venv/bin/python scripts/probe_live_rates.py --pattern waves [--duration 40] [--clients 8]
    .venv/bin/python scripts/probe_live_rates.py --pattern steady
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from tidegate.agent.rates import work_deltas
from tidegate.engine_metrics import parse_metrics
from tidegate.etcd_server import EmbeddedEtcd
from tidegate.fleet.loadgen import make_prompt
from tidegate.fleet.up import Fleet, UpConfig
from tidegate.policy.rates import RateEstimator, WorkWindow, regressors
from tidegate.simulator.profiles import get_profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure_rate_estimator import profile_prior  # noqa: E402

MODEL = "probe-model"


def complete(url: str, text: str, max_tokens: int) -> None:
    req = urllib.request.Request(url + "/v1/completions", method="POST", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"model": MODEL, "prompt": text, "max_tokens": max_tokens}).encode())
    with urllib.request.urlopen(req, timeout=60) as resp:
        resp.read()


def traffic(pattern: str, url: str, clients: int, stop: threading.Event) -> None:
    if pattern == "waves":
        salt = itertools.count()
        while not stop.is_set():
            round_ = [threading.Thread(target=complete, args=(url, make_prompt(1300, next(salt)), 48))
                      for _ in range(clients)]
            for t in round_:
                t.start()
            for t in round_:
                t.join()
        return

    salt = itertools.count()

    def client(i: int) -> None:
        rng = random.Random(i)
        time.sleep(rng.random())
        while not stop.is_set():
            complete(url, make_prompt(rng.randint(650, 2600), 1_000_000 * (i + 1) + next(salt)), rng.randint(16, 96))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pattern", choices=("waves", "steady"), default="waves")
    ap.add_argument("--duration", type=float, default=40.0, help="seconds of traffic")
    ap.add_argument("--clients", type=int, default=8, help="prompts per wave, or closed-loop clients")
    ap.add_argument("--interval", type=float, default=0.5, help="scrape interval (one window), seconds")
    ap.add_argument("--profile", default="llama3-8b-h100")
    ap.add_argument("--every", type=int, default=3, help="print every Nth window")
    args = ap.parse_args()

    scrapes: list[tuple[float, str]] = []
    with EmbeddedEtcd() as etcd, tempfile.TemporaryDirectory() as d:
        cfg = UpConfig(replicas=1, model=MODEL, profile=args.profile, etcd=(etcd.endpoint,), run_dir=Path(d),
                       report_interval_s=args.interval, ready_timeout_s=60)
        with Fleet(cfg) as fleet:
            info = fleet.start()
            engine = info["replicas"][0]["engine_url"]
            stop = threading.Event()
            load = threading.Thread(target=traffic, args=(args.pattern, info["router_url"], args.clients, stop))
            load.start()
            end = time.monotonic() + args.duration
            while time.monotonic() < end:
                t = time.monotonic()
                with urllib.request.urlopen(engine + "/metrics", timeout=10) as resp:
                    scrapes.append((t, resp.read().decode()))
                time.sleep(max(0.0, args.interval - (time.monotonic() - t)))
            stop.set()
            load.join()

    truth = profile_prior(get_profile(args.profile))
    est = RateEstimator()
    print(f"pattern {args.pattern}, {args.clients} clients, {len(scrapes) - 1} windows of {args.interval} s")
    print("| window | steps | decoding per step | uncached prompt tokens per step | mean ITL ms "
          "| cost model ms | fit: prefill tok/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    prev_t, prev = scrapes[0][0], parse_metrics(scrapes[0][1])
    for i, (t, text) in enumerate(scrapes[1:]):
        cur = parse_metrics(text)
        w = WorkWindow(**work_deltas(prev, cur, t - prev_t))
        est.observe(w)
        o = regressors(w)
        if o is not None and i % args.every == 0:
            print(f"| {i} | {w.steps:.0f} | {o.batch:.2f} | {o.prefill:.0f} | {o.step_ms:.2f} "
                  f"| {truth.step_ms(o.batch, o.prefill):.2f} | {est.published.prefill_tokens_per_s:,.0f} |")
        prev_t, prev = t, cur
    fit = est.published
    print(f"\nfit:        prefill {fit.prefill_tokens_per_s:,.0f} tokens/s, base {fit.decode_step_base_ms:.2f} ms, "
          f"per sequence {fit.decode_step_per_seq_ms:.4f} ms (relative SE of the prefill rate "
          f"{est.prefill_rel_se():.2f})")
    print(f"cost model: prefill {truth.prefill_tokens_per_s:,.0f} tokens/s, base {truth.decode_step_base_ms:.2f} ms, "
          f"per sequence {truth.decode_step_per_seq_ms:.4f} ms (profile {args.profile}, 1k context)")


if __name__ == "__main__":
    main()
