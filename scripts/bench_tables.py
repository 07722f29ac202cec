#!/usr/bin/env python3
"""Markdown tables for docs/BENCHMARKS.md from `tidegate simulate --json` files.

Usage: scripts/bench_tables.py RUNS.json [RUNS.json ...]
One table per file. A file written with --find-capacity gives its SLO-capacity table: a row per
policy, a column pair per router count (SLO capacity in requests/s, and as a fraction of the
estimated capacity, i.e. the load; "≥" when the search hit its upper limit; ± the spread over
seeds), best first by the 1-router figure. Otherwise: a row per policy and load with SLO
attainment, goodput, TTFT / TPOT percentiles, queue p95, preemptions, rejections and the spread
of per-replica utilisation.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def table(runs: list[dict]) -> str:
    head = ("| policy | load | SLO att. | goodput rps | TTFT p50 / p95 / p99 ms | TPOT p50 / p95 / p99 ms "
            "| queue p95 ms | preempt | rejected | util min-max | peak KV |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in sorted(runs, key=lambda r: (r["load"], r.get("routers", 1), r["policy"])):
        t, p, q = r["ttft_ms"], r["tpot_ms"], r["queue_ms"]
        utils = [x["utilisation"] for x in r["replicas"]]
        peak = max((x["peak_kv"] for x in r["replicas"]), default=0.0)
        routers = f" ×{r['routers']}" if r.get("routers", 1) > 1 else ""
        lines.append(
            f"| {r['policy']}{routers} | {r['load']:g} | {r['slo_attainment'] * 100:.1f}% | {r['goodput_rps']:.1f} "
            f"| {t['p50']:.0f} / {t['p95']:.0f} / {t['p99']:.0f} | {p['p50']:.1f} / {p['p95']:.1f} / {p['p99']:.1f} "
            f"| {q['p95']:.0f} | {r['preemptions']} | {r['rejected']} "
            f"| {min(utils) * 100:.0f}-{max(utils) * 100:.0f}% | {peak * 100:.0f}% |")
    return "\n".join(lines)


def capacity_table(rows: list[dict], estimate: dict | None = None) -> str:
    counts = sorted({r["routers"] for r in rows})
    head = "| policy | " + " | ".join(f"{n} router{'s' if n > 1 else ''}: rps (load) | att." for n in counts) + " |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    by = {(r["policy"], r["routers"]): r for r in rows}
    first = counts[0]
    order = sorted({r["policy"] for r in rows},
                   key=lambda p: (-by.get((p, first), {}).get("slo_capacity_rps", 0.0), p))
    for pol in order:
        cells = []
        for n in counts:
            r = by.get((pol, n))
            if r is None:
                cells += ["-", "-"]
                continue
            rate = f"{'≥' if r.get('capped') else ''}{r['slo_capacity_rps']:.1f}"
            if "slo_capacity_rps_min" in r:
                rate += f" ± {(r['slo_capacity_rps_max'] - r['slo_capacity_rps_min']) / 2:.1f}"
            cells += [f"{rate} ({r['load']:.2f})", f"{r['attainment'] * 100:.1f}%"]
        lines.append(f"| {pol} | " + " | ".join(cells) + " |")
    if estimate:
        lines.append("")
        lines.append(f"Load 1.0 = {estimate['fleet_rps']:.1f} req/s (closed-loop estimate; Little's law: "
                     f"{estimate['littles_law_rps']:.1f}).")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for name in argv:
        doc = json.loads(Path(name).read_text())
        print(f"### {Path(name).stem}\n")
        if doc.get("capacity"):
            print(capacity_table(doc["capacity"], doc.get("capacity_estimate")))
        else:
            print(table(doc["runs"]))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
