"""The demo's report: pure functions from per-request results to figures."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RequestResult:
    ok: bool
    ttft_s: float | None          # first token, from send
    tpot_s: float | None          # mean time per output token after the first
    output_tokens: int
    error: str = ""
    status: int = 0


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100); 0.0 for no values."""
    if not values:
        return 0.0
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summary_ms(values_s: Sequence[float]) -> dict[str, float]:
    return {f"p{q}": round(percentile(values_s, q) * 1000.0, 1) for q in (50, 95, 99)}


def build(results: Sequence[RequestResult], *, sent: int, duration_s: float, slo_ttft_ms: float,
          slo_tpot_ms: float, replicas: list[dict[str, Any]], rate_rps: float,
          rate_basis: str) -> dict[str, Any]:
    done = [r for r in results if r.ok]
    ttfts = [r.ttft_s for r in done if r.ttft_s is not None]
    tpots = [r.tpot_s for r in done if r.tpot_s is not None]
    met = [r for r in done
           if r.ttft_s is not None and r.ttft_s * 1000 <= slo_ttft_ms
           and (r.tpot_s is None or r.tpot_s * 1000 <= slo_tpot_ms)]
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            errors[r.error or f"status {r.status}"] = errors.get(r.error or f"status {r.status}", 0) + 1
    return {
        "sent": sent,
        "completed": len(done),
        "failed": len(results) - len(done),
        "errors": errors,
        "duration_s": round(duration_s, 1),
        "offered_rps": round(rate_rps, 2),
        "rate_basis": rate_basis,
        "throughput_rps": round(len(done) / duration_s, 2) if duration_s > 0 else 0.0,
        "goodput_rps": round(len(met) / duration_s, 2) if duration_s > 0 else 0.0,
        "output_tokens": sum(r.output_tokens for r in done),
        "ttft_ms": summary_ms(ttfts),
        "tpot_ms": summary_ms(tpots),
        "slo": {"ttft_ms": slo_ttft_ms, "tpot_ms": slo_tpot_ms},
        "slo_attainment": round(len(met) / len(results), 4) if results else 0.0,
        "replicas": replicas,
    }


def render(rep: dict[str, Any]) -> str:
    lines = [
        "",
        "Tidegate demo report",
        "====================",
        f"offered load   {rep['offered_rps']} req/s  ({rep['rate_basis']})",
        f"requests       sent {rep['sent']}  completed {rep['completed']}  failed {rep['failed']}"
        f"  in {rep['duration_s']} s",
        f"throughput     {rep['throughput_rps']} req/s, goodput {rep['goodput_rps']} req/s,"
        f" {rep['output_tokens']} output tokens",
        f"TTFT ms        p50 {rep['ttft_ms']['p50']}  p95 {rep['ttft_ms']['p95']}  p99 {rep['ttft_ms']['p99']}",
        f"TPOT ms        p50 {rep['tpot_ms']['p50']}  p95 {rep['tpot_ms']['p95']}  p99 {rep['tpot_ms']['p99']}",
        f"SLO            TTFT <= {rep['slo']['ttft_ms']:.0f} ms and TPOT <= {rep['slo']['tpot_ms']:.0f} ms:"
        f" {rep['slo_attainment'] * 100:.1f}% of requests",
    ]
    if rep["errors"]:
        lines.append("errors         " + ", ".join(f"{k}: {v}" for k, v in sorted(rep["errors"].items())))
    lines.append("")
    lines.append(f"{'replica':<12} {'requests':>9} {'prompt tok':>11} {'output tok':>11} {'peak KV':>8}"
                 f" {'peak queue':>10} {'preempt':>8}")
    for r in rep["replicas"]:
        lines.append(f"{r['id']:<12} {r['requests']:>9} {r['prompt_tokens']:>11} {r['generation_tokens']:>11}"
                     f" {r['peak_kv_usage'] * 100:>7.1f}% {r['peak_waiting']:>10} {r['preemptions']:>8}")
    return "\n".join(lines)
