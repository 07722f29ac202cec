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
    sent_s: float = 0.0           # when it was sent, seconds from the replay's start
    reason: str = ""              # a 429's x-tidegate-reject-reason
    klass: str = ""               # its priority class, when the demo gave it one


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
          rate_basis: str, window_s: float | None = None) -> dict[str, Any]:
    """`duration_s`: the replay's wall time, drain included. Throughput and goodput are per second
    of `window_s` (the arrival window) when given, so that runs which drain for different times
    compare on the same offered work."""
    done = [r for r in results if r.ok]
    ttfts = [r.ttft_s for r in done if r.ttft_s is not None]
    tpots = [r.tpot_s for r in done if r.tpot_s is not None]
    met = [r for r in done
           if r.ttft_s is not None and r.ttft_s * 1000 <= slo_ttft_ms
           and (r.tpot_s is None or r.tpot_s * 1000 <= slo_tpot_ms)]
    classes: dict[str, dict[str, Any]] = {}
    for name in sorted({r.klass for r in results if r.klass}):
        sent_c = sum(1 for r in results if r.klass == name)
        met_c = sum(1 for r in met if r.klass == name)
        classes[name] = {"sent": sent_c, "in_slo": met_c, "slo_attainment": round(met_c / sent_c, 4)}
    errors: dict[str, int] = {}
    rejected: dict[str, int] = {}
    unavailable = 0
    for r in results:
        if r.ok:
            continue
        if r.status == 429:
            rejected[r.reason or "unknown"] = rejected.get(r.reason or "unknown", 0) + 1
        elif r.status == 503:
            unavailable += 1
        else:
            errors[r.error or f"status {r.status}"] = errors.get(r.error or f"status {r.status}", 0) + 1
    per_s = window_s if window_s is not None else duration_s
    return {
        "sent": sent,
        "completed": len(done),
        "failed": len(results) - len(done),
        "errors": errors,
        "rejected": rejected,
        "unavailable": unavailable,
        "duration_s": round(duration_s, 1),
        "offered_rps": round(rate_rps, 2),
        "rate_basis": rate_basis,
        "throughput_rps": round(len(done) / per_s, 2) if per_s > 0 else 0.0,
        "goodput_rps": round(len(met) / per_s, 2) if per_s > 0 else 0.0,
        "output_tokens": sum(r.output_tokens for r in done),
        "ttft_ms": summary_ms(ttfts),
        "tpot_ms": summary_ms(tpots),
        "slo": {"ttft_ms": slo_ttft_ms, "tpot_ms": slo_tpot_ms},
        "slo_attainment": round(len(met) / len(results), 4) if results else 0.0,
        "replicas": replicas,
        **({"classes": classes} if classes else {}),
    }


def render(rep: dict[str, Any]) -> str:
    lines = [
        "",
        "Tidegate demo report",
        "====================",
        f"policy         {rep.get('policy', '-')}",
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
    if rep.get("rejected") or rep.get("unavailable"):
        lines.append(f"rejected       {_rejections(rep)}")
    if rep["errors"]:
        lines.append("errors         " + ", ".join(f"{k}: {v}" for k, v in sorted(rep["errors"].items())))
    lines.append("")
    lines.append(f"{'replica':<12} {'requests':>9} {'prompt tok':>11} {'output tok':>11} {'peak KV':>8}"
                 f" {'peak queue':>10} {'preempt':>8}")
    for r in rep["replicas"]:
        lines.append(f"{r['id']:<12} {r['requests']:>9} {r['prompt_tokens']:>11} {r['generation_tokens']:>11}"
                     f" {r['peak_kv_usage'] * 100:>7.1f}% {r['peak_waiting']:>10} {r['preemptions']:>8}")
    return "\n".join(lines)


def _rejections(rep: dict[str, Any]) -> str:
    parts = [f"429 {k}: {v}" for k, v in sorted(rep.get("rejected", {}).items())]
    if rep.get("unavailable"):
        parts.append(f"503: {rep['unavailable']}")
    return ", ".join(parts) or "none"


def errors_count(rep: dict[str, Any]) -> int:
    """Failures that are not deliberate refusals (429 admission, 503 no capacity)."""
    return sum(rep["errors"].values())


def render_compare(runs: Sequence[dict[str, Any]]) -> str:
    """Runs side by side, one column per policy (each run is a `build` report with a "policy")."""
    head = f"{'':<22}" + "".join(f"{r['policy']:>16}" for r in runs)

    def row(label: str, cells: Sequence[str]) -> str:
        return f"{label:<22}" + "".join(f"{c:>16}" for c in cells)

    slo = runs[0]["slo"] if runs else {"ttft_ms": 0, "tpot_ms": 0}
    lines = ["", "Policies side by side (same trace, same load, same fleet)",
             "=========================================================", head,
             row("SLO attainment", [f"{r['slo_attainment'] * 100:.1f}%" for r in runs]),
             row("goodput req/s", [f"{r['goodput_rps']:.2f}" for r in runs]),
             row("throughput req/s", [f"{r['throughput_rps']:.2f}" for r in runs])]
    classes = sorted({c for r in runs for c in r.get("classes", {})})
    for c in classes:
        lines.append(row(f"  attainment {c}",
                         [f"{r['classes'][c]['slo_attainment'] * 100:.1f}%" if c in r.get("classes", {}) else "-"
                          for r in runs]))
    for metric in ("ttft_ms", "tpot_ms"):
        for q in ("p50", "p95", "p99"):
            lines.append(row(f"{metric[:4].upper()} {q} ms", [f"{r[metric][q]:.1f}" for r in runs]))
    lines.append(row("sent / completed", [f"{r['sent']}/{r['completed']}" for r in runs]))
    reasons = sorted({k for r in runs for k in r.get("rejected", {})})
    for k in reasons:
        lines.append(row(f"429 {k}", [str(r.get("rejected", {}).get(k, 0)) for r in runs]))
    lines.append(row("503 no capacity", [str(r.get("unavailable", 0)) for r in runs]))
    lines.append(row("errors", [str(errors_count(r)) for r in runs]))
    lines.append(row("max peak KV", [f"{max((x['peak_kv_usage'] for x in r['replicas']), default=0) * 100:.0f}%"
                                     for r in runs]))
    lines.append(row("preemptions", [str(sum(x["preemptions"] for x in r["replicas"])) for r in runs]))
    lines.append(f"SLO: TTFT <= {slo['ttft_ms']:.0f} ms and TPOT <= {slo['tpot_ms']:.0f} ms; a refused request "
                 "misses it; goodput = requests in SLO per second of arrivals")
    return "\n".join(lines)
