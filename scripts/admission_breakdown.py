"""Where each class's requests end up in one `tidegate simulate --admission` run: dispatched at
arrival or after being held, then met the SLOs or missed TTFT / TPOT; or rejected, at arrival
(within 50 ms) or late. The run summary gives the totals; this splits them, to tell misses of the
prediction (dispatched, then late) from admission's own (held, then rejected).

    .venv/bin/python scripts/admission_breakdown.py --trace ../shared/data/traces/AzureLLMInferenceTrace_code.csv \
        --load 1.2942 --routers 4 --peer-ms 100 [--seed 0] [--slo-ttft 2s] [--decide 50ms] \
        [--slow-replicas 4:2@15] [--per-replica]

Always 16 x llama3-8b-h100, policy tidegate, class mix critical=0.2,standard=0.5,sheddable=0.3
(the setup of docs/BENCHMARKS.md, "Admission and overload").
"""

from __future__ import annotations

import collections
import sys
from typing import Any

from tidegate.fleetsim import main as fm
from tidegate.policy.classes import CLASSES, class_of


def run(cfg: fm.SimulateConfig) -> tuple[Any, float, float]:
    """The run's SimResult and its SLOs (TTFT s, TPOT s)."""
    runs: list = []
    fm.run_matrix(cfg, fm.fleet_profiles(cfg.profile, cfg.replicas), ["tidegate"], fm.base_requests(cfg),
                  on_run=lambda summary, result: runs.append((summary, result)))
    summary, result = runs[0]
    return result, summary["slo"]["ttft_ms"] / 1000.0, summary["slo"]["tpot_ms"] / 1000.0


def breakdown(cfg: fm.SimulateConfig) -> dict[str, collections.Counter]:
    """Per class, how many requests took each path: "rejected REASON at arrival|late", or
    "direct|held, met|missed TTFT|missed TTFT (sent after its deadline)|missed TPOT". Client
    errors (prompts no replica can hold) are rejected by the router's validation, not by admission."""
    return paths(*run(cfg))


def missed(r: Any, ttft_s: float, tpot_s: float) -> str | None:
    """Which SLO a served request missed: "TTFT" (checked first), "TPOT", or None (met)."""
    if r.ttft_s is None or r.ttft_s > ttft_s:
        return "TTFT"
    if r.tpot_s is not None and r.tpot_s > tpot_s:
        return "TPOT"
    return None


def by_replica(result: Any, ttft_s: float, tpot_s: float) -> dict[str, collections.Counter]:
    """Per replica, its served requests per class ("CLASS") and those that missed ("CLASS missed
    TTFT" first, else "CLASS missed TPOT"): where misses concentrate (a degraded replica)."""
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in result.records:
        if r.replica is None or r.rejected:
            continue
        cls = class_of(r.req.priority)
        c = out[r.replica]
        c[cls] += 1
        slo = missed(r, ttft_s, tpot_s)
        if slo is not None:
            c[f"{cls} missed {slo}"] += 1
    return dict(sorted(out.items()))


def paths(result: Any, ttft_s: float, tpot_s: float) -> dict[str, collections.Counter]:
    """breakdown's split of one run's records."""
    out: dict[str, collections.Counter] = {c: collections.Counter() for c in CLASSES}
    for r in result.records:
        cls = class_of(r.req.priority)
        if r.rejected:
            when = "at arrival" if r.reject_s is not None and r.reject_s - r.req.arrival_s <= 0.05 else "late"
            out[cls][f"rejected {r.rejected} {when}"] += 1
            continue
        path = "held" if r.dispatch_s is not None and r.dispatch_s > r.req.arrival_s else "direct"
        slo = missed(r, ttft_s, tpot_s)
        if slo == "TTFT":
            # Held: already late when it went (its wait was mispredicted; only a committed request,
            # --admission-decide, is sent then), or its prefill took longer than the time left?
            late_at_dispatch = (path == "held" and r.dispatch_s is not None
                                and r.dispatch_s - r.req.arrival_s >= ttft_s)
            fate = "missed TTFT (sent after its deadline)" if late_at_dispatch else "missed TTFT"
        else:
            fate = "met" if slo is None else "missed TPOT"
        out[cls][f"{path}, {fate}"] += 1
    return out


def main() -> int:
    ap = fm.overload_parser(__doc__.splitlines()[0])
    ap.add_argument("--decide", default="50ms", help="as simulate's --admission-decide (default 50ms; 'off': none)")
    ap.add_argument("--per-replica", action="store_true", help="also: per replica, served and missed per class")
    a = ap.parse_args()
    result, ttft_s, tpot_s = run(fm.overload_config(a, admission_decide=a.decide))
    out = paths(result, ttft_s, tpot_s)
    for cls in CLASSES:
        total = sum(out[cls].values())
        print(f"{cls} ({total}): " + ", ".join(f"{k} {v}" for k, v in sorted(out[cls].items())))
    if a.per_replica:
        for replica, c in by_replica(result, ttft_s, tpot_s).items():
            print(f"{replica}: " + ", ".join(
                f"{cls} {c[cls]} (TTFT {c[cls + ' missed TTFT']}, TPOT {c[cls + ' missed TPOT']} missed)"
                for cls in CLASSES if c[cls]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
