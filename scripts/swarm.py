#!/usr/bin/env python
"""Control-plane scale: N fake agents against one real control plane and a real etcd.

For each N in `--agents` (a fresh etcd and control plane per N) this script

1. starts an embedded etcd and `tidegate controlplane` (pinned with `taskset` to `--cp-cpu`),
   with a telemetry credentials file holding one identity, `swarm`, allowed `swarm-*`;
2. starts `--processes` swarm workers (this file, `worker` mode, pinned to `--swarm-cpu`), which
   open N telemetry streams between them (real gRPC, one channel per agent, as
   real agents have), ramping at `--ramp-per-s` streams per second. Each agent authenticates
   with the `swarm` token, sends a Hello (endpoint http://127.0.0.1:<port>, inside the default
   allowed networks) and then one Report per `--interval-s` with EngineStats whose load
   (running, waiting, KV use, latencies, work counters) drifts along a slow sine with noise, so
   weights and tables keep changing as in a busy fleet;
3. watches the routing-table keys in etcd (what a router watches) from this process, which does
   nothing else;
4. after every stream has its first Ack and `--settle-s` has passed, measures for `--duration-s`:
   - reports/s ingested: the control plane's `tidegate_cp_reports_received` counter, and the Acks
     the agents got;
   - CPU of the control plane, etcd and the swarm: utime + stime from /proc/<pid>/stat (all
     threads), as a share of one core;
   - the decision-loop tick (mean and max of `tidegate_cp_tick_seconds`) and table writes/s;
   - telemetry-to-router propagation: `--markers` agents flip, every `--marker-period-s`, between
     READY and DEGRADED (KV 99 % used, a state the drifting load never reaches); the time from
     writing the flipping report to this process seeing the pool's table in etcd carry the new
     state. P50/P95/P99/max over every flip sent in the window (a flip not seen within 5 s
     counts as missed).

    .venv/bin/python scripts/swarm.py --agents 250,500,1000,2000 --duration-s 30

prints one block per N, and with `--json` one JSON object per N (one line each).
Needs Linux (/proc, taskset; without taskset nothing is pinned and the output says so).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import os
import random
import resource
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import grpc.aio  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tidegate import keys  # noqa: E402
from tidegate.v1 import telemetry_pb2, telemetry_pb2_grpc  # noqa: E402

IDENTITY = "swarm"
PATTERN = "swarm-*"
TOKEN_ENV = "TIDEGATE_SWARM_TOKEN"
DEGRADED = "REPLICA_STATE_DEGRADED"
READY = "REPLICA_STATE_READY"
SEEN_WITHIN_S = 5.0
KV_CAPACITY = 200_000
CHANNEL_OPTIONS = (
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 0),
)
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def replica_id(i: int) -> str:
    return f"swarm-{i:05d}"


def pool_of(i: int, pool_size: int) -> str:
    return f"swarm-pool-{i // pool_size:03d}"


# ---------------------------------------------------------------- worker: the fake agents


@dataclass
class Load:
    """One replica's drifting load: a sine of period `period_s` and a random phase, plus noise."""

    phase: float
    period_s: float
    rng: random.Random

    def level(self, t: float) -> float:
        base = 0.5 + 0.35 * math.sin(2 * math.pi * t / self.period_s + self.phase)
        return min(0.95, max(0.05, base + self.rng.uniform(-0.08, 0.08)))


def engine_stats(load: float, interval_s: float, degraded: bool, rng: random.Random) -> telemetry_pb2.EngineStats:
    """Plausible vLLM-like numbers for a load in (0, 1). KV use stays below 90 % (READY) unless
    `degraded` (99 % used: DEGRADED by the weight policy's 95 % threshold)."""
    running = int(4 + 44 * load)
    waiting = max(0, int(24 * (load - 0.6)))
    usage = 0.99 if degraded else min(0.88, 0.1 + 0.8 * load)
    free = int(KV_CAPACITY * (1.0 - usage))
    ttft_p50 = 80 + 200 * load
    itl_p50 = 12 + 20 * load
    steps = interval_s / ((20 + 0.5 * running) / 1000.0)
    gen = steps * running
    prompt = 1800.0 * running * interval_s / 8
    done = max(1.0, running * interval_s / 8)
    return telemetry_pb2.EngineStats(
        healthy=True, num_requests_running=running, num_requests_waiting=waiting, kv_cache_usage=usage,
        num_gpu_blocks=KV_CAPACITY // 16, block_size=16, kv_capacity_tokens=KV_CAPACITY, kv_free_tokens=free,
        has_kv_capacity=True, window_s=interval_s,
        ttft=telemetry_pb2.LatencySummary(p50_ms=ttft_p50, p95_ms=ttft_p50 * 2.2, p99_ms=ttft_p50 * 3,
                                          count=done),
        itl=telemetry_pb2.LatencySummary(p50_ms=itl_p50, p95_ms=itl_p50 * 1.6, p99_ms=itl_p50 * 2.1, count=gen),
        e2e=telemetry_pb2.LatencySummary(p50_ms=4000, p95_ms=9000, p99_ms=12000, count=done),
        prompt_tokens_per_s=prompt / interval_s, generation_tokens_per_s=gen / interval_s,
        work=telemetry_pb2.EngineWork(
            interval_s=interval_s, steps=steps, step_tokens=gen + prompt, prompt_tokens=prompt,
            cached_prompt_tokens=prompt * rng.uniform(0.2, 0.4), generation_tokens=gen,
            itl_sum_s=gen * itl_p50 / 1000.0, itl_count=gen),
    )


@dataclass
class WorkerStats:
    streams_acked: set[int] = field(default_factory=set)
    acks: list[float] = field(default_factory=list)      # monotonic receive times
    errors: dict[str, int] = field(default_factory=dict)
    reconnects: int = 0
    flips: list[tuple[str, float, str]] = field(default_factory=list)  # (replica, sent at, state wanted)


class Agent:
    def __init__(self, i: int, spec: dict[str, Any], token: str, stats: WorkerStats) -> None:
        self.i = i
        self.rid = replica_id(i)
        self.spec = spec
        self.stats = stats
        self.rng = random.Random(i)
        self.load = Load(self.rng.uniform(0, 2 * math.pi), self.rng.uniform(30, 90), self.rng)
        self.marker = i in set(spec["markers"])
        self.metadata = (("authorization", f"Bearer {token}"),)
        self.hello = telemetry_pb2.Hello(
            replica_id=self.rid, pool=pool_of(i, spec["pool_size"]),
            endpoint=f"http://127.0.0.1:{20000 + i}", region="swarm", zone=f"swarm-{i % 3}",
            engine_kind="vllm", agent_version="swarm", protocol_version=1,
            capabilities=["histograms", "kv_capacity"], report_interval_ms=int(spec["interval_s"] * 1000))
        self.degraded = False
        self.next_flip = 0.0

    async def run(self, stop: asyncio.Event) -> None:
        interval = self.spec["interval_s"]
        channel = grpc.aio.insecure_channel(self.spec["address"], options=CHANNEL_OPTIONS)
        try:
            while not stop.is_set():
                try:
                    await self._stream(channel, stop, interval)
                except grpc.aio.AioRpcError as e:
                    key = e.code().name
                    self.stats.errors[key] = self.stats.errors.get(key, 0) + 1
                if stop.is_set():
                    break
                self.stats.reconnects += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.rng.uniform(0.2, 1.0))
        finally:
            await channel.close()

    async def _stream(self, channel: grpc.aio.Channel, stop: asyncio.Event, interval: float) -> None:
        call = telemetry_pb2_grpc.TelemetryStub(channel).Stream(metadata=self.metadata)
        reader = asyncio.create_task(self._read(call))
        try:
            await call.write(telemetry_pb2.AgentMessage(hello=self.hello))
            seq = 0
            # Spread the first reports over one interval, as agents started at different times are.
            await asyncio.sleep(self.rng.uniform(0, interval))
            start = time.monotonic()
            if self.marker and not self.next_flip:
                self.next_flip = start + self.rng.uniform(1.0, self.spec["marker_period_s"])
            while not stop.is_set() and not reader.done():
                seq += 1
                now = time.monotonic()
                flip = self.marker and now >= self.next_flip
                if flip:
                    self.degraded = not self.degraded
                    self.next_flip = now + self.spec["marker_period_s"] * self.rng.uniform(0.8, 1.2)
                report = telemetry_pb2.Report(
                    seq=seq, engine=engine_stats(self.load.level(now), interval, self.degraded, self.rng),
                    gpu_telemetry_available=False, gpu_telemetry_error="swarm: no GPU")
                sent = time.monotonic()
                await call.write(telemetry_pb2.AgentMessage(report=report))
                if flip:
                    self.stats.flips.append((self.rid, sent, DEGRADED if self.degraded else READY))
                # Fixed schedule (not sleep(interval) after the work), so a slow loop does not lower the rate.
                delay = start + seq * interval - time.monotonic()
                if delay > 0:
                    done, _ = await asyncio.wait([reader], timeout=delay)
                    if done:
                        break
            if reader.done():
                reader.result()  # raises the stream's error
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await reader
            call.cancel()

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                return
            if msg.WhichOneof("msg") == "ack":
                self.stats.acks.append(time.monotonic())
                self.stats.streams_acked.add(self.i)


async def worker_main(spec: dict[str, Any]) -> None:
    """Runs agents spec["first"]..spec["last"]-1 until stdin says `stop`, then prints a summary."""
    token = os.environ[TOKEN_ENV]
    stats = WorkerStats()
    stop = asyncio.Event()
    agents = [Agent(i, spec, token, stats) for i in range(spec["first"], spec["last"])]
    tasks = []
    ramp = spec["ramp_per_s"]
    ready_told = False

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    window = [0.0, 0.0]

    async def watch_stdin() -> None:
        line = (await reader.readline()).split()  # b"stop T0 T1": the measurement window
        if len(line) == 3:
            window[:] = [float(line[1]), float(line[2])]
        stop.set()

    stdin_task = asyncio.create_task(watch_stdin())
    started = time.monotonic()
    for n, agent in enumerate(agents):
        tasks.append(asyncio.create_task(agent.run(stop)))
        delay = started + (n + 1) / ramp - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
    while not stop.is_set():
        if not ready_told and len(stats.streams_acked) == len(agents):
            print(json.dumps({"event": "ready", "streams": len(agents)}), flush=True)
            ready_told = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)
    await asyncio.gather(*tasks, return_exceptions=True)
    stdin_task.cancel()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({
        "event": "done", "acks_in_window": sum(1 for a in stats.acks if window[0] <= a <= window[1]),
        "streams_acked": len(stats.streams_acked), "errors": stats.errors,
        "reconnects": stats.reconnects, "flips": stats.flips, "cpu_s": usage.ru_utime + usage.ru_stime,
    }), flush=True)


# ---------------------------------------------------------------- orchestrator


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of `pid`, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def cpu_wait_seconds(pid: int) -> float:
    """Time the threads of `pid` spent runnable but waiting for a CPU (/proc/<pid>/task/*/schedstat):
    how much a busy machine held the process back."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += int((task / "schedstat").read_text().split()[1])
    return total / 1e9


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, float]:
    """The control plane's metrics we need: counters and the tick histogram (sum, count)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {"tables": 0.0}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "tidegate_cp_reports_received_total":
                out["reports"] = s.value
            elif s.name == "tidegate_cp_tables_published_total":
                out["tables"] += s.value
            elif s.name == "tidegate_cp_tick_seconds_sum":
                out["tick_sum"] = s.value
            elif s.name == "tidegate_cp_tick_seconds_count":
                out["tick_count"] = s.value
            elif s.name == "tidegate_cp_leader":
                out["leader"] = s.value
            elif s.name == "tidegate_cp_streams_open":
                out["streams"] = s.value
            elif s.name == "tidegate_cp_tick_seconds_bucket" and s.labels.get("le") == "0.1":
                out["ticks_under_100ms"] = s.value
    return out


def pin(cpu: str | None) -> list[str]:
    return ["taskset", "-c", cpu] if cpu is not None and shutil.which("taskset") else []


def niced(nice: int | None) -> list[str]:
    """argv prefix that runs a command at niceness `nice` (absolute; `nice -n` is relative)."""
    return [] if nice is None else ["nice", "-n", str(nice - os.nice(0))]


def set_group_nice(pid: int, nice: int | None) -> None:
    """With autogroup scheduling (Linux's default for desktops and many servers) each session
    gets an equal share of a CPU whatever its processes' niceness, and every process here starts
    its own session: the session's group is niced too, or `nice` would change nothing."""
    if nice is not None:
        with contextlib.suppress(OSError):
            Path(f"/proc/{pid}/autogroup").write_text(str(nice))


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


class TableWatcher:
    """Watches every routing table in etcd and records, for the marker replicas, each change of
    state with the monotonic time this process received it."""

    def __init__(self, endpoint: str, markers: set[str]) -> None:
        from tidegate.store.etcd import EtcdStore

        self.store = EtcdStore([endpoint])
        self.markers = markers
        self.state: dict[str, str] = {}
        self.changes: dict[str, list[tuple[float, str]]] = {}
        self.events = 0
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.store.connect()
        listing = await self.store.list_prefix(keys.TABLES)
        self.task = asyncio.create_task(self._run(listing.revision + 1))

    async def _run(self, rev: int) -> None:
        async for batch in self.store.watch_prefix(keys.TABLES, rev):
            seen = time.monotonic()
            for ev in batch:
                if not ev.value:
                    continue
                self.events += 1
                # json.loads rather than the protobuf parser: this process must stay quick to
                # keep its own delay out of the figures. States are enum names in protobuf JSON.
                for e in json.loads(ev.value).get("replicas", ()):
                    rid = e.get("replicaId", "")
                    if rid in self.markers:
                        st = e.get("state", "")
                        if self.state.get(rid) != st:
                            self.state[rid] = st
                            self.changes.setdefault(rid, []).append((seen, st))

    def propagation(self, flips: list[tuple[str, float, str]]) -> tuple[list[float], int]:
        """Delay of each flip (first table change of its replica to the wanted state after it was
        sent), and the number of flips not seen within SEEN_WITHIN_S."""
        delays, missed = [], 0
        for rid, sent, want in flips:
            hit = next((t for t, st in self.changes.get(rid, ()) if t >= sent and st == want), None)
            if hit is None or hit - sent > SEEN_WITHIN_S:
                missed += 1
            else:
                delays.append(hit - sent)
        return delays, missed

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        await self.store.close()


async def read_json_line(stream: asyncio.StreamReader, what: str, timeout_s: float) -> dict[str, Any]:
    while True:
        line = await asyncio.wait_for(stream.readline(), timeout_s)
        if not line:
            raise RuntimeError(f"{what} exited before answering")
        with contextlib.suppress(json.JSONDecodeError):
            return dict(json.loads(line))


async def measure(n: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from tidegate.etcd_server import EmbeddedEtcd

    token = secrets.token_urlsafe(32)
    creds = workdir / "telemetry-credentials.csv"
    creds.write_text(f"# identity,sha256,patterns (scripts/swarm.py)\n"
                     f"{IDENTITY},{hashlib.sha256(token.encode()).hexdigest()},{PATTERN}\n")
    creds.chmod(0o600)
    rng = random.Random(n)
    markers = sorted(rng.sample(range(n), min(n, args.markers)))
    marker_ids = {replica_id(i) for i in markers}
    etcd = EmbeddedEtcd(log_path=workdir / f"etcd-{n}.log")
    etcd.start()
    procs: list[asyncio.subprocess.Process] = []
    watcher: TableWatcher | None = None
    try:
        if etcd.pid is not None and pin(args.etcd_cpu):
            await (await asyncio.create_subprocess_exec(
                "taskset", "-a", "-p", "-c", args.etcd_cpu, str(etcd.pid),
                stdout=asyncio.subprocess.DEVNULL)).wait()
        metrics_port = free_port()
        cp_log = (workdir / f"controlplane-{n}.log").open("wb")
        cp = await asyncio.create_subprocess_exec(
            *niced(args.cp_nice), *pin(args.cp_cpu), str(Path(sys.executable).with_name("tidegate")), "controlplane",
            "--etcd", etcd.endpoint, "--listen", "127.0.0.1:0", "--id", "swarm-cp",
            "--metrics-port", str(metrics_port), "--telemetry-credentials-file", str(creds), "--log-json",
            *args.cp_arg, stdout=asyncio.subprocess.PIPE, stderr=cp_log, start_new_session=True)
        procs.append(cp)
        set_group_nice(cp.pid, args.cp_nice)
        assert cp.stdout is not None
        port = (await read_json_line(cp.stdout, "the control plane", 30))["port"]
        deadline = time.monotonic() + 30
        while (await asyncio.to_thread(scrape, metrics_port)).get("leader") != 1:
            if time.monotonic() > deadline:
                raise RuntimeError("the control plane was not elected within 30 s")
            await asyncio.sleep(0.2)
        watcher = TableWatcher(etcd.endpoint, marker_ids)
        await watcher.start()

        per = math.ceil(n / args.processes)
        workers = []
        for w in range(args.processes):
            first, last = w * per, min(n, (w + 1) * per)
            if first >= last:
                break
            spec = {"address": f"127.0.0.1:{port}", "first": first, "last": last, "pool_size": args.pool_size,
                    "interval_s": args.interval_s, "ramp_per_s": args.ramp_per_s / args.processes,
                    "markers": [i for i in markers if first <= i < last], "marker_period_s": args.marker_period_s}
            proc = await asyncio.create_subprocess_exec(
                *niced(args.swarm_nice), *pin(args.swarm_cpu), sys.executable, str(Path(__file__).resolve()),
                "worker", json.dumps(spec),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                env={**os.environ, TOKEN_ENV: token}, start_new_session=True, limit=1 << 26)
            procs.append(proc)
            workers.append(proc)
            set_group_nice(proc.pid, args.swarm_nice)
        # Every stream acked, or give up waiting after the ramp and --ready-timeout-s: a control
        # plane that cannot take N agents is a result (streams_acked < agents), not an error.
        ready_by = time.monotonic() + n / args.ramp_per_s + args.ready_timeout_s
        for proc in workers:
            assert proc.stdout is not None
            with contextlib.suppress(TimeoutError):
                await read_json_line(proc.stdout, "a swarm worker", max(0.1, ready_by - time.monotonic()))
        await asyncio.sleep(args.settle_s)

        load_at_start = os.getloadavg()
        pids = {"controlplane": cp.pid, "etcd": etcd.pid or 0}
        cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
        wait0 = cpu_wait_seconds(cp.pid)
        swarm_cpu0 = sum(cpu_seconds(p.pid) for p in workers)
        m0 = await asyncio.to_thread(scrape, metrics_port)
        events0 = watcher.events
        t0 = time.monotonic()
        await asyncio.sleep(args.duration_s)
        t1 = time.monotonic()
        cpu1 = {k: cpu_seconds(p) for k, p in pids.items()}
        wait1 = cpu_wait_seconds(cp.pid)
        swarm_cpu1 = sum(cpu_seconds(p.pid) for p in workers)
        m1 = await asyncio.to_thread(scrape, metrics_port)
        events1 = watcher.events
        # Flips sent in the window get SEEN_WITHIN_S to show up before the watcher stops.
        await asyncio.sleep(min(SEEN_WITHIN_S, 1.0 + args.interval_s))

        summaries = []
        for proc in workers:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(f"stop {t0} {t1}\n".encode())
            await proc.stdin.drain()
            while True:
                msg = await read_json_line(proc.stdout, "a swarm worker", 30)
                if msg.get("event") == "done":
                    summaries.append(msg)
                    break
            await proc.wait()
        flips = [tuple(f) for s in summaries for f in s["flips"] if t0 <= f[1] <= t1]
        delays, missed = watcher.propagation(flips)  # type: ignore[arg-type]
        span = t1 - t0
        ticks = m1.get("tick_count", 0) - m0.get("tick_count", 0)
        errors: dict[str, int] = {}
        for s in summaries:
            for k, v in s["errors"].items():
                errors[k] = errors.get(k, 0) + v
        return {
            "agents": n, "pools": math.ceil(n / args.pool_size), "pool_size": args.pool_size,
            "window_s": round(span, 2), "load_avg_1m": round(load_at_start[0], 2),
            "pinned": bool(pin(args.cp_cpu)), "cp_cpu": args.cp_cpu, "swarm_cpu": args.swarm_cpu,
            "cp_nice": args.cp_nice, "swarm_nice": args.swarm_nice, "etcd_cpu": args.etcd_cpu,
            "streams_acked": sum(s["streams_acked"] for s in summaries),
            "reports_per_s": round((m1.get("reports", 0) - m0.get("reports", 0)) / span, 1),
            "acks_per_s": round(sum(s["acks_in_window"] for s in summaries) / span, 1),
            "cp_cpu_pct": round(100 * (cpu1["controlplane"] - cpu0["controlplane"]) / span, 1),
            "cp_wait_pct": round(100 * (wait1 - wait0) / span, 1),
            "etcd_cpu_pct": round(100 * (cpu1["etcd"] - cpu0["etcd"]) / span, 1),
            "swarm_cpu_pct": round(100 * (swarm_cpu1 - swarm_cpu0) / span, 1),
            "ticks_per_s": round(ticks / span, 2),
            "tick_mean_ms": round(1000 * (m1.get("tick_sum", 0) - m0.get("tick_sum", 0)) / ticks, 2) if ticks else None,
            "tables_per_s": round((m1["tables"] - m0["tables"]) / span, 1),
            "table_events_seen_per_s": round((events1 - events0) / span, 1),
            "flips": len(flips), "flips_missed": missed,
            "propagation_ms": {q: round(1000 * percentile(delays, p), 1) if delays else None
                               for q, p in (("p50", 50), ("p95", 95), ("p99", 99), ("max", 100))},
            "errors": errors, "reconnects": sum(s["reconnects"] for s in summaries),
        }
    finally:
        if watcher is not None:
            await watcher.close()
        for proc in reversed(procs):
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), 10)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
        etcd.stop()


def render(r: dict[str, Any]) -> str:
    p = r["propagation_ms"]
    return (
        f"agents {r['agents']} in {r['pools']} pools of {r['pool_size']}, window {r['window_s']} s, "
        f"load average {r['load_avg_1m']}, pinned {r['pinned']} (cp cpu {r['cp_cpu']} nice {r['cp_nice']}, "
        f"swarm cpu {r['swarm_cpu']}, etcd cpu {r['etcd_cpu']})\n"
        f"  streams acked {r['streams_acked']}/{r['agents']}, reports/s {r['reports_per_s']} "
        f"(acks/s {r['acks_per_s']}), reconnects {r['reconnects']}, errors {r['errors']}\n"
        f"  CPU: control plane {r['cp_cpu_pct']}% of a core (runnable but waiting {r['cp_wait_pct']}%), "
        f"etcd {r['etcd_cpu_pct']}%, swarm {r['swarm_cpu_pct']}%\n"
        f"  ticks/s {r['ticks_per_s']} (mean {r['tick_mean_ms']} ms), tables written/s {r['tables_per_s']}\n"
        f"  propagation over {r['flips']} flips ({r['flips_missed']} missed): P50 {p['p50']} ms, "
        f"P95 {p['p95']} ms, P99 {p['p99']} ms, max {p['max']} ms"
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", default="250,500,1000,2000",
                    help="comma-separated agent counts; each gets a fresh etcd and control plane")
    ap.add_argument("--pool-size", type=int, default=50, help="replicas per pool (pools = agents / this)")
    ap.add_argument("--interval-s", type=float, default=1.0, help="report interval of every agent, seconds")
    ap.add_argument("--duration-s", type=float, default=30.0, help="length of the measurement window, seconds")
    ap.add_argument("--settle-s", type=float, default=5.0,
                    help="wait after every stream got its first Ack before measuring, seconds")
    ap.add_argument("--ramp-per-s", type=float, default=400.0, help="new streams per second while ramping up")
    ap.add_argument("--processes", type=int, default=2, help="swarm worker processes sharing the agents")
    ap.add_argument("--markers", type=int, default=50,
                    help="agents that flip READY/DEGRADED to measure propagation")
    ap.add_argument("--marker-period-s", type=float, default=4.0, help="seconds between a marker agent's flips")
    ap.add_argument("--cp-cpu", default="0", help="CPU the control plane is pinned to (taskset -c); '' = none")
    ap.add_argument("--swarm-cpu", default="1",
                    help="CPU the swarm workers are pinned to (taskset -c); '' = none")
    ap.add_argument("--etcd-cpu", default="",
                    help="CPU etcd is pinned to (taskset -c); '' = none (the default: in production etcd has "
                    "machines of its own)")
    ap.add_argument("--cp-nice", type=int, default=None,
                    help="niceness of the control plane and of its autogroup (negative, as root, to shield it "
                    "from other load on a shared machine; default: inherited)")
    ap.add_argument("--swarm-nice", type=int, default=None,
                    help="niceness of the swarm workers and of their autogroups (default: inherited)")
    ap.add_argument("--ready-timeout-s", type=float, default=60.0,
                    help="after the ramp, how long to wait for every stream's first Ack before measuring anyway")
    ap.add_argument("--cp-arg", action="append", default=[],
                    help="extra control-plane argument (repeat; e.g. --cp-arg=--tick-s=0.2)")
    ap.add_argument("--workdir", default="", help="where logs and credentials go (default: a temporary folder)")
    ap.add_argument("--json", action="store_true", help="print one JSON object per agent count")
    args = ap.parse_args(argv)
    args.cp_cpu = args.cp_cpu or None
    args.swarm_cpu = args.swarm_cpu or None
    args.etcd_cpu = args.etcd_cpu or None
    return args


async def amain(args: argparse.Namespace) -> int:
    counts = [int(x) for x in args.agents.split(",") if x.strip()]
    # SIGTERM cancels the run, so every `finally` stops the processes it started.
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # workers inherit it: one socket per agent
    with tempfile.TemporaryDirectory(prefix="tidegate-swarm-") as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for n in counts:
            result = await measure(n, args, workdir)
            print(json.dumps(result) if args.json else render(result), flush=True)
    return 0


def main(argv: list[str]) -> int:
    import structlog

    # Library logs (etcd start/stop, the watch) go to stderr: stdout carries the figures.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    if argv[:1] == ["worker"]:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(worker_main(json.loads(argv[1])))
        return 0
    return asyncio.run(amain(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
