"""Figures of one run (pure): SLO attainment, goodput, latency percentiles, per-replica load.

- A request meets the SLO when it was served, its TTFT <= slo_ttft and its TPOT (mean time per
  output token after the first) <= slo_tpot; a one-token answer has no TPOT and only needs TTFT.
- slo_attainment = met / servable requests (rejected and unfinished ones count as missed); per
  class too. Requests no replica could ever serve (prompt + output beyond the context, or a
  prompt beyond the KV cache) are client errors (HTTP 400 from a real router): counted apart in
  `client_errors` and left out of the attainment denominator, since no routing can meet them.
- offered_rps = requests / arrival span, goodput_rps = met / arrival span, throughput_rps =
  completed / arrival span: one denominator (first to last arrival; the run's length when 0).
- prefix_hit_rate = prompt tokens served from the prefix cache / prompt tokens, over served requests.
- queue_ms = arrival to the engine step that first schedules the request (router hold included).
- Admission (runs with a router queue): `rejected_by_class` (class -> reason -> count),
  `time_to_reject_ms` (arrival to the rejection, virtual time), `rejected_within_50ms`, `held_ms` (arrival to dispatch,
  over the requests the router held), `goodput_rps_by_class`, `router_margins` (per router, the
  TPOT plan and TTFT margins it ended the run with).
- utilisation = time the engine spent in steps / the run (first arrival to last completion).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from tidegate.fleet.report import summary_ms
from tidegate.fleetsim.sim import CLIENT_ERROR, SimResult, makespan

REJECT_TARGET_S = 0.05


def summarize(result: SimResult, *, policy: str, load: float | None, slo_ttft_s: float, slo_tpot_s: float,
              wall_s: float | None = None, **extra: Any) -> dict[str, Any]:
    """`extra` (e.g. routers=4) is added to the summary as given."""
    recs = result.records
    served = [r for r in recs if r.finish_s is not None]
    met_by_class: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    met = 0
    client_errors = 0
    for r in recs:
        if r.rejected == CLIENT_ERROR:
            client_errors += 1
            continue
        ok = False
        if r.finish_s is not None:
            ttft, tpot = r.ttft_s, r.tpot_s
            ok = ttft is not None and ttft <= slo_ttft_s and (tpot is None or tpot <= slo_tpot_s)
        met += ok
        c = met_by_class[r.req.klass]
        c[0] += ok
        c[1] += 1
    arrivals = [r.req.arrival_s for r in recs]
    span = (max(arrivals) - min(arrivals)) if arrivals else 0.0
    run_s = makespan(result)
    if span <= 0:
        span = run_s
    rejected: dict[str, int] = defaultdict(int)
    by_class: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in recs:
        if r.rejected and r.rejected != CLIENT_ERROR:
            rejected[r.rejected] += 1
            by_class[r.req.klass][r.rejected] += 1
    to_reject = [r.reject_s - r.req.arrival_s for r in recs if r.reject_s is not None]
    held = [r.dispatch_s - r.req.arrival_s for r in recs
            if r.dispatch_s is not None and r.dispatch_s > r.req.arrival_s]
    judged = len(recs) - client_errors
    prompt = sum(r.req.prompt_tokens for r in served)
    out: dict[str, Any] = {
        "policy": policy,
        "load": load,
        **extra,
        "requests": len(recs),
        "completed": len(served),
        "client_errors": client_errors,
        "offered_rps": round(len(recs) / span, 3) if span > 0 else 0.0,
        "duration_s": round(span, 3),
        "makespan_s": round(run_s, 3),
        "goodput_rps": round(met / span, 3) if span > 0 else 0.0,
        "throughput_rps": round(len(served) / span, 3) if span > 0 else 0.0,
        "slo": {"ttft_ms": round(slo_ttft_s * 1000, 3), "tpot_ms": round(slo_tpot_s * 1000, 3)},
        "slo_attainment": round(met / judged, 4) if judged else 0.0,
        "slo_attainment_by_class": {k: round(v[0] / v[1], 4) for k, v in sorted(met_by_class.items())},
        "ttft_ms": summary_ms([r.ttft_s for r in served if r.ttft_s is not None]),
        "tpot_ms": summary_ms([r.tpot_s for r in served if r.tpot_s is not None]),
        "queue_ms": summary_ms([r.queue_s for r in served if r.queue_s is not None]),
        "rejected": sum(rejected.values()),
        "rejected_by_reason": dict(sorted(rejected.items())),
        "rejected_by_class": {k: dict(sorted(v.items())) for k, v in sorted(by_class.items())},
        "goodput_rps_by_class": {k: round(v[0] / span, 3) if span > 0 else 0.0
                                 for k, v in sorted(met_by_class.items())},
        "time_to_reject_ms": {**summary_ms(to_reject), "max": round(max(to_reject, default=0.0) * 1000.0, 1)},
        # The target: every rejection answered within 50 ms of arrival.
        "rejected_within_50ms": sum(1 for t in to_reject if t <= REJECT_TARGET_S),
        "held_ms": summary_ms(held),
        "held": len(held),
        "preemptions": sum(rep.preemptions for rep in result.replicas),
        "prefix_hit_rate": round(sum(r.cached_tokens for r in served) / prompt, 4) if prompt else 0.0,
        # Cut short by the capacity search once it was sure to miss: attainment is then a lower bound.
        "stopped_early": result.stopped_early,
        "replicas": [
            {"id": rep.replica_id, "profile": rep.profile,
             "utilisation": round(min(1.0, rep.busy_s / run_s), 4) if run_s > 0 else 0.0,
             "peak_kv": round(rep.peak_kv, 4), "requests": rep.requests, "preemptions": rep.preemptions}
            for rep in result.replicas
        ],
    }
    if result.margins:
        out["router_margins"] = [{k: round(v, 4) for k, v in m.items()} for m in result.margins]
    if wall_s is not None:
        out["wall_s"] = round(wall_s, 2)
    return out


def render(runs: list[dict[str, Any]]) -> str:
    """One line per run: the side-by-side table printed by `tidegate simulate`."""
    head = (f"{'policy':<19} {'rtr':>3} {'load':>5} {'reqs':>6} {'goodput':>8} {'SLO %':>6} {'hit %':>5} "
            f"{'TTFT p50':>9} {'p95':>8} "
            f"{'p99':>8} {'TPOT p50':>9} {'p95':>6} {'p99':>6} {'queue p95':>9} {'preempt':>7} {'rej':>5} "
            f"{'util':>9} {'peak KV':>7}")
    lines = [head, "-" * len(head)]
    for r in runs:
        utils = [x["utilisation"] for x in r["replicas"]]
        util = f"{min(utils) * 100:.0f}-{max(utils) * 100:.0f}%" if utils else "-"
        peak = max((x["peak_kv"] for x in r["replicas"]), default=0.0)
        load = "-" if r["load"] is None else f"{r['load']:g}"
        name = r["policy"] + ("+adm" if r.get("admission") else "")
        lines.append(
            f"{name:<19} {r.get('routers', 1):>3} {load:>5} {r['requests']:>6} {r['goodput_rps']:>8.2f} "
            f"{r['slo_attainment'] * 100:>6.1f} {r.get('prefix_hit_rate', 0.0) * 100:>5.1f} "
            f"{r['ttft_ms']['p50']:>9.0f} {r['ttft_ms']['p95']:>8.0f} {r['ttft_ms']['p99']:>8.0f} "
            f"{r['tpot_ms']['p50']:>9.1f} {r['tpot_ms']['p95']:>6.1f} {r['tpot_ms']['p99']:>6.1f} "
            f"{r['queue_ms']['p95']:>9.0f} {r['preemptions']:>7} {r['rejected']:>5} {util:>9} {peak * 100:>6.1f}%"
        )
    return "\n".join(lines)


def render_capacity(rows: list[dict[str, Any]]) -> str:
    """One line per (policy, routers): the SLO capacity found by --find-capacity."""
    head = f"{'policy':<19} {'rtr':>3} {'SLO capacity rps':>16} {'spread':>15} {'load':>6} {'SLO %':>6}"
    lines = [head, "-" * len(head)]
    for r in sorted(rows, key=lambda r: (r["routers"], -r["slo_capacity_rps"], r["policy"])):
        spread = (f"{r['slo_capacity_rps_min']:.1f}-{r['slo_capacity_rps_max']:.1f}"
                  if "slo_capacity_rps_min" in r else "-")
        rate = f"{'>=' if r.get('capped') else ''}{r['slo_capacity_rps']:.2f}"
        lines.append(f"{r['policy']:<19} {r['routers']:>3} {rate:>16} {spread:>15} {r['load']:>6.3f} "
                     f"{r['attainment'] * 100:>6.1f}")
    return "\n".join(lines)
