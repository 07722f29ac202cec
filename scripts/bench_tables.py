#!/usr/bin/env python3
"""Markdown tables for docs/BENCHMARKS.md from `tidegate simulate --json` files.

Usage: scripts/bench_tables.py RUNS.json [RUNS.json ...]
One table per file: a row per policy and load with SLO attainment, goodput, TTFT / TPOT
percentiles, queue p95, preemptions, rejections and the spread of per-replica utilisation.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def table(runs: list[dict]) -> str:
    head = ("| policy | load | SLO att. | goodput rps | TTFT p50 / p95 / p99 ms | TPOT p50 / p95 / p99 ms "
            "| queue p95 ms | preempt | rejected | util min-max | peak KV |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in sorted(runs, key=lambda r: (r["load"], r["policy"])):
        t, p, q = r["ttft_ms"], r["tpot_ms"], r["queue_ms"]
        utils = [x["utilisation"] for x in r["replicas"]]
        peak = max((x["peak_kv"] for x in r["replicas"]), default=0.0)
        lines.append(
            f"| {r['policy']} | {r['load']:g} | {r['slo_attainment'] * 100:.1f}% | {r['goodput_rps']:.1f} "
            f"| {t['p50']:.0f} / {t['p95']:.0f} / {t['p99']:.0f} | {p['p50']:.1f} / {p['p95']:.1f} / {p['p99']:.1f} "
            f"| {q['p95']:.0f} | {r['preemptions']} | {r['rejected']} "
            f"| {min(utils) * 100:.0f}-{max(utils) * 100:.0f}% | {peak * 100:.0f}% |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for name in argv:
        runs = json.loads(Path(name).read_text())["runs"]
        print(f"### {Path(name).stem}\n")
        print(table(runs))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
