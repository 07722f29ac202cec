"""`tidegate simulate`: a whole fleet on a virtual clock, one run per policy and load.

Each run replays the same requests through fresh replicas, agents, control plane and router
(fleetsim.sim), prints one table line and, with --json, writes {"runs": [...]} (fleetsim.results).

Load: `--load X[,Y...]` scales arrivals to X times the fleet's estimated capacity
(tidegate.fleet.capacity, Little's law on each profile and the workload's mean lengths, summed
over the replicas); `--rate-scale X` compresses the trace's own arrival times X-fold instead;
neither: the trace's own rate (synthetic: `--rate`). `--duration S` keeps the requests arriving
in the first S seconds after scaling; every kept request then runs to completion.

SLO units: `--slo-ttft` and `--slo-tpot` take a unit suffix, `s` or `ms` ("2s", "2000ms",
"100ms", "0.1s"); a bare number is seconds for --slo-ttft and milliseconds for --slo-tpot.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog
from pydantic import Field, field_validator

from fleetsim import results, workload
from fleetsim.sim import SimConfig, Simulation
from simulator.profiles import Profile, ProfileError, get_profile
from tidegate import logs
from tidegate.config import ConfigBase, ConfigError, add_flags, load
from tidegate.fleet import capacity
from tidegate.fleet.traces import TraceError
from tidegate.policy import registry

log = structlog.get_logger(__name__)

DEFAULT_PROFILE = "llama3-8b-h100"


def _split(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    items = v.split(",") if isinstance(v, str) else [x for item in v for x in str(item).split(",")]
    return tuple(x.strip() for x in items if x.strip())


class SimulateConfig(ConfigBase):
    trace: Path | None = Field(None, description="Trace file: Azure CSV, Mooncake JSONL, or generic CSV/JSONL "
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
    scrape_ms: float | None = Field(None, gt=0, description="Let the router poll every engine's queue and KV "
                                                           "itself every N ms (llm-d's EPP: 50); policies reading "
                                                           "them then see these instead of the table's.")
    json_path: Path | None = Field(None, description="Write {'runs': [...]} to this file.")
    plot: Path | None = Field(None, description="Write PNG plots to this directory (needs matplotlib: "
                                                "pip install 'tidegate[plot]').")

    @field_validator("load", mode="before")
    @classmethod
    def _loads(cls, v: Any) -> tuple[float, ...]:
        return tuple(float(x) for x in _split(v))

    @field_validator("profile", "policy", mode="before")
    @classmethod
    def _names(cls, v: Any) -> tuple[str, ...]:
        return _split(v)

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


def policy_names(specs: Sequence[str]) -> list[str]:
    names = list(specs) or ["tidegate"]
    if "all" in names:
        return registry.names()
    for n in names:
        registry.create(n)  # raises UnknownPolicyError listing the valid names
    return names


def fleet_capacity_rps(profiles: Sequence[Profile], reqs: Sequence[workload.SimRequest]) -> float:
    trace = workload.as_trace(reqs)
    groups: dict[str, tuple[Profile, int]] = {}
    for p in profiles:
        groups[p.name] = (p, groups.get(p.name, (p, 0))[1] + 1)
    return sum(capacity.estimate(p, trace, n).fleet_rps for p, n in groups.values())


def base_requests(cfg: SimulateConfig) -> list[workload.SimRequest]:
    if cfg.trace is not None:
        return workload.load(cfg.trace)
    spec = workload.SyntheticSpec(arrivals=cfg.workload, rate_rps=cfg.rate, requests=cfg.requests,
                                  burstiness=cfg.burstiness, lengths=cfg.lengths, prompt_mean=cfg.prompt_mean,
                                  output_mean=cfg.output_mean)
    return workload.synthetic(spec, cfg.seed)


def run_matrix(cfg: SimulateConfig, profiles: list[Profile], policies: list[str],
               base: list[workload.SimRequest], *, on_run=None) -> list[dict[str, Any]]:
    """Every (load, policy) run; `on_run(summary, result)` after each."""
    if cfg.load and cfg.rate_scale is not None:
        raise ValueError("give --load or --rate-scale, not both")
    slo_ttft, slo_tpot = parse_duration(cfg.slo_ttft, "s"), parse_duration(cfg.slo_tpot, "ms")
    native = workload.native_rate(base)
    cap = fleet_capacity_rps(profiles, base)
    if cfg.load:
        plan = [(x, x * cap / native) for x in cfg.load]
    elif cfg.rate_scale is not None:
        plan = [(round(cfg.rate_scale * native / cap, 4), cfg.rate_scale)]
    else:
        plan = [(round(native / cap, 4), 1.0)]
    sim_cfg = SimConfig(report_interval_s=cfg.report_interval_s, tick_s=cfg.tick_s,
                        propagation_s=cfg.propagation_ms / 1000.0, hop_s=cfg.hop_ms / 1000.0,
                        record_samples=cfg.plot is not None,
                        scrape_interval_s=None if cfg.scrape_ms is None else cfg.scrape_ms / 1000.0)
    runs = []
    for load_x, factor in plan:
        reqs = workload.cut(workload.scale_arrivals(base, factor), cfg.duration)
        if not reqs:
            raise ValueError(f"no request arrives within --duration {cfg.duration} s at load {load_x}")
        offered = workload.native_rate(reqs)
        for name in policies:
            t0 = time.perf_counter()
            result = Simulation(profiles, registry.create(name), reqs, sim_cfg, seed=cfg.seed).run()
            wall = time.perf_counter() - t0
            summary = results.summarize(result, policy=name, load=load_x, slo_ttft_s=slo_ttft, slo_tpot_s=slo_tpot,
                                        offered_rps=offered, wall_s=wall)
            log.info("run_done", policy=name, load=load_x, requests=len(reqs), wall_s=round(wall, 2),
                     virtual_s=summary["makespan_s"])
            runs.append(summary)
            if on_run is not None:
                on_run(summary, result)
    return runs


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, SimulateConfig, skip={"json_path", "profile", "policy"})
    parser.add_argument("--json", dest="json_path", type=Path, default=argparse.SUPPRESS, metavar="PATH",
                        help="Write {'runs': [...]} to this file.")
    parser.add_argument("--profile", dest="profile", action="append", default=argparse.SUPPRESS, metavar="NAME[:COUNT]",
                        help=SimulateConfig.model_fields["profile"].description)
    parser.add_argument("--policy", dest="policy", action="append", default=argparse.SUPPRESS, metavar="NAME",
                        help=SimulateConfig.model_fields["policy"].description + " Valid: "
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
        policies = policy_names(cfg.policy)
        plotter = None
        if cfg.plot is not None:
            from fleetsim import plot

            plotter = plot.Plotter(cfg.plot)  # raises PlotUnavailableError without matplotlib
        base = base_requests(cfg)
        runs = run_matrix(cfg, profiles, policies, base,
                          on_run=(plotter.add if plotter is not None else None))
    except (ValueError, ProfileError, TraceError, registry.UnknownPolicyError) as exc:
        print(f"tidegate simulate: {exc}", file=sys.stderr)
        return 2
    print(results.render(runs))
    if cfg.json_path is not None:
        cfg.json_path.parent.mkdir(parents=True, exist_ok=True)
        cfg.json_path.write_text(json.dumps({"runs": runs}, indent=2) + "\n")
    if plotter is not None:
        for path in plotter.finish():
            print(f"wrote {path}")
    return 0
