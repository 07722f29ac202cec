"""Live vs virtual cross-check: one workload through real processes and through the simulator.

    python scripts/crosscheck_live_vs_sim.py [--requests 300] [--rate 6] [--replicas 2]
        [--profile llama3-8b-h100] [--prompt-mean 1500] [--output-mean 120] [--seed 7] [--out DIR]
        [--shared-prefix GROUPS [--prefix-tokens 1024]]

1. Writes a seeded Poisson workload (Mooncake JSONL format, lognormal lengths). With
   --shared-prefix, each request belongs to one of GROUPS prefix groups (uniformly at random) and
   its prompt is the group's --prefix-tokens shared tokens followed by its own suffix of about
   --prompt-mean tokens; the total stays within the router's 4,096 hashed tokens, so the router
   and the engines see the same blocks.
2. Starts a live fleet (`tidegate.fleet.up.Fleet`: etcd, control plane, simulated replicas with
   agents, a router, all real processes) and measures its transport floor: the median TTFT of
   sequential requests through the router with unique prompts of the workload's median length,
   minus the engine model's TTFT for them, halved (one hop each way); measured before and after
   the replay, and the mean taken. (It grows with the prompt's size; the floor of one-token
   requests, used before, is printed beside it.)
3. Replays the workload through the router over real HTTP (`tidegate.fleet.loadgen`): each
   prompt is text in which a group's shared part is byte-identical (loadgen.make_prompt), so the
   live engines' prefix caches hit on the text they receive.
4. Runs `tidegate simulate` on the same workload and fleet with `--hop-ms` set to the measured
   floor and the live replicas' ids (prefix affinity's rendezvous homes hash them), and prints
   TTFT and TPOT P50/P95/P99 side by side. The virtual run's prefix hashes are the block ids
   the live engines compute from those very texts (a generic trace, 64 tokens per id:
   tidegate.tokens.PREFIX_BLOCK_TOKENS), so its engines hit the same blocks. The prefix hit
   rate is printed for both: live from the engines' vllm:prefix_cache_queries/hits counters
   over the replay, virtual from the results' prefix_hit_rate.
Exit status 1 when any of them differs by more than --tolerance (default 15 %) or a live
request failed; 2 when an engine's /metrics could not be read (10 s per read), with the engine named.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from tidegate.fleet import loadgen, report, traces
from tidegate.fleet.crosscheck import PROBE_SALT_BASE, CountersError, prefix_counters, virtual_trace, write_workload
from tidegate.fleet.up import Fleet, UpConfig
from tidegate.simulator.engine import Engine
from tidegate.simulator.profiles import get_profile

MODEL = "crosscheck-model"


def model_ttft_ms(profile_name: str, prompt_tokens: int) -> float:
    """The engine model's TTFT for one request alone on an idle replica."""
    engine = Engine(get_profile(profile_name), random.Random(0))
    engine.add_request("probe", prompt_tokens, 2, 0.0)
    engine.advance(3600.0)
    result = engine.request_result("probe")
    assert result is not None and result.ttft_s is not None
    return result.ttft_s * 1000


async def transport_floor_ms(router: str, profile_name: str, prompt_tokens: int = 1, samples: int = 30,
                             salt_base: int = PROBE_SALT_BASE) -> float:
    """One hop's share of the live system's fixed per-request latency: sequential requests of
    `prompt_tokens` tokens, their median TTFT minus the engine model's, halved. The cost grows with
    the prompt (the body is encoded, sent, parsed and hashed by the router and by the engine), so it
    is measured with prompts of the workload's size; each prompt is unique, so nothing is cached."""
    ttfts = []
    async with aiohttp.ClientSession() as s:
        for i in range(samples):
            t0 = time.perf_counter()
            async with s.post(router + "/v1/completions", json={
                    "model": MODEL, "prompt": loadgen.make_prompt(prompt_tokens, salt_base - i),
                    "max_tokens": 2, "stream": True}) as r:
                async for line in r.content:
                    if line.startswith(b"data: {"):
                        ttfts.append((time.perf_counter() - t0) * 1000)
                        break
                await r.read()
    return max(0.0, (statistics.median(ttfts) - model_ttft_ms(profile_name, prompt_tokens)) / 2)


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
    ap.add_argument("--shared-prefix", type=int, default=0, metavar="GROUPS",
                    help="prefix groups whose requests share --prefix-tokens leading tokens (0: none)")
    ap.add_argument("--prefix-tokens", type=int, default=1024,
                    help=f"shared tokens per group, a multiple of {loadgen.TRACE_HASH_BLOCK_TOKENS}")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="tidegate-crosscheck-"))
    out.mkdir(parents=True, exist_ok=True)
    wl = out / "workload.jsonl"
    if args.shared_prefix < 0:
        ap.error("--shared-prefix must be >= 0")
    try:
        write_workload(wl, args.requests, args.rate, args.seed, args.prompt_mean, args.output_mean,
                       args.shared_prefix, args.prefix_tokens)
    except ValueError as exc:
        ap.error(str(exc))
    trace = traces.load(wl)
    floor_tokens = int(statistics.median(r.prompt_tokens for r in trace))
    virtual = out / "virtual.jsonl"
    virtual.write_text("".join(json.dumps(row) + "\n" for row in virtual_trace(trace)))

    fleet = Fleet(UpConfig(replicas=args.replicas, model=MODEL, profile=args.profile, log_level="warning",
                           run_dir=out / "run"))
    try:
        info = fleet.start()
        hop_1_ms = asyncio.run(transport_floor_ms(info["router_url"], args.profile))
        hop_before_ms = asyncio.run(transport_floor_ms(info["router_url"], args.profile, floor_tokens))
        time.sleep(1.0)  # let the agents' latency windows forget the probes' load
        engines = [r["engine_url"] for r in info["replicas"]]
        before = asyncio.run(prefix_counters(engines))
        results, sent = asyncio.run(loadgen.replay(info["router_url"], MODEL, trace, time_scale=1.0,
                                                   duration_s=trace[-1].arrival_s + 1e-6))
        after = asyncio.run(prefix_counters(engines))
        # Measured again after the replay: on a shared machine the CPU the processes get drifts, and
        # the mean of the two is the floor of the time the workload ran in.
        hop_after_ms = asyncio.run(transport_floor_ms(info["router_url"], args.profile, floor_tokens,
                                                      salt_base=PROBE_SALT_BASE - 1000))
        hop_ms = (hop_before_ms + hop_after_ms) / 2
    except CountersError as exc:
        print(f"crosscheck: cannot read the engines' prefix-cache counters: {exc}", file=sys.stderr)
        return 2
    finally:
        fleet.stop()
    live = report.build(results, sent=sent, duration_s=1.0, slo_ttft_ms=2000, slo_tpot_ms=100, replicas=[],
                        rate_rps=args.rate, rate_basis="cross-check")

    queries, hits = after[0] - before[0], after[1] - before[1]
    live["prefix_hit_rate"] = round(hits / queries, 4) if queries else 0.0
    subprocess.run([sys.executable, "-m", "tidegate.cli.main", "simulate", "--trace", str(virtual), "--rate-scale", "1",
                    "--replicas", str(args.replicas), "--profile", args.profile, "--policy", "tidegate",
                    "--seed", str(args.seed), "--hop-ms", f"{hop_ms:.3f}", "--log-level", "warning",
                    "--replica-ids", ",".join(r["id"] for r in info["replicas"]),
                    "--json", str(out / "sim.json")], check=True, stdout=subprocess.DEVNULL)
    sim = json.loads((out / "sim.json").read_text())["runs"][0]
    (out / "live.json").write_text(json.dumps(live, indent=2) + "\n")

    shared = (f", {args.shared_prefix} prefix groups of {args.prefix_tokens} tokens + suffix"
              if args.shared_prefix else "")
    print(f"{args.requests} requests at {args.rate} req/s on {args.replicas} x {args.profile}, prompt mean "
          f"{args.prompt_mean:g}{shared}, output mean {args.output_mean:g} (seed {args.seed}); files in {out}")
    print(f"measured transport floor: {hop_ms:.2f} ms each way with {floor_tokens}-token prompts (the median; "
          f"{hop_before_ms:.2f} before the replay, {hop_after_ms:.2f} after; simulated with --hop-ms), "
          f"{hop_1_ms:.2f} ms with 1-token prompts")
    print(f"prefix hit rate: live {live['prefix_hit_rate'] * 100:.1f}% (engines' counters: {hits:.0f} of "
          f"{queries:.0f} tokens), virtual {sim.get('prefix_hit_rate', 0.0) * 100:.1f}%")
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
