"""How well the control plane's rate estimator predicts the simulator's true step times.

One simulated replica replays a trace (arrivals scaled to `--loads` times the replica's estimated
capacity, tidegate.fleet.capacity). The engine runs step by step; every `--interval` seconds of
engine time its /metrics text (simulator.metrics, vLLM V1 names) goes through the agent's real
path (tidegate.engine_metrics.parse_metrics, agent.rates.work_deltas) into one EngineWork window, which
tidegate.policy.rates.RateEstimator folds in, starting from the generic prior (or the profile's
figures with `--seeded`). After `--warmup` seconds, the steps of each window are predicted with
the rates published at the window's start (out of sample) and compared with their true durations
from tidegate.simulator.cost:

    predicted step = decode_step_base_ms + decode_step_per_seq_ms * decodes + prefill_tokens / rate

Printed per profile and load: mean decode batch and busy share; median and P90 absolute error of
single steps (decode-only and mixed); the bias and the absolute error of the mean decoding step
per window (what a TPOT prediction needs: the ITL a token sees); and the published rates.

The last column is what the same estimator publishes for the prefill rate when each window's
uncached prompt tokens are the ones the engine really computed in it (the simulator knows them)
instead of the counters' figure. Engines count a prompt when its prefill completes and its cache
hits when it starts (vLLM's prompt_tokens_total and prefix_cache_hits), so a prompt whose prefill
straddles a window's edge is counted in the wrong window; that noise in the regressor flattens the
fitted slope (errors in variables), which reads as a faster prefill. The gap between the two
columns is that bias alone: no real engine exports the lag-free count, so it is a measure, not
an input.

    .venv/bin/python scripts/measure_rate_estimator.py [--profiles llama3-8b-h100,llama3-70b-tp4-h100]
        [--loads 0.05,0.2,0.5,1.0,1.5] [--duration 240] [--trace PATH] [--every 4] [--seeded]
        [--flavor vllm|vllm-v0|sglang]
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from pathlib import Path

from tidegate.agent.rates import work_deltas
from tidegate.engine_metrics import parse_metrics
from tidegate.fleet.capacity import estimate
from tidegate.fleet.traces import TraceRequest, load
from tidegate.policy.rates import EngineRates, RateEstimator, WorkWindow
from tidegate.simulator.engine import Engine
from tidegate.simulator.metrics import SimMetrics
from tidegate.simulator.profiles import Profile, get_profile

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared/data/traces/AzureLLMInferenceTrace_conv.csv"


def profile_prior(profile: Profile, context: int = 1024) -> EngineRates:
    """A profile's figures in the estimator's form: its cost model linearised around `context`."""
    c = profile.cost
    base = c.step_ms(1, context) - c.attn_ms_per_1k_ctx * context / 1000.0
    per_seq = (c.decode_step_ms(64, context) - c.decode_step_ms(1, context)) / 63.0
    return EngineRates(prefill_tokens_per_s=1000.0 / max(1e-6, c.linear_ms_per_token_beyond),
                       decode_step_base_ms=base, decode_step_per_seq_ms=per_seq)


def workload(path: Path, every: int, load_frac: float, profile: Profile, duration_s: float) -> list[TraceRequest]:
    trace = load(path)[::every]
    t0 = trace[0].arrival_s
    trace = [TraceRequest(r.arrival_s - t0, r.prompt_tokens, r.output_tokens, r.prefix_hashes) for r in trace]
    span = trace[-1].arrival_s or 1.0
    target = load_frac * estimate(profile, trace, 1).per_replica_rps
    scale = (len(trace) / span) / target
    out = [TraceRequest(r.arrival_s * scale, r.prompt_tokens, min(r.output_tokens, 2048), r.prefix_hashes)
           for r in trace]
    return [r for r in out if r.arrival_s < duration_s and r.prompt_tokens + r.output_tokens <= profile.max_model_len]


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run(profile: Profile, reqs: list[TraceRequest], interval_s: float, warmup_s: float, duration_s: float,
        seeded: bool, flavor: str = "vllm") -> dict[str, float]:
    engine = Engine(profile, keep_results=False)
    metrics = SimMetrics(engine, profile.model, flavor)
    est = RateEstimator(prior=profile_prior(profile) if seeded else None)
    # The same fit fed the prefill tokens the engine really computed in each window (see the docstring).
    lag_free = RateEstimator(prior=profile_prior(profile) if seeded else None)
    computed = 0  # uncached prompt tokens prefilled in the current window
    prev = parse_metrics(metrics.render().decode())
    t, i, next_tick = 0.0, 0, interval_s
    rates = est.published
    decode_err: list[float] = []
    mixed_err: list[float] = []
    win_err: list[float] = []
    win_bias: list[float] = []
    batches: list[float] = []
    busy = 0.0
    pred_sum = true_sum = 0.0  # decode-token-weighted, within the current window

    def close_window(now: float) -> None:
        nonlocal prev, rates, pred_sum, true_sum, computed
        cur = parse_metrics(metrics.render().decode())
        window = WorkWindow(**work_deltas(prev, cur, interval_s))
        est.observe(window)
        lag_free.observe(replace(window, prompt_tokens=window.cached_prompt_tokens + computed))
        computed = 0
        prev = cur
        if true_sum > 0 and rates.complete and now > warmup_s:
            win_err.append(abs(pred_sum - true_sum) / true_sum)
            win_bias.append((pred_sum - true_sum) / true_sum)
        pred_sum = true_sum = 0.0
        rates = est.published

    while t < duration_s:
        while i < len(reqs) and reqs[i].arrival_s <= t:
            r = reqs[i]
            engine.add_request(f"r{i}", r.prompt_tokens, r.output_tokens, r.arrival_s)
            i += 1
        if not engine.has_work():
            nxt = reqs[i].arrival_s if i < len(reqs) else duration_s
            while next_tick <= nxt and next_tick <= duration_s:
                close_window(next_tick)
                next_tick += interval_s
            t = nxt
            continue
        res = engine.step(t)
        for o in res.outputs:
            if o.itl_s is not None:
                metrics.observe_inter_token(o.itl_s)
            if o.finished:
                metrics.observe_finished(o.e2e_s or 0.0, prefill_s=o.prefill_s)
        computed += res.num_prefill_tokens
        true_ms = res.duration_s * 1000.0
        busy += res.duration_s
        decodes = res.num_decode_tokens
        if rates.complete and t > warmup_s and true_ms > 0:
            pred = rates.step_ms(decodes, res.num_prefill_tokens)
            err = abs(pred - true_ms) / true_ms
            (mixed_err if res.num_prefill_tokens else decode_err).append(err)
            if decodes:
                batches.append(decodes)
                pred_sum += pred * decodes
                true_sum += true_ms * decodes
        t = res.end_s
        while next_tick <= t:
            close_window(next_tick)
            next_tick += interval_s
    pub = est.published
    return {
        "batch": statistics.fmean(batches) if batches else 0.0,
        "busy": busy / duration_s,
        "decode_p50": _pct(decode_err, 0.5), "decode_p90": _pct(decode_err, 0.9),
        "mixed_p50": _pct(mixed_err, 0.5), "mixed_p90": _pct(mixed_err, 0.9),
        "win_p50": _pct(win_err, 0.5), "win_p90": _pct(win_err, 0.9),
        "win_bias": statistics.fmean(win_bias) if win_bias else float("nan"),
        "window_s": est.window_s,
        "base": pub.decode_step_base_ms, "per_seq": pub.decode_step_per_seq_ms, "prefill": pub.prefill_tokens_per_s,
        "prefill_lag_free": lag_free.published.prefill_tokens_per_s,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", default="llama3-8b-h100,llama3-70b-tp4-h100", help="comma-separated profiles")
    ap.add_argument("--loads", default="0.05,0.2,0.5,1.0,1.5", help="offered loads, fractions of estimated capacity")
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="trace file (Azure CSV or Mooncake JSONL)")
    ap.add_argument("--every", type=int, default=4, help="keep every Nth request of the trace")
    ap.add_argument("--duration", type=float, default=240.0, help="engine seconds simulated per run")
    ap.add_argument("--warmup", type=float, default=30.0, help="seconds before predictions are scored")
    ap.add_argument("--interval", type=float, default=1.0, help="report interval (one window), seconds")
    ap.add_argument("--seeded", action="store_true", help="seed the prior with the profile's figures")
    ap.add_argument("--flavor", default="vllm", choices=("vllm", "vllm-v0", "sglang"),
                    help="metric names the engine exports (sglang: no step count, busy time instead)")
    args = ap.parse_args(argv)
    print(f"trace {args.trace.name} every {args.every}, {args.duration:g} s per run, warm-up {args.warmup:g} s, "
          f"prior {'profile' if args.seeded else 'generic'}, {args.flavor} metrics")
    print("| profile | load | mean batch | busy | decode step err p50/p90 | mixed step err p50/p90 "
          "| window mean err p50/p90 | window bias | fit window s | base ms | per-seq ms | prefill tok/s "
          "| prefill tok/s, lag-free counts |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.profiles.split(","):
        profile = get_profile(name)
        truth = profile_prior(profile)
        for load_frac in (float(x) for x in args.loads.split(",")):
            reqs = workload(args.trace, args.every, load_frac, profile, args.duration)
            m = run(profile, reqs, args.interval, args.warmup, args.duration, args.seeded, args.flavor)
            print(f"| {name} | {load_frac:g} | {m['batch']:.1f} | {m['busy']:.0%} "
                  f"| {m['decode_p50']:.1%} / {m['decode_p90']:.1%} | {m['mixed_p50']:.1%} / {m['mixed_p90']:.1%} "
                  f"| {m['win_p50']:.1%} / {m['win_p90']:.1%} | {m['win_bias']:+.1%} | {m['window_s']:.1f} "
                  f"| {m['base']:.2f} | {m['per_seq']:.3f} | {m['prefill']:.0f} | {m['prefill_lag_free']:.0f} |")
        print(f"| {name} | cost model (ctx 1k) | | | | | | | | {truth.decode_step_base_ms:.2f} "
              f"| {truth.decode_step_per_seq_ms:.3f} | {truth.prefill_tokens_per_s:.0f} | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
