"""`tidegate demo`: `up`, replay a real trace through the router, print a report, shut down.

The offered rate is `--load` times the fleet's estimated capacity
(tidegate.fleet.capacity: Little's law on the simulator profile and the
trace's mean lengths), reached by compressing the trace's own arrival times;
`--rate-scale` sets the compression directly instead. Per-replica figures
come from the simulated engines' own /metrics, polled while the replay runs.

`--compare round_robin,...` replays the same requests at the same times
through each policy in turn, on the same fleet (etcd, control plane, engines
and agents stay up): the fleet's `--policy` (tidegate) first, then the others.
Between runs the demo waits until every engine is idle (nothing running or
waiting, so no run inherits another's queue or KV use), then replaces the
router by a fresh one started with the next `--policy` (a router's policy
state, such as in-flight accounting or a round-robin cursor, starts empty),
waits until it routes to every replica and for `--settle-s` so the routing
table shows idle replicas. What does carry over is what describes the
hardware, not the load: the control plane's fitted engine rates. The agents'
30 s latency windows may still hold the previous run's tail; of the
registered policies only tidegate reads them, and it runs first. The
control plane's latency-outlier ejection (TTFT p95 > 3x the pool median) is
off in the demo (`--outlier-latency-factor 0`): measured at load 1.0, it
ejected a replica that was merely the busiest for 30 s, so the other three
took its load and every policy's TTFT collapsed; and the next run started with
the previous run's tail in those windows and ejected another. Ejection on
errors and GPU faults stays on.
One router restarted, rather than one router per policy started at once,
because live routers share the pool's admission budget.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import structlog
from pydantic import Field, field_validator

from tidegate import logs
from tidegate.config import ConfigError, add_flags, load
from tidegate.engine_metrics import TelemetryParseError, parse_metrics
from tidegate.fleet import capacity, loadgen, report, traces, ttft_chart
from tidegate.fleet import endpoints as endpoints_file
from tidegate.fleet.procs import ChildStartError, tidegate_argv
from tidegate.fleet.up import Fleet, UpConfig, _Stop, install_stop_signals
from tidegate.fleetsim.workload import parse_class_mix  # the simulator's --class-mix, so both read one syntax
from tidegate.policy import registry
from tidegate.simulator.profiles import ProfileError, get_profile

log = structlog.get_logger(__name__)


class DemoConfig(UpConfig):
    trace: Path | None = Field(None, description="Trace to replay: Azure LLM inference CSV or Mooncake JSONL "
                                                 "(default: the shipped Azure conversation sample).")
    duration: float = Field(60.0, gt=0, description="Seconds of arrivals to replay (then in-flight requests finish).")
    load: float = Field(0.8, gt=0, le=3.0, description="Offered load as a fraction of the fleet's estimated capacity.")
    rate_scale: float | None = Field(None, gt=0, description="Compress the trace's arrival times by this factor "
                                                             "(overrides --load).")
    slo_ttft_ms: float = Field(2000.0, gt=0, description="TTFT SLO for the attainment figure, milliseconds.")
    slo_tpot_ms: float = Field(100.0, gt=0, description="TPOT SLO for the attainment figure, milliseconds.")
    json_path: Path | None = Field(None, description="Also write the report as JSON to this file.")
    outlier_latency_factor: float | None = Field(
        0.0, ge=0, description="The control plane's --outlier-latency-factor. Off (0) in the demo: near capacity "
        "it ejects replicas that are busy, not broken, and its 30 s latency windows would carry one run's tail "
        "into the next (see the module doc).")
    pool_slo: bool = Field(False, description="Before replaying, set the pool's SLO to --slo-ttft-ms/--slo-tpot-ms "
                           "(`tidegate pool set-slo`, as an operator would), so the router's admission "
                           "(--admission) has deadlines to hold and reject by.")
    class_mix: str | None = Field(None, description="Give requests priority classes (seeded, the same in every "
                                  "run), e.g. critical=0.2,standard=0.5,sheddable=0.3; sent as x-tidegate-priority "
                                  "(the router trusts it) and reported per class.")
    compare: str | None = Field(None, description="Replay the same trace at the same load through these policies "
                                "too (comma-separated registered names, e.g. round_robin), one after the other on "
                                "the same fleet after --policy (tidegate), and print them side by side.")
    plot: Path | None = Field(None, description="Write a chart of TTFT over time per policy into this directory "
                                                "(PNG with matplotlib installed, else self-contained HTML).")
    settle_s: float = Field(3.0, ge=0, description="With --compare: pause, seconds, between runs once the engines "
                                                   "are idle and the next router routes, so tables show idle "
                                                   "replicas.")

    @field_validator("class_mix")
    @classmethod
    def _class_mix(cls, v: str | None) -> str | None:
        if v is not None:
            parse_class_mix(v)
        return v

    @field_validator("compare")
    @classmethod
    def _known_policies(cls, v: str | None) -> str | None:
        if v is None:
            return v
        names = [n.strip() for n in v.split(",") if n.strip()]
        if not names:
            raise ValueError("name at least one policy")
        for name in names:
            registry.create(name)  # UnknownPolicyError (a ValueError) lists the valid names
        return ",".join(names)

    def policies(self) -> list[str]:
        """--policy first, then each --compare policy once."""
        out = [self.policy]
        for name in (self.compare or "").split(","):
            if name and name not in out:
                out.append(name)
        return out


CONFIG_CLASS = DemoConfig


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, DemoConfig, skip={"json_path"})
    parser.add_argument("--json", dest="json_path", type=Path, default=argparse.SUPPRESS, metavar="PATH",
                        help="Also write the report as JSON to this file.")


def repeat_to(trace: list[traces.TraceRequest], span_s: float) -> list[traces.TraceRequest]:
    """The trace, repeated back to back until it covers `span_s` seconds of arrivals."""
    if not trace:
        return trace
    period = trace[-1].arrival_s + (trace[-1].arrival_s / max(1, len(trace) - 1))
    out: list[traces.TraceRequest] = []
    offset = 0.0
    while True:
        for r in trace:
            t = r.arrival_s + offset
            if t > span_s:
                return out
            out.append(traces.TraceRequest(t, r.prompt_tokens, r.output_tokens, r.prefix_hashes))
        offset += period


class ReplicaWatcher:
    """Polls every simulated engine's /metrics for peak KV use and queue, and final counters."""

    def __init__(self, replicas: list[dict[str, Any]], model: str) -> None:
        self.replicas = replicas
        self.model = model
        self.peak_kv = {r["id"]: 0.0 for r in replicas}
        self.peak_waiting = {r["id"]: 0 for r in replicas}
        self.last: dict[str, Any] = {}
        self.base: dict[str, Any] = {}  # counters before the run (an earlier run's are not this one's)

    async def poll_once(self, session: aiohttp.ClientSession) -> None:
        for r in self.replicas:
            try:
                async with session.get(r["engine_url"] + "/metrics", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    sample = parse_metrics(await resp.text(), self.model)
            except (TimeoutError, aiohttp.ClientError, TelemetryParseError):
                continue
            self.last[r["id"]] = sample
            self.peak_kv[r["id"]] = max(self.peak_kv[r["id"]], sample.kv_usage or 0.0)
            self.peak_waiting[r["id"]] = max(self.peak_waiting[r["id"]], sample.waiting)

    async def start(self) -> None:
        async with aiohttp.ClientSession() as session:
            await self.poll_once(session)
        self.base = dict(self.last)
        self.peak_kv = dict.fromkeys(self.peak_kv, 0.0)
        self.peak_waiting = dict.fromkeys(self.peak_waiting, 0)

    def idle(self) -> bool:
        return len(self.last) == len(self.replicas) and all(
            s.running == 0 and s.waiting == 0 for s in self.last.values())

    async def run(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession() as session:
            while not stop.is_set():
                await self.poll_once(session)
                try:
                    await asyncio.wait_for(stop.wait(), 0.5)
                except TimeoutError:
                    pass
            await self.poll_once(session)

    def rows(self) -> list[dict[str, Any]]:
        def counters(s: Any) -> tuple[int, int, int, int]:
            if s is None:
                return 0, 0, 0, 0
            return (int(s.e2e[-1][1]) if s.e2e else 0, int(s.prompt_tokens_total or 0),
                    int(s.generation_tokens_total or 0), int(s.preemptions_total or 0))

        rows = []
        for r in self.replicas:
            now, before = counters(self.last.get(r["id"])), counters(self.base.get(r["id"]))
            requests, prompt, generated, preempted = (a - b for a, b in zip(now, before, strict=True))
            rows.append({
                "id": r["id"],
                "requests": requests,
                "prompt_tokens": prompt,
                "generation_tokens": generated,
                "preemptions": preempted,
                "peak_kv_usage": round(self.peak_kv[r["id"]], 4),
                "peak_waiting": self.peak_waiting[r["id"]],
            })
        return rows


def draw_classes(mix_text: str | None, n: int, seed: int = 0) -> list[str] | None:
    """Request i's class, drawn from the mix with a fixed seed: every policy gets the same ones."""
    if mix_text is None:
        return None
    mix = parse_class_mix(mix_text)
    return random.Random(f"demo-classes/{seed}").choices(list(mix), list(mix.values()), k=n)


async def _replay(cfg: DemoConfig, info: dict[str, Any], trace: list[traces.TraceRequest],
                  time_scale: float) -> tuple[list[report.RequestResult], int, float, list[dict[str, Any]]]:
    watcher = ReplicaWatcher(info["replicas"], cfg.model)
    await watcher.start()
    stop = asyncio.Event()
    poller = asyncio.create_task(watcher.run(stop))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        results, sent = await loadgen.replay(info["router_url"], cfg.model, trace, time_scale=time_scale,
                                             duration_s=cfg.duration,
                                             on_tick=loadgen.progress_printer(cfg.duration),
                                             classes=draw_classes(cfg.class_mix, len(trace)))
    finally:
        elapsed = loop.time() - t0
        stop.set()
        await poller
    if sys.stderr.isatty():
        print(file=sys.stderr)
    return results, sent, elapsed, watcher.rows()


def set_pool_slo(cfg: DemoConfig, endpoints: Path, router_url: str, timeout_s: float = 30.0) -> None:
    """`tidegate pool set-slo` through the admin API, then wait until the router's table carries it."""
    argv = tidegate_argv("pool", "set-slo", cfg.model, "--ttft", f"{cfg.slo_ttft_ms:g}ms", "--tpot",
                         f"{cfg.slo_tpot_ms:g}ms", "--endpoints-file", str(endpoints))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise ChildStartError(f"tidegate pool set-slo failed: {done.stderr.strip() or done.stdout.strip()}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(router_url + "/health", timeout=2) as resp:
                if json.loads(resp.read()).get("pools", {}).get(cfg.model, {}).get("slo"):
                    return
        except (OSError, ValueError):  # URLError is an OSError; a busy router answers next time
            pass
        time.sleep(0.2)
    raise ChildStartError(f"the router did not get the pool's SLO within {timeout_s:.0f}s")


async def wait_idle(replicas: list[dict[str, Any]], model: str, timeout_s: float = 60.0) -> bool:
    """Until no engine runs or queues anything (an aborted request may outlive its client briefly)."""
    watcher = ReplicaWatcher(replicas, model)
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            await watcher.poll_once(session)
            if watcher.idle():
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.2)


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load(DemoConfig, "demo", args, args.config)
    except ConfigError as exc:
        print(f"tidegate demo: {exc}", file=sys.stderr)
        return 2
    logs.configure(cfg.log_level, cfg.log_json, process="demo")
    try:
        base = traces.load(cfg.trace or traces.shipped_sample())
        profile = get_profile(cfg.profile)
    except (traces.TraceError, ProfileError) as exc:
        print(f"tidegate demo: {exc}", file=sys.stderr)
        return 2
    est = capacity.estimate(profile, base, cfg.replicas)
    natural_rps = len(base) / max(base[-1].arrival_s, 1e-9)
    if cfg.rate_scale is not None:
        time_scale = cfg.rate_scale
        basis = f"trace arrivals x{time_scale:g}; estimated capacity {est.fleet_rps:.1f} req/s"
    else:
        time_scale = cfg.load * est.fleet_rps / natural_rps
        basis = (f"load {cfg.load:g} x estimated capacity {est.fleet_rps:.1f} req/s "
                 f"({cfg.replicas} x {profile.name}); trace arrivals x{time_scale:.2f}")
    trace = repeat_to(base, cfg.duration * time_scale)
    offered = natural_rps * time_scale
    print(f"replaying {cfg.trace or 'the shipped Azure conversation sample'} at {offered:.1f} req/s for "
          f"{cfg.duration:g} s ({basis})", flush=True)

    path = cfg.endpoints_file or endpoints_file.default_path()
    policies = cfg.policies()
    if cfg.class_mix is not None:
        cfg = cfg.model_copy(update={"trust_priority_header": True})  # else the router reads every one as standard
    install_stop_signals()
    fleet = Fleet(cfg)
    runs: list[tuple[dict[str, Any], list[report.RequestResult]]] = []
    try:
        info = fleet.start()
        endpoints_file.write(path, info)
        print(f"fleet ready: router {info['router_url']}, {cfg.replicas} simulated replicas", flush=True)
        if cfg.pool_slo:
            set_pool_slo(cfg, path, info["router_url"])
        for i, policy in enumerate(policies):
            if i > 0:
                if not asyncio.run(wait_idle(info["replicas"], cfg.model)):
                    print("tidegate demo: engines still busy after 60 s; comparing anyway", file=sys.stderr)
                info["router_url"] = fleet.restart_router(policy)
                endpoints_file.write(path, fleet.info)
                time.sleep(cfg.settle_s)
            if len(policies) > 1:
                print(f"[{i + 1}/{len(policies)}] policy {policy}", flush=True)
            results, sent, elapsed, rows = asyncio.run(_replay(cfg, info, trace, time_scale))
            rep = report.build(results, sent=sent, duration_s=elapsed, slo_ttft_ms=cfg.slo_ttft_ms,
                               slo_tpot_ms=cfg.slo_tpot_ms, replicas=rows, rate_rps=offered, rate_basis=basis,
                               window_s=cfg.duration)
            runs.append(({"policy": policy, **rep}, results))
    except ChildStartError as exc:
        print(f"tidegate demo: {exc}", file=sys.stderr)
        return 1
    except _Stop:
        print("tidegate demo: interrupted", file=sys.stderr)
        return 130
    finally:
        fleet.stop()
        if path.exists():
            path.unlink(missing_ok=True)
    reps = [r for r, _ in runs]
    out = dict(reps[0])
    if len(reps) > 1:
        print(f"\noffered load   {offered:.1f} req/s for {cfg.duration:g} s ({basis}), per policy", flush=True)
        print(report.render_compare(reps), flush=True)
        out["compare"] = reps
    else:
        print(report.render(out), flush=True)
    if cfg.plot is not None:
        chart = ttft_chart.write(cfg.plot, {r["policy"]: ttft_chart.ttft_points(res) for r, res in runs},
                                 cfg.slo_ttft_ms, f"TTFT over time at {offered:.1f} req/s, {cfg.replicas} x "
                                 f"{profile.name} (simulated)")
        out["plot"] = str(chart)
        print(f"\nchart written to {chart}", flush=True)
    if cfg.json_path is not None:
        cfg.json_path.write_text(json.dumps(out, indent=2) + "\n")
        print(f"\nreport written to {cfg.json_path}", flush=True)
    return 0 if all(report.errors_count(r) == 0 for r in reps) else 1
