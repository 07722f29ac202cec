"""`tidegate simulate`: a whole fleet on a virtual clock, one run per policy and load.

Each run replays the same requests through fresh replicas, agents, control plane and router
(fleetsim.sim), prints one table line and, with --json, writes {"runs": [...]} (fleetsim.results).

Load: `--load X[,Y...]` scales arrivals to X times the fleet's estimated capacity
(fleetsim.capacity: the saturation throughput of each profile measured by a short closed-loop
simulation on the workload's own lengths, times its replicas); `--rate-scale X` compresses the
trace's own arrival times X-fold instead; neither: the trace's own rate (synthetic: `--rate`).
`--max-requests M` replays only the first M requests; `--duration S` keeps the requests arriving
in the first S seconds after scaling (with --find-capacity: at load 1.0, so that every rate
replays the same requests); every kept request then runs to completion.

Routers: `--routers 1,4` runs each configuration with 1 and with 4 routers (fleetsim.sim),
requests spread over them by `--router-spread rr` (default: round-robin, what a Kubernetes
Service or L4 balancer does in front of stateless routers, and the hard case for router-local
state) or `hash` (a session key, the first prefix hash, pins one client's prefix-sharing traffic
to one router).

SLO capacity: `--find-capacity` searches, per policy and router count, the highest offered rate
at which at least `--attainment` of the requests meet both SLOs (fleetsim.capacity.search_capacity:
bracketing from load 1.0 by factors of 1.3 (later router counts: from the previous count's figure by
factors of 1.08), then bisection to within 2% of the rate; the same
requests with arrival times compressed). `--seeds K` repeats every run with seeds seed..seed+K-1
and reports the mean and the spread; `--jobs J` runs J (policy, seed) searches, or J runs, in parallel
processes.

SLO units: `--slo-ttft` and `--slo-tpot` take a unit suffix, `s` or `ms` ("2s", "2000ms",
"100ms", "0.1s"); a bare number is seconds for --slo-ttft and milliseconds for --slo-tpot.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import structlog
from pydantic import Field, field_validator

from tidegate import logs
from tidegate.config import AdmissionFields, ConfigBase, ConfigError, add_flags, load
from tidegate.fleet import capacity
from tidegate.fleet.traces import TraceError
from tidegate.fleetsim import capacity as saturation
from tidegate.fleetsim import results, workload
from tidegate.fleetsim.sim import ROUTER_SPREADS, SimConfig, SimResult, Simulation, Slowdown, servable
from tidegate.policy import registry
from tidegate.policy.admission_budget import BudgetConfig
from tidegate.policy.rates import RateEstimatorConfig
from tidegate.policy.registry import SloTargets
from tidegate.simulator.profiles import Profile, ProfileError, get_profile

log = structlog.get_logger(__name__)

DEFAULT_PROFILE = "llama3-8b-h100"


def _split(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    items = v.split(",") if isinstance(v, str) else [x for item in v for x in str(item).split(",")]
    return tuple(x.strip() for x in items if x.strip())


class SimulateConfig(ConfigBase, AdmissionFields):
    trace: Path | None = Field(None, description="Trace file: Azure CSV (2023 or 2024 releases), BurstGPT CSV, "
                                                 "Mooncake JSONL, or generic CSV/JSONL "
                                                 "(arrival_s, prompt_tokens, output_tokens[, prefix_hashes, "
                                                 "priority]). Without it a synthetic --workload runs.")
    workload: str = Field("poisson", description="Synthetic arrivals when no --trace: poisson or gamma (bursty).")
    rate: float = Field(10.0, gt=0, description="Synthetic arrival rate, requests/s (before --load/--rate-scale).")
    requests: int = Field(1000, ge=1, description="Synthetic: number of requests.")
    burstiness: float = Field(4.0, gt=0, description="Gamma arrivals: squared coefficient of variation of gaps.")
    lengths: str = Field("lognormal", description="Synthetic length distribution: lognormal or pareto.")
    prompt_mean: float = Field(1024.0, gt=0, description="Synthetic: mean prompt tokens.")
    output_mean: float = Field(256.0, gt=0, description="Synthetic: mean output tokens.")
    load: tuple[float, ...] = Field((), description="Offered load(s) as fractions of the fleet's estimated "
                                                    "capacity, comma-separated (e.g. 0.5,0.7,0.9).")
    rate_scale: float | None = Field(None, gt=0, description="Compress arrival times by this factor "
                                                             "(instead of --load).")
    replicas: int | None = Field(None, ge=1, description="Number of replicas (default 4; with NAME:COUNT "
                                                        "profiles, their sum).")
    profile: tuple[str, ...] = Field((), description="Replica profile NAME or NAME:COUNT; repeatable for a mixed "
                                                    f"fleet (default {DEFAULT_PROFILE}).")
    policy: tuple[str, ...] = Field((), description="Routing policy; repeatable or comma-separated; 'all' = every "
                                                   "registered policy (default tidegate).")
    slo_ttft: str = Field("2s", description="TTFT SLO: '2s' or '2000ms' (bare number: seconds).")
    slo_tpot: str = Field("100ms", description="TPOT SLO: '100ms' or '0.1s' (bare number: milliseconds).")
    duration: float | None = Field(None, gt=0, description="Replay only the arrivals of the first S seconds "
                                                          "(after scaling).")
    seed: int = Field(0, description="Seed of every random choice (workload, router, agent phases).")
    report_interval_s: float = Field(1.0, gt=0, description="Agent report interval, seconds.")
    tick_s: float = Field(0.5, gt=0, description="Control-plane tick, seconds.")
    propagation_ms: float = Field(5.0, ge=0, description="etcd propagation delay of a routing table, ms.")
    hop_ms: float = Field(0.0, ge=0, description="Client-router-engine transport each way, ms (0: ideal network); "
                                                 "scripts/crosscheck_live_vs_sim.py measures it on a live fleet.")
    scrape_ms: float | None = Field(None, gt=0, description="Let every router poll every engine's queue and KV "
                                                           "itself every N ms, whatever the policy (default: only "
                                                           "policies that scrape as deployed do: llmd, 50 ms).")
    routers: tuple[int, ...] = Field((1,), description="Routers, each with its own policy instance, in-flight "
                                                      "counts and table; comma-separated for one run set per "
                                                      "count (e.g. 1,4).")
    peer_ms: float = Field(50.0, ge=0, allow_inf_nan=False,
                           description="With several routers, each whose policy exchanges load reports (tidegate) "
                                       "publishes its per-replica load and newly placed prefix blocks to its "
                                       "peers every N ms, as the live router's load record (default 50, like "
                                       "the router's --peer-load-interval-s 0.05); 0: off, routers share nothing.")
    rate_lag_windows: float | None = Field(None, ge=0, allow_inf_nan=False,
                                           description="The control plane's rate fit: merge report windows for "
                                                       "the prefill slope until they span N measured prefill "
                                                       "durations (default: RateEstimatorConfig's, 2; 0: every "
                                                       "window alone). For measuring the estimator.")
    rate_lead: bool = Field(True, description="The control plane's rate fit reads each window's next window's "
                                              "prompt count as a lead term (--no-rate-lead: the fit before it, "
                                              "with --rate-lag-windows 10). For measuring the estimator.")
    router_spread: str = Field("rr", description="How requests reach the routers: rr (round-robin, like an L4 "
                                                 "balancer) or hash (by session key: the first prefix hash).")
    router_offset: int = Field(0, ge=0, description="With rr spread: the router the first request reaches (the "
                               "rest in turn). Another assignment of the same trace and classes, to see how far "
                               "a several-router figure moves with it alone.")
    max_requests: int | None = Field(None, ge=1, description="Replay only the first M requests of the trace (its "
                                     "first M rows: published traces are in time order; the rest is not read).")
    replica_ids: tuple[str, ...] = Field((), description="The replicas' ids, comma-separated, one per replica "
                                                        "(default replica-00, replica-01, ...): prefix affinity's "
                                                        "rendezvous homes hash them, so a comparison with a live "
                                                        "fleet gives its ids.")
    hide_max_tokens: bool = Field(False, description="Send requests without max_tokens (the replay otherwise sets "
                                                     "it to the true output length, which flatters policies that "
                                                     "read it).")
    hide_max_tokens_share: float = Field(0.0, ge=0.0, le=1.0,
                                         description="Send this share of the requests (chosen by --seed) without "
                                                     "max_tokens, as from a fleet where only some clients set it "
                                                     "(--hide-max-tokens: all of them).")
    max_tokens_cap: int | None = Field(None, ge=1, description="Requests that send max_tokens send max(N, their true "
                                                               "output), as clients that set one generous cap "
                                                               "(e.g. 4096) whatever the answer; the engines still "
                                                               "write the trace's output.")
    slow_replicas: str | None = Field(None, description="N:F[@T] -- the last N replicas run F times slower than "
                                                        "their profile (every step's duration x F) from T s "
                                                        "after the first arrival (default 0), as a throttled or "
                                                        "degraded GPU would; only their telemetry says so.")
    find_capacity: bool = Field(False, description="Per policy and router count, search the highest offered rate "
                                                   "meeting --attainment (adds 'capacity' to the JSON).")
    attainment: float = Field(0.95, gt=0, le=1, description="Target SLO attainment of --find-capacity.")
    seeds: int = Field(1, ge=1, description="Repeat every run with seeds seed..seed+K-1; capacities are reported "
                                            "as mean and spread. The trace, a synthetic workload and the "
                                            "--class-mix draw stay those of --seed: only the simulation's own "
                                            "draws change.")
    jobs: int = Field(1, ge=1, description="Parallel worker processes (one run, or one capacity search, each).")
    class_mix: str | None = Field(None, description="Give requests classes at random (seeded), e.g. "
                                                    "critical=0.2,standard=0.5,sheddable=0.3 (priorities 1, 0, -1); "
                                                    "replaces the trace's own classes.")
    admission_budgets: bool = Field(True, description="With --admission: the control plane's admission budgets "
                                                     "(controlplane/admission_budgets.py) split among the routers by "
                                                     "demand, each router's share part of its queue's dispatch "
                                                     "decision, as live.")
    json_path: Path | None = Field(None, description="Write {'runs': [...]} to this file.")
    plot: Path | None = Field(None, description="Write PNG plots to this directory (needs matplotlib: "
                                                "pip install 'tidegate[plot]').")
    rates_csv: Path | None = Field(None, description="Write every routing table the routers received, one row per "
                                                     "replica (run, seconds from the first arrival, the fitted "
                                                     "prefill tokens/s and decode step figures; 0 = not yet "
                                                     "published), to this CSV: how the control plane's rate fit "
                                                     "moved during each run.")

    @field_validator("load", mode="before")
    @classmethod
    def _loads(cls, v: Any) -> tuple[float, ...]:
        return tuple(float(x) for x in _split(v))

    @field_validator("profile", "policy", "replica_ids", mode="before")
    @classmethod
    def _names(cls, v: Any) -> tuple[str, ...]:
        return _split(v)

    @field_validator("replica_ids")
    @classmethod
    def _distinct_ids(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        repeated = sorted({x for x in v if v.count(x) > 1})
        if repeated:
            raise ValueError(f"must be distinct; repeated: {', '.join(repeated)}")
        return v

    @field_validator("routers", mode="before")
    @classmethod
    def _router_counts(cls, v: Any) -> tuple[int, ...]:
        return tuple(int(x) for x in _split(v)) if isinstance(v, (str, list)) else v

    @field_validator("routers")
    @classmethod
    def _routers_positive(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or any(x < 1 for x in v):
            raise ValueError("every router count must be >= 1")
        return v

    @field_validator("class_mix")
    @classmethod
    def _class_mix(cls, v: str | None) -> str | None:
        if v is not None:
            workload.parse_class_mix(v)
        return v

    @field_validator("router_spread")
    @classmethod
    def _spread(cls, v: str) -> str:
        if v not in ROUTER_SPREADS:
            raise ValueError(f"must be one of {', '.join(ROUTER_SPREADS)}")
        return v

    @field_validator("load")
    @classmethod
    def _positive(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if any(not (x > 0) for x in v):
            raise ValueError("every load must be > 0")
        return v

    @field_validator("workload")
    @classmethod
    def _workload(cls, v: str) -> str:
        if v not in ("poisson", "gamma"):
            raise ValueError("must be poisson or gamma")
        return v

    @field_validator("lengths")
    @classmethod
    def _lengths(cls, v: str) -> str:
        if v not in ("lognormal", "pareto"):
            raise ValueError("must be lognormal or pareto")
        return v

    @field_validator("slo_ttft")
    @classmethod
    def _ttft(cls, v: str) -> str:
        parse_duration(v, "s")
        return v

    @field_validator("slo_tpot")
    @classmethod
    def _tpot(cls, v: str) -> str:
        parse_duration(v, "ms")
        return v


CONFIG_CLASS = SimulateConfig


def parse_duration(text: str, bare_unit: str) -> float:
    """'2s' / '2000ms' / bare number in `bare_unit` -> seconds (> 0)."""
    t = str(text).strip().lower()
    unit = bare_unit
    if t.endswith("ms"):
        t, unit = t[:-2], "ms"
    elif t.endswith("s"):
        t, unit = t[:-1], "s"
    try:
        v = float(t)
    except ValueError:
        raise ValueError(f"{text!r} is not a duration like 2s or 100ms") from None
    if not v > 0:
        raise ValueError(f"{text!r} must be positive")
    return v / 1000.0 if unit == "ms" else v


# The setup of docs/BENCHMARKS.md, "Admission and overload" (issue 9's overload tables), which the
# diagnosis scripts explaining those tables replay (scripts/admission_breakdown.py,
# scripts/peer_view_probe.py): 16 x llama3-8b-h100, `tidegate` with admission, this class mix.
OVERLOAD_CLASS_MIX = "critical=0.2,standard=0.5,sheddable=0.3"


def overload_parser(description: str) -> argparse.ArgumentParser:
    """The flags of one overload run (see overload_config); a script adds its own."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--load", type=float, required=True)
    ap.add_argument("--routers", type=int, default=1)
    ap.add_argument("--peer-ms", type=float, default=50.0)
    ap.add_argument("--propagation-ms", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--router-offset", type=int, default=0,
                    help=SimulateConfig.model_fields["router_offset"].description)
    ap.add_argument("--slo-ttft", default="2s")
    ap.add_argument("--slow-replicas", default=None, metavar="N:F[@T]",
                    help=SimulateConfig.model_fields["slow_replicas"].description)
    return ap


def overload_config(args: argparse.Namespace, **fields: Any) -> SimulateConfig:
    """One overload run from overload_parser's flags; `fields` set the rest (e.g. admission_decide)."""
    return SimulateConfig(trace=args.trace, replicas=16, profile=("llama3-8b-h100",), policy=("tidegate",),
                          admission=True, class_mix=OVERLOAD_CLASS_MIX, load=(args.load,), routers=(args.routers,),
                          peer_ms=args.peer_ms, propagation_ms=args.propagation_ms, seed=args.seed,
                          router_offset=args.router_offset,
                          slo_ttft=args.slo_ttft, slow_replicas=args.slow_replicas, **fields)


def fleet_profiles(specs: Sequence[str], replicas: int | None) -> list[Profile]:
    """One profile per replica from NAME / NAME:COUNT specs."""
    specs = list(specs) or [DEFAULT_PROFILE]
    counted = [s for s in specs if ":" in s]
    if counted and len(counted) != len(specs):
        raise ValueError("give every --profile as NAME:COUNT, or a single NAME with --replicas")
    if not counted:
        if len(specs) != 1:
            raise ValueError("several profiles need counts: --profile NAME:COUNT (repeatable)")
        return [get_profile(specs[0])] * (replicas or 4)
    out: list[Profile] = []
    for s in specs:
        name, _, count = s.rpartition(":")
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"--profile {s!r}: COUNT must be a positive integer")
        out.extend([get_profile(name)] * int(count))
    if replicas is not None and replicas != len(out):
        raise ValueError(f"--replicas {replicas} does not match the profile counts ({len(out)})")
    return out


def slowdowns(spec: str | None, replicas: int) -> tuple[Slowdown, ...]:
    """`--slow-replicas N:F[@T]`: the last N of `replicas` run F times slower (F > 1), from T s after
    the first arrival (default 0: from the start). None: none."""
    if spec is None:
        return ()
    head, _, at = spec.partition("@")
    count, sep, factor = head.partition(":")
    try:
        n, f, t = int(count), float(factor), float(at) if at else 0.0
        if not sep or not 1 <= n <= replicas:
            raise ValueError
        return tuple(Slowdown(i, f, t) for i in range(replicas - n, replicas))
    except ValueError:
        raise ValueError(f"--slow-replicas {spec!r}: give N:F[@T] with 1 <= N <= {replicas} replicas, "
                         "1 < F < 100 and T >= 0 seconds") from None


def policy_names(specs: Sequence[str]) -> list[str]:
    names = list(specs) or ["tidegate"]
    if "all" in names:
        return registry.names()
    for n in names:
        registry.create(n)  # raises UnknownPolicyError listing the valid names
    return names


def fleet_capacity_rps(profiles: Sequence[Profile], reqs: Sequence[workload.SimRequest]) -> float:
    """The former estimate (Little's law on mean lengths, tidegate.fleet.capacity), for comparison."""
    trace = workload.as_trace(reqs)
    return sum(capacity.estimate(p, trace, n).fleet_rps for p, n in saturation.profile_groups(profiles))


def base_requests(cfg: SimulateConfig) -> list[workload.SimRequest]:
    if cfg.trace is not None:
        reqs = workload.load(cfg.trace, cfg.max_requests)
    else:
        spec = workload.SyntheticSpec(arrivals=cfg.workload, rate_rps=cfg.rate, requests=cfg.requests,
                                      burstiness=cfg.burstiness, lengths=cfg.lengths, prompt_mean=cfg.prompt_mean,
                                      output_mean=cfg.output_mean)
        reqs = workload.synthetic(spec, cfg.seed)
    if cfg.max_requests is not None:
        reqs = reqs[:cfg.max_requests]
    if cfg.class_mix is not None:
        reqs = workload.assign_classes(reqs, workload.parse_class_mix(cfg.class_mix), cfg.seed)
    return reqs


def _slos(cfg: SimulateConfig) -> tuple[float, float]:
    return parse_duration(cfg.slo_ttft, "s"), parse_duration(cfg.slo_tpot, "ms")


def rate_config(cfg: SimulateConfig) -> RateEstimatorConfig | None:
    """The control plane's rate fit as --rate-lag-windows and --no-rate-lead set it (None: its default)."""
    if cfg.rate_lag_windows is None and cfg.rate_lead:
        return None
    base = RateEstimatorConfig()
    return dataclasses.replace(base, lead=cfg.rate_lead,
                               lag_windows=base.lag_windows if cfg.rate_lag_windows is None else cfg.rate_lag_windows)


def _sim_config(cfg: SimulateConfig, routers: int) -> SimConfig:
    admission = cfg.admission_config(peer_report_s=(cfg.peer_ms + cfg.propagation_ms) / 1000.0)
    return SimConfig(report_interval_s=cfg.report_interval_s, tick_s=cfg.tick_s,
                     propagation_s=cfg.propagation_ms / 1000.0, hop_s=cfg.hop_ms / 1000.0,
                     record_samples=cfg.plot is not None,
                     scrape_interval_s=None if cfg.scrape_ms is None else cfg.scrape_ms / 1000.0,
                     routers=routers, router_spread=cfg.router_spread, router_offset=cfg.router_offset,
                     admission=admission,
                     peer_interval_s=cfg.peer_ms / 1000.0,
                     rates=rate_config(cfg),
                     budgets=BudgetConfig() if admission is not None and cfg.admission_budgets else None,
                     replica_ids=cfg.replica_ids,
                     hide_max_tokens=cfg.hide_max_tokens, hide_max_tokens_share=cfg.hide_max_tokens_share,
                     max_tokens_cap=cfg.max_tokens_cap,
                     slowdowns=slowdowns(cfg.slow_replicas, len(fleet_profiles(cfg.profile, cfg.replicas))))


def simulate_once(profiles: Sequence[Profile], policy: str, reqs: Sequence[workload.SimRequest], sim_cfg: SimConfig,
                  seed: int, *, load: float | None, slo: tuple[float, float]) -> tuple[dict[str, Any], Any]:
    """One run: (summary, SimResult). Every router gets its own fresh policy instance."""
    t0 = time.perf_counter()
    sim_cfg = dataclasses.replace(sim_cfg, slo=SloTargets(ttft_s=slo[0], tpot_s=slo[1]))
    pols = [registry.create(policy) for _ in range(sim_cfg.routers)]
    sim = Simulation(profiles, pols, reqs, sim_cfg, seed=seed)
    result = sim.run()
    wall = time.perf_counter() - t0
    summary = results.summarize(result, policy=policy, load=load, slo_ttft_s=slo[0], slo_tpot_s=slo[1], wall_s=wall,
                                routers=sim_cfg.routers, seed=seed, admission=sim.admission,
                                **({"router_offset": sim_cfg.router_offset} if sim_cfg.router_offset else {}))
    log.info("run_done", policy=policy, load=load, routers=sim_cfg.routers, seed=seed, requests=len(reqs),
             wall_s=round(wall, 2), virtual_s=summary["makespan_s"])
    return summary, result


def _summary_only(args: tuple) -> dict[str, Any]:
    profiles, policy, reqs, sim_cfg, seed, load, slo = args
    return simulate_once(profiles, policy, reqs, sim_cfg, seed, load=load, slo=slo)[0]


def _search(args: tuple) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """One policy's SLO-capacity searches at one seed, router count by router count: [(row, runs)].

    The first count brackets from load 1.0 by factors of 1.3; each later count starts at the
    previous count's capacity with factors of 1.08 (router counts move capacity by a few percent,
    so this saves about two runs per search; a larger move only costs more bracketing steps)."""
    profiles, policy, base, cap, sim_cfgs, seed, slo, target, progress = args
    native = workload.native_rate(base)
    judged = sum(1 for r in base if servable(profiles, r.prompt_tokens, r.output_tokens))

    def stopping(sim_cfg: SimConfig) -> SimConfig:
        # A run stops once more than (1 - target) of the servable requests are known to miss:
        # the rate fails whatever the rest do. Passing runs always run to the end.
        return dataclasses.replace(sim_cfg, stop_after_misses=math.floor(judged * (1 - target) + 1e-9),
                                   stop_slo=slo)

    out = []
    start, grow = 1.0, 1.3
    for sim_cfg in sim_cfgs:
        runs: list[dict[str, Any]] = []

        def measure(x: float, sim_cfg: SimConfig = sim_cfg, runs: list = runs) -> float:
            reqs = workload.scale_arrivals(base, x * cap / native)
            summary = simulate_once(profiles, policy, reqs, stopping(sim_cfg), seed, load=round(x, 4), slo=slo)[0]
            runs.append(summary)
            return summary["slo_attainment"]

        found = saturation.search_capacity(measure, target, start=start, grow=grow)
        row = {"policy": policy, "routers": sim_cfg.routers, "seed": seed,
               "slo_capacity_rps": round(found.load * cap, 3), "load": round(found.load, 4),
               "attainment": round(found.attainment, 4), "runs": len(found.probes), "capped": found.capped}
        out.append((row, runs))
        if progress is not None:  # long benchmarks: what is done survives an interrupted run
            with open(progress, "a") as f:
                f.write(json.dumps(row) + "\n")
        if found.load > saturation.SEARCH_LO_LIMIT and not found.capped:
            start, grow = found.load, 1.08
    return out


def _pool_map(fn, tasks: list[tuple], jobs: int) -> list:
    if jobs <= 1 or len(tasks) <= 1:
        return [fn(t) for t in tasks]
    with ProcessPoolExecutor(max_workers=min(jobs, len(tasks))) as pool:
        return list(pool.map(fn, tasks))


def _seeds(cfg: SimulateConfig) -> list[int]:
    return [cfg.seed + i for i in range(cfg.seeds)]


def estimate_capacity(profiles: Sequence[Profile], reqs: Sequence[workload.SimRequest], seed: int = 0) -> dict:
    """Load 1.0 in requests/s (closed loop), with the former formula beside it."""
    fleet = saturation.fleet_saturation_rps(profiles, reqs, seed)
    return {"method": "closed_loop", "fleet_rps": round(fleet, 3),
            "littles_law_rps": round(fleet_capacity_rps(profiles, reqs), 3)}


def run_matrix(cfg: SimulateConfig, profiles: list[Profile], policies: list[str],
               base: list[workload.SimRequest], *, on_run=None, estimate: dict | None = None) -> list[dict[str, Any]]:
    """Every (load, router count, policy, seed) run; `on_run(summary, result)` after each (in process)."""
    if cfg.load and cfg.rate_scale is not None:
        raise ValueError("give --load or --rate-scale, not both")
    slo = _slos(cfg)
    native = workload.native_rate(base)
    cap = (estimate or estimate_capacity(profiles, base))["fleet_rps"]
    if cfg.load:
        plan = [(x, x * cap / native) for x in cfg.load]
    elif cfg.rate_scale is not None:
        plan = [(round(cfg.rate_scale * native / cap, 4), cfg.rate_scale)]
    else:
        plan = [(round(native / cap, 4), 1.0)]
    tasks = []
    for load_x, factor in plan:
        reqs = workload.cut(workload.scale_arrivals(base, factor), cfg.duration)
        if not reqs:
            raise ValueError(f"no request arrives within --duration {cfg.duration} s at load {load_x}")
        for n in cfg.routers:
            sim_cfg = _sim_config(cfg, n)
            for name in policies:
                for seed in _seeds(cfg):
                    tasks.append((profiles, name, reqs, sim_cfg, seed, load_x, slo))
    if on_run is None:
        return _pool_map(_summary_only, tasks, cfg.jobs)
    runs = []
    for profiles_, name, reqs, sim_cfg, seed, load_x, slo_ in tasks:
        summary, result = simulate_once(profiles_, name, reqs, sim_cfg, seed, load=load_x, slo=slo_)
        runs.append(summary)
        on_run(summary, result)
    return runs


def find_capacity(cfg: SimulateConfig, profiles: list[Profile], policies: list[str],
                  base: list[workload.SimRequest], *, estimate: dict | None = None
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(capacity rows, every run made): one row per (policy, router count), seeds aggregated."""
    if cfg.load or cfg.rate_scale is not None:
        raise ValueError("--find-capacity chooses the rates itself: leave out --load and --rate-scale")
    cap = (estimate or estimate_capacity(profiles, base))["fleet_rps"]
    if cfg.duration is not None:
        base = workload.cut(workload.scale_arrivals(base, cap / workload.native_rate(base)), cfg.duration)
        if len(base) < 2:
            raise ValueError(f"fewer than 2 requests arrive within --duration {cfg.duration} s at load 1.0")
    slo = _slos(cfg)
    sim_cfgs = [_sim_config(cfg, n) for n in cfg.routers]
    progress = None if cfg.json_path is None else str(cfg.json_path) + ".progress.jsonl"
    tasks = [(profiles, name, base, cap, sim_cfgs, seed, slo, cfg.attainment, progress)
             for name in policies for seed in _seeds(cfg)]
    found = [x for per_task in _pool_map(_search, tasks, cfg.jobs) for x in per_task]
    runs = [r for _, rs in found for r in rs]
    return aggregate_capacity([row for row, _ in found], cap), runs


def aggregate_capacity(rows: list[dict[str, Any]], cap: float) -> list[dict[str, Any]]:
    """One row per (policy, routers): the mean over seeds, with the spread when there are several."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["policy"], r["routers"]), []).append(r)
    out = []
    for (policy, routers), rs in groups.items():
        rates = [r["slo_capacity_rps"] for r in rs]
        mean = statistics.fmean(rates)
        row: dict[str, Any] = {
            "policy": policy, "routers": routers, "slo_capacity_rps": round(mean, 3),
            "load": round(mean / cap, 4) if cap > 0 else 0.0,
            "attainment": round(statistics.fmean(r["attainment"] for r in rs), 4),
            "capped": any(r["capped"] for r in rs), "seeds": [r["seed"] for r in rs],
        }
        if len(rs) > 1:
            row.update(slo_capacity_rps_min=min(rates), slo_capacity_rps_max=max(rates),
                       slo_capacity_rps_stdev=round(statistics.stdev(rates), 3))
        out.append(row)
    return out


RATES_CSV_HEADER = ("policy", "load", "routers", "seed", "delivered_s", "replica", "prefill_tokens_per_s",
                    "decode_step_base_ms", "decode_step_per_seq_ms")


def published_rates(summary: dict[str, Any], result: SimResult) -> list[tuple]:
    """--rates-csv's rows for one run: per routing table delivered to the routers (the
    publisher's change rule decides when), each replica's fitted figures as the routers read them."""
    key = (summary["policy"], summary["load"], summary["routers"], summary["seed"])
    return [(*key, round(d.delivered_s, 3), e.replica_id, e.prefill_tokens_per_s, e.decode_step_base_ms,
             e.decode_step_per_seq_ms) for d in result.deliveries for e in d.entries]


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, SimulateConfig, skip={"json_path", "profile", "policy"})
    parser.add_argument("--json", dest="json_path", type=Path, default=argparse.SUPPRESS, metavar="PATH",
                        help="Write {'runs': [...]} to this file.")
    parser.add_argument("--profile", dest="profile", action="append", default=argparse.SUPPRESS, metavar="NAME[:COUNT]",
                        help=SimulateConfig.model_fields["profile"].description)
    parser.add_argument("--policy", dest="policy", action="append", default=argparse.SUPPRESS, metavar="NAME",
                        help=(SimulateConfig.model_fields["policy"].description or "") + " Valid: "
                        + ", ".join(registry.names()) + ".")


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load(SimulateConfig, "simulate", args, args.config)
    except ConfigError as exc:
        print(f"tidegate simulate: {exc}", file=sys.stderr)
        return 2
    logs.configure(cfg.log_level, cfg.log_json, process="simulate")
    try:
        profiles = fleet_profiles(cfg.profile, cfg.replicas)
        slowdowns(cfg.slow_replicas, len(profiles))  # a bad spec fails here, before any run
        if cfg.replica_ids and len(cfg.replica_ids) != len(profiles):
            raise ValueError(f"--replica-ids names {len(cfg.replica_ids)} replicas, the fleet has {len(profiles)}")
        policies = policy_names(cfg.policy)
        plotter = None
        if cfg.plot is not None:
            from tidegate.fleetsim import plot

            plotter = plot.Plotter(cfg.plot)  # raises PlotUnavailableError without matplotlib
        if plotter is not None and (cfg.jobs > 1 or cfg.find_capacity):
            raise ValueError("--plot draws a --load sweep in this process: leave out --jobs and --find-capacity")
        if cfg.rates_csv is not None and (cfg.jobs > 1 or cfg.find_capacity):
            raise ValueError("--rates-csv reads each run in this process: leave out --jobs and --find-capacity")
        rate_rows: list[tuple] = []

        def on_run(summary: dict[str, Any], result: SimResult) -> None:
            if plotter is not None:
                plotter.add(summary, result)
            if cfg.rates_csv is not None:
                rate_rows.extend(published_rates(summary, result))
        base = base_requests(cfg)
        estimate = estimate_capacity(profiles, base)
        log.info("capacity_estimate", **estimate)
        out: dict[str, Any] = {"capacity_estimate": estimate}
        if cfg.find_capacity:
            out["capacity"], runs = find_capacity(cfg, profiles, policies, base, estimate=estimate)
        else:
            runs = run_matrix(cfg, profiles, policies, base, estimate=estimate,
                              on_run=(on_run if plotter is not None or cfg.rates_csv is not None else None))
    except (ValueError, ProfileError, TraceError, registry.UnknownPolicyError) as exc:
        print(f"tidegate simulate: {exc}", file=sys.stderr)
        return 2
    print(results.render(runs))
    if "capacity" in out:
        print()
        print(results.render_capacity(out["capacity"]))
    if cfg.json_path is not None:
        cfg.json_path.parent.mkdir(parents=True, exist_ok=True)
        cfg.json_path.write_text(json.dumps({"runs": runs, **out}, indent=2) + "\n")
    if cfg.rates_csv is not None:
        cfg.rates_csv.parent.mkdir(parents=True, exist_ok=True)
        with cfg.rates_csv.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(RATES_CSV_HEADER)
            w.writerows(rate_rows)
        print(f"wrote {cfg.rates_csv}")
    if plotter is not None:
        for path in plotter.finish():
            print(f"wrote {path}")
    return 0
