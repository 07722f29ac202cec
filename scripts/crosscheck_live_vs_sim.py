"""Live vs virtual cross-check: one workload through real processes and through the simulator.

    python scripts/crosscheck_live_vs_sim.py [--requests 300] [--rate 6] [--replicas 2]
                                             [--profile llama3-8b-h100] [--seed 7] [--out DIR]

Writes a seeded Poisson workload (Mooncake JSONL format, lognormal lengths), then runs
  1. `tidegate demo --trace W --rate-scale 1` : etcd, control plane, simulated replicas with
     agents and a router as real processes, requests over real HTTP, and
  2. `tidegate simulate --trace W --rate-scale 1 --policy tidegate` : the same fleet on a
     virtual clock,
and prints TTFT and TPOT P50/P95/P99 side by side. Exit status 1 when any of them differs by
more than --tolerance (default 15 %).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import tempfile
from pathlib import Path


def workload(path: Path, n: int, rate: float, seed: int, prompt_mean: float, output_mean: float) -> float:
    rng = random.Random(seed)
    t = 0.0
    sigma = 0.6
    with open(path, "w") as f:
        for _ in range(n):
            t += rng.expovariate(rate)
            p = max(16, min(8000, int(rng.lognormvariate(math.log(prompt_mean) - sigma**2 / 2, sigma))))
            o = max(2, min(1000, int(rng.lognormvariate(math.log(output_mean) - sigma**2 / 2, sigma))))
            f.write(json.dumps({"timestamp": int(t * 1000), "input_length": p, "output_length": o,
                                "hash_ids": []}) + "\n")
    return t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--rate", type=float, default=6.0)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--profile", default="llama3-8b-h100")
    ap.add_argument("--prompt-mean", type=float, default=1500)
    ap.add_argument("--output-mean", type=float, default=120)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="tidegate-crosscheck-"))
    out.mkdir(parents=True, exist_ok=True)
    wl = out / "workload.jsonl"
    span = workload(wl, args.requests, args.rate, args.seed, args.prompt_mean, args.output_mean)
    tg = [sys.executable, "-m", "tidegate.cli.main"]
    common = ["--trace", str(wl), "--rate-scale", "1", "--replicas", str(args.replicas),
              "--profile", args.profile, "--log-level", "warning"]
    # The demo exits 1 when a request failed; its JSON report says which, and is checked below.
    subprocess.run([*tg, "demo", *common, "--duration", f"{span:.3f}", "--json", str(out / "live.json")])
    subprocess.run([*tg, "simulate", *common, "--policy", "tidegate", "--seed", str(args.seed),
                    "--json", str(out / "sim.json")], check=True, stdout=subprocess.DEVNULL)
    live = json.loads((out / "live.json").read_text())
    sim = json.loads((out / "sim.json").read_text())["runs"][0]
    print(f"\n{args.requests} requests at {args.rate} req/s on {args.replicas} x {args.profile} "
          f"(seed {args.seed}); files in {out}")
    print(f"{'metric':<10} {'live':>9} {'virtual':>9} {'diff':>7}")
    worst = 0.0
    for metric in ("ttft_ms", "tpot_ms"):
        for q in ("p50", "p95", "p99"):
            a, b = live[metric][q], sim[metric][q]
            diff = (a - b) / b if b else float("inf")
            worst = max(worst, abs(diff))
            print(f"{metric[:4] + ' ' + q:<10} {a:>9.1f} {b:>9.1f} {diff * 100:>+6.1f}%")
    print(f"live: sent {live['sent']} completed {live['completed']} failed {live['failed']} {live['errors']}; "
          f"worst difference {worst * 100:.1f}% (tolerance {args.tolerance * 100:.0f}%)")
    return 0 if worst <= args.tolerance and live["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
