"""Benchmark of the engine simulator's virtual-time driver: Engine.advance, fast-forward vs step by step.

Workload: one replica (llama3-8b-h100 by default) replaying every 16th request of the Azure
conversation trace, with its arrival times scaled so that the offered load is `--load` times the
replica's estimated capacity (tidegate.fleet.capacity; `--load 0` keeps the trace's own times,
about an hour). Prints, for each driver, the steps simulated, CPU time and steps per CPU second,
then the largest TTFT / finish-time difference between the two (they must agree).

    .venv/bin/python scripts/bench_engine.py [--trace PATH] [--every 16] [--load 0.9] [--profile NAME]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from tidegate.fleet.capacity import estimate
from tidegate.fleet.traces import TraceRequest, load
from tidegate.simulator.engine import Engine, RequestResult
from tidegate.simulator.profiles import get_profile

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared/data/traces/AzureLLMInferenceTrace_conv.csv"


def workload(path: Path, every: int, load_frac: float, profile_name: str) -> list[TraceRequest]:
    trace = load(path)[::every]
    t0 = trace[0].arrival_s
    trace = [TraceRequest(r.arrival_s - t0, r.prompt_tokens, r.output_tokens, r.prefix_hashes) for r in trace]
    if load_frac > 0:
        span = trace[-1].arrival_s or 1.0
        rate = len(trace) / span
        target = load_frac * estimate(get_profile(profile_name), trace, 1).per_replica_rps
        scale = rate / target
        trace = [TraceRequest(r.arrival_s * scale, r.prompt_tokens, r.output_tokens, r.prefix_hashes) for r in trace]
    return trace


def replay(trace: list[TraceRequest], profile_name: str, fast: bool) -> tuple[dict[str, RequestResult], int, float]:
    profile = get_profile(profile_name)
    engine = Engine(profile)
    start = time.process_time()
    for i, r in enumerate(trace):
        engine.advance(r.arrival_s, fast=fast)
        prompt = min(r.prompt_tokens, profile.max_model_len - 1)
        out = max(1, min(r.output_tokens, profile.max_model_len - prompt))
        engine.add_request(f"r{i}", prompt, out, r.arrival_s, r.prefix_hashes)
    engine.advance(math.inf, fast=fast)
    cpu = time.process_time() - start
    results = {f"r{i}": engine.request_result(f"r{i}") for i in range(len(trace))}
    return results, engine.stats().steps_total, cpu  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--every", type=int, default=16, help="keep every Nth request (one replica's share)")
    ap.add_argument("--load", type=float, default=0.9, help="offered load / estimated capacity; 0 = trace times")
    ap.add_argument("--profile", default="llama3-8b-h100")
    args = ap.parse_args(argv)

    trace = workload(args.trace, args.every, args.load, args.profile)
    print(f"workload: {len(trace)} requests over {trace[-1].arrival_s:.0f} s of trace time, "
          f"profile {args.profile}, load {args.load or 'as recorded'}")
    runs = {}
    for name, fast in (("advance (fast-forward)", True), ("advance (step by step)", False)):
        results, steps, cpu = replay(trace, args.profile, fast)
        runs[name] = results
        last = max(r.finish_s for r in results.values() if r.finish_s is not None)
        print(f"{name:24s} steps {steps:>9,d}  cpu {cpu:7.3f} s  {steps / cpu:>12,.0f} steps/s  "
              f"engine time {last:8.1f} s")
    a, b = runs.values()
    d_ttft = max(abs((a[k].ttft_s or 0) - (b[k].ttft_s or 0)) for k in a)
    d_fin = max(abs((a[k].finish_s or 0) - (b[k].finish_s or 0)) for k in a)
    ttfts = sorted(r.ttft_s for r in a.values() if r.ttft_s is not None)
    print(f"max |diff| ttft {d_ttft:.2e} s, finish {d_fin:.2e} s; "
          f"TTFT p50 {ttfts[len(ttfts) // 2] * 1000:.0f} ms, p99 {ttfts[int(len(ttfts) * 0.99)] * 1000:.0f} ms; "
          f"preemptions {sum(r.preemptions for r in a.values())}")
    return 0 if d_ttft < 1e-6 and d_fin < 1e-6 else 1


if __name__ == "__main__":
    sys.exit(main())
