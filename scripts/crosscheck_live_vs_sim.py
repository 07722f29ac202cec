"""Live vs virtual cross-check: one workload through real processes and through the simulator.

    python scripts/crosscheck_live_vs_sim.py [--requests 300] [--rate 6] [--replicas 2]
        [--profile llama3-8b-h100] [--prompt-mean 1500] [--output-mean 120] [--seed 7] [--out DIR]

1. Writes a seeded Poisson workload (Mooncake JSONL format, lognormal lengths).
2. Starts a live fleet (`tidegate.fleet.up.Fleet`: etcd, control plane, simulated replicas with
   agents, a router, all real processes) and measures its transport floor: the median TTFT of
   sequential one-token requests through the router, minus the engine model's step time for
   them, halved (one hop each way).
3. Replays the workload through the router over real HTTP (`tidegate.fleet.loadgen`).
4. Runs `tidegate simulate` on the same workload and fleet with `--hop-ms` set to the measured
   floor, and prints TTFT and TPOT P50/P95/P99 side by side.
Exit status 1 when any of them differs by more than --tolerance (default 15 %) or a live
request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from tidegate.fleet import loadgen, report, traces
from tidegate.fleet.up import Fleet, UpConfig
from tidegate.simulator.profiles import get_profile

MODEL = "crosscheck-model"


def write_workload(path: Path, n: int, rate: float, seed: int, prompt_mean: float, output_mean: float) -> None:
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


async def transport_floor_ms(router: str, profile_name: str, samples: int = 30) -> float:
    """One hop's share of the live system's fixed per-request latency."""
    step_ms = get_profile(profile_name).cost.step_ms(1, 1)
    ttfts = []
    async with aiohttp.ClientSession() as s:
        for _ in range(samples):
            t0 = time.perf_counter()
            async with s.post(router + "/v1/completions", json={
                    "model": MODEL, "prompt": loadgen.make_prompt(1), "max_tokens": 2, "stream": True}) as r:
                async for line in r.content:
                    if line.startswith(b"data: {"):
                        ttfts.append((time.perf_counter() - t0) * 1000)
                        break
                await r.read()
    return max(0.0, (statistics.median(ttfts) - step_ms) / 2)


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
    write_workload(wl, args.requests, args.rate, args.seed, args.prompt_mean, args.output_mean)
    trace = traces.load(wl)

    fleet = Fleet(UpConfig(replicas=args.replicas, model=MODEL, profile=args.profile, log_level="warning",
                           run_dir=out / "run"))
    try:
        info = fleet.start()
        hop_ms = asyncio.run(transport_floor_ms(info["router_url"], args.profile))
        time.sleep(1.0)  # let the agents' latency windows forget the probes' load
        results, sent = asyncio.run(loadgen.replay(info["router_url"], MODEL, trace, time_scale=1.0,
                                                   duration_s=trace[-1].arrival_s + 1e-6))
    finally:
        fleet.stop()
    live = report.build(results, sent=sent, duration_s=1.0, slo_ttft_ms=2000, slo_tpot_ms=100, replicas=[],
                        rate_rps=args.rate, rate_basis="cross-check")

    subprocess.run([sys.executable, "-m", "tidegate.cli.main", "simulate", "--trace", str(wl), "--rate-scale", "1",
                    "--replicas", str(args.replicas), "--profile", args.profile, "--policy", "tidegate",
                    "--seed", str(args.seed), "--hop-ms", f"{hop_ms:.3f}", "--log-level", "warning",
                    "--json", str(out / "sim.json")], check=True, stdout=subprocess.DEVNULL)
    sim = json.loads((out / "sim.json").read_text())["runs"][0]
    (out / "live.json").write_text(json.dumps(live, indent=2) + "\n")

    print(f"{args.requests} requests at {args.rate} req/s on {args.replicas} x {args.profile}, prompt mean "
          f"{args.prompt_mean:g}, output mean {args.output_mean:g} (seed {args.seed}); files in {out}")
    print(f"measured transport floor: {hop_ms:.2f} ms each way (simulated with --hop-ms)")
    print(f"{'metric':<10} {'live':>9} {'virtual':>9} {'diff':>7}")
    worst = 0.0
    for metric in ("ttft_ms", "tpot_ms"):
        for q in ("p50", "p95", "p99"):
            a, b = live[metric][q], sim[metric][q]
            diff = (a - b) / b if b else float("inf")
            worst = max(worst, abs(diff))
            print(f"{metric[:4] + ' ' + q:<10} {a:>9.1f} {b:>9.1f} {diff * 100:>+6.1f}%")
    print(f"live: sent {live['sent']} completed {live['completed']} failed {live['failed']} {live['errors'] or ''}; "
          f"worst difference {worst * 100:.1f}% (tolerance {args.tolerance * 100:.0f}%)")
    return 0 if worst <= args.tolerance and live["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
