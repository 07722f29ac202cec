"""What each router of one `tidegate simulate --admission` run believed against what was there.

For every dispatch of the `tidegate` pick, the prefill the router counted as outstanding on the
chosen replica (its own part and its peers' reported part) against the prefill really
outstanding there (requests dispatched earlier whose first token had not come, from the run's
records); the prefill it predicted the request would compute against what the engine computed
(prompt minus the tokens really cached); each router's final margins; and per arrival window, the
requests offered, served and within the SLOs (in all; offered and within per class). The figures of
docs/BENCHMARKS.md, "Four routers: an idle replica is its owner's" and "Conversation's `standard`
at 1.5x", come from it.

    .venv/bin/python scripts/peer_view_probe.py --trace ../shared/data/traces/mooncake_synthetic_trace.jsonl \
        --slo-ttft 5s --load 2.7971 --routers 4 [--peer-ms 50] [--propagation-ms 5] [--seed 0] [--window-s 5]

Always 16 x llama3-8b-h100, class mix critical=0.2,standard=0.5,sheddable=0.3 (the setup of "Admission
and overload"). A probe, not a benchmark: it wraps the policy's on_dispatch hook to read its state.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from typing import Any

from tidegate.fleetsim import main as fm
from tidegate.policy import slo_pick
from tidegate.policy.peer_load import NO_PEER_LOAD


def probe(cfg: fm.SimulateConfig, window_s: float = 5.0) -> dict[str, Any]:
    """Runs `cfg` (one load, one router count) and returns the figures above."""
    counted: dict[str, tuple[float, float, float]] = {}   # req_id -> (own queued, peers' queued, predicted prefill)
    original = slo_pick.TidegatePolicy.on_dispatch

    def on_dispatch(self: slo_pick.TidegatePolicy, request: Any, replica_id: str) -> None:
        own = self._own.get(replica_id)
        peers = self._peer_sum.get(replica_id, NO_PEER_LOAD).queued_prefill if self._peers else 0.0
        before = own.queued if own is not None else 0.0
        original(self, request, replica_id)
        flight = self._flights.get(self._key(request, replica_id))
        counted[request.req_id] = (before, peers, flight.prefill if flight is not None else 0.0)

    runs: list = []
    slo_pick.TidegatePolicy.on_dispatch = on_dispatch  # type: ignore[method-assign]
    try:
        fm.run_matrix(cfg, fm.fleet_profiles(cfg.profile, cfg.replicas), ["tidegate"], fm.base_requests(cfg),
                      on_run=lambda summary, result: runs.append((summary, result)))
    finally:
        slo_pick.TidegatePolicy.on_dispatch = original  # type: ignore[method-assign]
    summary, result = runs[0]
    ttft_s, tpot_s = summary["slo"]["ttft_ms"] / 1000.0, summary["slo"]["tpot_ms"] / 1000.0

    by_replica: dict[str, list] = defaultdict(list)
    for r in result.records:
        if r.replica is not None and r.dispatch_s is not None and r.first_token_s is not None:
            by_replica[r.replica].append(r)
    errors, peers_real, peers_counted = [], [], []
    predicted = served = 0.0
    for recs in by_replica.values():
        for r in recs:
            if r.req.req_id not in counted:
                continue
            own_q, peer_q, pred = counted[r.req.req_id]
            ahead = [o for o in recs if o.dispatch_s < r.dispatch_s < o.first_token_s]
            real = sum(o.req.prompt_tokens - o.cached_tokens for o in ahead)
            real_peers = sum(o.req.prompt_tokens - o.cached_tokens for o in ahead if o.router != r.router)
            errors.append(real - own_q - peer_q)
            peers_real.append(real_peers)
            peers_counted.append(peer_q)
            predicted += pred
            served += r.req.prompt_tokens - r.cached_tokens

    windows: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])
    met_by_class: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    offered_by_class: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in result.records:
        k = int(r.req.arrival_s // window_s)
        w = windows[k]
        w[0] += 1
        offered_by_class[k][r.req.klass] += 1
        if r.finish_s is not None and r.ttft_s is not None:
            w[1] += 1
            met = r.ttft_s <= ttft_s and (r.tpot_s is None or r.tpot_s <= tpot_s)
            w[2] += met
            met_by_class[k][r.req.klass] += met
    q = statistics.quantiles(errors, n=20) if len(errors) >= 2 else [0.0] * 19
    return {
        "dispatches": len(errors),
        "outstanding_error_tokens": {"p5": q[0], "p50": q[9], "p95": q[18],
                                     "mean": statistics.fmean(errors) if errors else 0.0},
        "peers_outstanding_tokens": {"real_mean": statistics.fmean(peers_real) if peers_real else 0.0,
                                     "counted_mean": statistics.fmean(peers_counted) if peers_counted else 0.0},
        "prefill_tokens": {"predicted": predicted, "served": served},
        "router_margins": summary.get("router_margins", []),
        "windows": [{"from_s": k * window_s, "offered_rps": v[0] / window_s, "served_rps": v[1] / window_s,
                     "met_rps": v[2] / window_s,
                     "offered_rps_by_class": {c: n / window_s for c, n in sorted(offered_by_class[k].items())},
                     "met_rps_by_class": {c: met_by_class[k][c] / window_s for c in sorted(offered_by_class[k])}}
                    for k, v in sorted(windows.items())],
    }


def main() -> int:
    ap = fm.overload_parser(__doc__.splitlines()[0])
    ap.add_argument("--window-s", type=float, default=5.0)
    a = ap.parse_args()
    out = probe(fm.overload_config(a), a.window_s)
    e, p, t = out["outstanding_error_tokens"], out["peers_outstanding_tokens"], out["prefill_tokens"]
    print(f"dispatches {out['dispatches']}")
    print(f"outstanding prefill on the chosen replica, real - counted: p5 {e['p5']:.0f}  p50 {e['p50']:.0f}  "
          f"p95 {e['p95']:.0f}  mean {e['mean']:.0f} tokens")
    print(f"peers' part: real {p['real_mean']:.0f}, counted {p['counted_mean']:.0f} tokens on average")
    print(f"prefill predicted {t['predicted'] / 1e6:.2f} M tokens, served {t['served'] / 1e6:.2f} M")
    print(f"router margins at the end: {out['router_margins']}")
    for w in out["windows"]:
        print(f"arrivals {w['from_s']:5.0f} s +{a.window_s:g}: offered {w['offered_rps']:6.1f}/s  "
              f"served {w['served_rps']:6.1f}/s  within the SLOs {w['met_rps']:6.1f}/s ("
              + ", ".join(f"{c} {v:.1f} of {w['offered_rps_by_class'][c]:.1f}"
                          for c, v in w["met_rps_by_class"].items()) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
