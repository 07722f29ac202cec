"""`tidegate up`: a complete fleet on this machine.

etcd (embedded unless --etcd is given) -> control plane(s) -> N simulated
replicas, each with its agent sidecar -> one router. Prints the endpoints,
writes them to the endpoints file, runs until Ctrl-C/SIGTERM, then stops every
process it started, in reverse order (no orphans, even when one crashed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import signal
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import FrameType
from typing import Any

import structlog
from pydantic import Field, field_validator

from tidegate import logs
from tidegate.config import ConfigBase, EtcdFields, add_flags, load
from tidegate.fleet import endpoints as endpoints_file
from tidegate.fleet.procs import Child, ChildStartError, stop_all, tidegate_argv
from tidegate.policy import registry
from tidegate.simulator.profiles import get_profile

log = structlog.get_logger(__name__)

DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


class UpConfig(ConfigBase, EtcdFields):
    replicas: int = Field(4, ge=1, le=64, description="Number of simulated replicas (each with its agent).")
    controlplanes: int = Field(1, ge=1, le=5, description="Control-plane instances (one leads, the rest stand by).")
    model: str = Field(DEFAULT_MODEL, min_length=1, description="Model name the simulated replicas serve (the pool).")
    profile: str = Field("tiny-h100", min_length=1,
                         description="Simulator GPU/model profile (see `tidegate sim --help`).")
    endpoints_file: Path | None = Field(
        None, description="Where to write the endpoints JSON (default: $TIDEGATE_HOME/endpoints.json "
                          "or ~/.local/state/tidegate/endpoints.json).")
    run_dir: Path | None = Field(None, description="Directory for child logs (default: a new temporary directory).")
    router_port: int = Field(0, ge=0, le=65535, description="Router HTTP port (0 = any free port).")
    region: str = Field("local", description="Region label of every process.")
    report_interval_s: float = Field(1.0, gt=0, description="Agent report interval, seconds.")
    ready_timeout_s: float = Field(60.0, gt=0, description="How long to wait for the fleet to become routable.")
    trust_priority_header: bool = Field(False, description="The router reads each request's priority class from "
                                        "its x-tidegate-priority header (`tidegate router --trust-priority-header`).")
    admission: bool = Field(False, description="The router holds requests in per-class queues and rejects with 429 "
                                               "what cannot meet its deadline (`tidegate router --admission`).")
    admission_queue: str | None = Field(None, description="The router's --admission-queue (requests held per class).")
    admission_max_wait: str | None = Field(None, description="The router's --admission-max-wait (longest hold per "
                                                             "class).")
    simulated_gpu: bool = Field(False, description="Agents read simulated NVML readings from their simulator "
                                "(`--gpu-source sim`), so GPU faults can be injected through POST /sim/faults.")
    policy: str = Field("tidegate", min_length=1, description="The router's routing policy, by name "
                        "(`tidegate router --policy`; the registered names are in its help).")
    outlier_latency_factor: float | None = Field(
        None, ge=0, description="The control planes' --outlier-latency-factor (TTFT p95 over this many times the "
        "pool median ejects a replica; 0 = off; default: the control plane's own).")
    metrics: bool = Field(False, description="Give every control plane and agent a Prometheus /metrics port (free "
                          "ports, listed under `metrics` in the endpoints file with the router's) so a local "
                          "Prometheus can scrape the whole fleet (deploy/prometheus/alerts.yml).")

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, v: str) -> str:
        get_profile(v)  # ProfileError (a ValueError) lists the valid names
        return v

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        registry.create(v)  # UnknownPolicyError (a ValueError) lists the valid names
        return v


def free_port() -> int:
    """A loopback port free now (a child binds it a moment later: fine on a development machine)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


OPERATOR_NAME = "local-operator"
VIEWER_NAME = "local-viewer"


def _write_secret(path: Path, text: str) -> None:
    """Create or replace `path` readable by its owner only (0600 from the start: no window in which
    another user could read it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def write_tokens(run_dir: Path) -> tuple[dict[str, str], Path]:
    """Fresh operator and viewer tokens for a local fleet: `operator.token`, `viewer.token` and the
    control planes' `auth-tokens.csv` (`token,name,role` lines), all mode 0600 in `run_dir`.
    Returns ({"operator": path, "viewer": path}, tokens file)."""
    operator, viewer = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    _write_secret(run_dir / "operator.token", operator + "\n")
    _write_secret(run_dir / "viewer.token", viewer + "\n")
    csv = run_dir / "auth-tokens.csv"
    _write_secret(csv, "# token,name,role (written by `tidegate up`)\n"
                       f"{operator},{OPERATOR_NAME},operator\n{viewer},{VIEWER_NAME},viewer\n")
    return {"operator": str(run_dir / "operator.token"), "viewer": str(run_dir / "viewer.token")}, csv


def write_agent_credentials(run_dir: Path, replica_ids: list[str]) -> tuple[dict[str, str], Path]:
    """A fresh telemetry token per agent, each bound to its one replica id: `agent-tokens/<id>.token`
    (mode 0600, in a 0700 directory) and the control planes' `telemetry-credentials.csv`, which holds
    only the tokens' SHA-256. Returns ({replica id: token path}, credentials file)."""
    folder = run_dir / "agent-tokens"
    folder.mkdir(mode=0o700, exist_ok=True)
    folder.chmod(0o700)
    paths: dict[str, str] = {}
    lines = ["# identity,sha256,replica-id patterns (written by `tidegate up`)"]
    for rid in replica_ids:
        token = secrets.token_urlsafe(32)
        path = folder / f"{rid}.token"
        _write_secret(path, token + "\n")
        paths[rid] = str(path)
        lines.append(f"agent-{rid},{hashlib.sha256(token.encode()).hexdigest()},{rid}")
    creds = run_dir / "telemetry-credentials.csv"
    _write_secret(creds, "\n".join(lines) + "\n")
    return paths, creds


class Fleet:
    """Starts and stops the processes of a local fleet. Synchronous on purpose: it only
    supervises; the children do the work."""

    def __init__(self, cfg: UpConfig) -> None:
        self.cfg = cfg
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if cfg.run_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="tidegate-up-")
            self.run_dir = Path(self._tmp.name)
        else:
            self.run_dir = cfg.run_dir
            self.run_dir.mkdir(parents=True, exist_ok=True)
        self.children: list[Child] = []
        self.etcd: Any = None
        self.etcd_endpoints: tuple[str, ...] = cfg.etcd
        self.info: dict[str, Any] = {}
        self._etcd_access: list[str] = []
        self._reported: set[str] = set()
        self._seats = get_profile(cfg.profile).max_num_seqs   # read once: every agent gets it

    # ------------------------------------------------------------------ start
    def _child(self, name: str, *args: str) -> Child:
        child = Child(name=name, argv=tidegate_argv(*args), run_dir=self.run_dir)
        child.start()
        self.children.append(child)
        return child

    def _router_flags(self) -> list[str]:
        cfg = self.cfg
        out = ["--policy", cfg.policy]
        if cfg.trust_priority_header:
            out.append("--trust-priority-header")
        if cfg.admission:
            out.append("--admission")
        if cfg.admission_queue is not None:
            out += ["--admission-queue", cfg.admission_queue]
        if cfg.admission_max_wait is not None:
            out += ["--admission-max-wait", cfg.admission_max_wait]
        return out

    def _agent_flags(self) -> list[str]:
        # vLLM does not export max_num_seqs, so an operator passes it to the agent (the admission
        # budget counts the engine's seats); here the simulated engines run their profile's.
        return ["--engine-max-num-seqs", str(self._seats)]

    def _controlplane_flags(self) -> list[str]:
        factor = self.cfg.outlier_latency_factor
        return [] if factor is None else ["--outlier-latency-factor", f"{factor:g}"]

    def _common(self) -> list[str]:
        lvl = self.cfg.log_level
        return ["--log-level", lvl, "--log-json"]

    def start(self) -> dict[str, Any]:
        cfg = self.cfg
        if not self.etcd_endpoints:
            from tidegate.etcd_server import EmbeddedEtcd

            self.etcd = EmbeddedEtcd(data_dir=self.run_dir / "etcd-data", log_path=self.run_dir / "etcd.log")
            self.etcd.start()
            self.etcd_endpoints = (self.etcd.endpoint,)
            log.info("etcd_started", endpoint=self.etcd.endpoint, embedded=True)
        etcd = ",".join(self.etcd_endpoints)
        # An external etcd may need TLS and credentials; the embedded one listens on loopback only.
        etcd_access = ["--etcd", etcd, *(cfg.etcd_security_argv() if self.etcd is None else [])]

        tokens, tokens_file = write_tokens(self.run_dir)
        rids = [f"replica-{i}" for i in range(cfg.replicas)]
        agent_tokens, credentials = write_agent_credentials(self.run_dir, rids)
        auth = ["--auth-tokens-file", str(tokens_file), "--telemetry-credentials-file", str(credentials),
                "--telemetry-allowed-networks", "127.0.0.0/8"]
        gpu = ["--gpu-source", "sim"] if cfg.simulated_gpu else []

        metrics: dict[str, str] = {}

        def metrics_port(name: str) -> list[str]:
            if not cfg.metrics:
                return []
            port = free_port()
            metrics[name] = f"127.0.0.1:{port}"
            return ["--metrics-port", str(port)]

        cps = []
        for i in range(cfg.controlplanes):
            cps.append(self._child(
                f"controlplane-{i}", "controlplane", *etcd_access, "--listen", "127.0.0.1:0",
                "--id", f"cp-{i}", *auth, *metrics_port(f"controlplane-{i}"), *self._controlplane_flags(),
                *self._common()))
        cp_addrs = [f"127.0.0.1:{c.wait_port()}" for c in cps]

        sims = []
        for i in range(cfg.replicas):
            sims.append(self._child(
                f"sim-{i}", "sim", "--port", "0", "--model", cfg.model, "--profile", cfg.profile,
                "--seed", str(i), *self._common()))
        replicas = []
        for i, sim in enumerate(sims):
            url = f"http://127.0.0.1:{sim.wait_port()}"
            rid = rids[i]
            agent = self._child(
                f"agent-{i}", "agent", "--engine-url", url, "--replica-id", rid, "--model", cfg.model,
                "--region", cfg.region, "--zone", f"{cfg.region}-{'abc'[i % 3]}",
                "--controlplane", ",".join(cp_addrs), "--report-interval-s", str(cfg.report_interval_s),
                "--engine-kind", "tidegate-sim", "--telemetry-token-file", agent_tokens[rid], *gpu,
                *self._agent_flags(), *metrics_port(f"agent-{i}"), *self._common())
            replicas.append({"id": rid, "model": cfg.model, "engine_url": url,
                             "sim_pid": sim.pid, "agent_pid": agent.pid})

        self._etcd_access = etcd_access
        router_url = self._start_router()
        if cfg.metrics:
            metrics["router"] = router_url.removeprefix("http://")

        self.info = {
            "router_url": router_url,
            "controlplane": cp_addrs[0],
            "controlplanes": cp_addrs,
            "etcd": etcd,
            "etcd_embedded": self.etcd is not None,
            "model": cfg.model,
            "profile": cfg.profile,
            "replicas": replicas,
            "run_dir": str(self.run_dir),
            "launcher_pid": os.getpid(),
            "pids": {c.name: c.pid for c in self.children},
            "started_at": time.time(),
            "tokens": tokens,
            "telemetry_credentials": str(credentials),
            "simulated_gpu": cfg.simulated_gpu,
        }
        if metrics:
            self.info["metrics"] = metrics  # host:port of each process's /metrics
        if self.etcd is not None:
            self.info["pids"]["etcd"] = self.etcd.pid
        self._wait_routable(router_url)
        return self.info

    def _start_router(self, name: str = "router", router_id: str = "router-0", port: int | None = None) -> str:
        router = self._child(
            name, "router", *self._etcd_access, "--port", str(self.cfg.router_port if port is None else port),
            "--region", self.cfg.region, "--router-id", router_id, *self._router_flags(), *self._common())
        return f"http://127.0.0.1:{router.wait_port()}"

    def child(self, name: str) -> Child:
        """The process named `name` ("controlplane-0", "agent-1", "router", ...); KeyError if none."""
        for c in self.children:
            if c.name == name:
                return c
        raise KeyError(f"no child process named {name!r} (have {[c.name for c in self.children]})")

    def add_router(self, router_id: str) -> str:
        """Starts one more router on the started fleet (same etcd, policy and admission flags as the
        first, an ephemeral port), named `router_id` in `children` and `info["pids"]`; returns its URL
        once it listens (it serves as soon as it has read the tables)."""
        if not self.info:
            raise RuntimeError("add_router: start the fleet first")
        url = self._start_router(router_id, router_id, 0)
        self.info["pids"][router_id] = self.children[-1].pid
        return url

    def restart_router(self, policy: str) -> str:
        """Replace the router by a fresh one running `policy` (same id, so it takes over the old
        one's presence key and admission share); returns its URL once every replica is routable."""
        old = self.child("router")
        old.stop()
        self.children.remove(old)
        self.cfg = self.cfg.model_copy(update={"policy": policy})
        url = self._start_router()
        self.info["router_url"] = url
        self.info["pids"]["router"] = self.children[-1].pid
        if "metrics" in self.info:
            self.info["metrics"]["router"] = url.removeprefix("http://")
        self._wait_routable(url)
        return url

    def _wait_routable(self, router_url: str) -> None:
        """Ready when the router holds a table in which every replica is routable (weight > 0):
        listing the model is not enough, as replicas join with weight 0 until their first report."""
        deadline = time.monotonic() + self.cfg.ready_timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            self.check()
            try:
                with urllib.request.urlopen(router_url + "/health", timeout=2) as resp:
                    body = json.loads(resp.read())
                pool = body.get("pools", {}).get(self.cfg.model, {})
                if pool.get("routable", 0) >= self.cfg.replicas:
                    log.info("fleet_ready", router=router_url)
                    return
                last = f"{pool.get('routable', 0)} of {self.cfg.replicas} replicas routable"
            except (urllib.error.URLError, OSError, ValueError) as exc:
                last = str(exc)
            time.sleep(0.25)
        raise ChildStartError(f"fleet not routable within {self.cfg.ready_timeout_s:.0f}s ({last}); "
                              f"logs in {self.run_dir}")

    # ---------------------------------------------------------------- running
    def check(self) -> list[str]:
        """Names of children that have exited; each is logged once."""
        dead = []
        for child in self.children:
            if not child.alive():
                dead.append(child.name)
                if child.name not in self._reported:
                    self._reported.add(child.name)
                    log.warning("child_exited", child=child.name, code=child.returncode(),
                                log=str(child.log_path))
        return dead

    def stop(self) -> None:
        stop_all(self.children)
        if self.etcd is not None:
            self.etcd.stop()
            self.etcd = None
        log.info("fleet_stopped", processes=len(self.children))

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._tmp is not None and exc[0] is None:
            self._tmp.cleanup()


class _Stop(Exception):
    pass


def install_stop_signals() -> None:
    """SIGTERM and SIGINT both end the run through the same path."""
    def handler(signum: int, frame: FrameType | None) -> None:
        raise _Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


CONFIG_CLASS = UpConfig


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, UpConfig)


def print_endpoints(info: dict[str, Any], path: Path) -> None:
    print(f"router        {info['router_url']}", flush=True)
    print(f"control plane {', '.join(info['controlplanes'])}", flush=True)
    print(f"etcd          {info['etcd']}{' (embedded)' if info['etcd_embedded'] else ''}", flush=True)
    print(f"replicas      {len(info['replicas'])} x {info['model']} (simulated, profile {info['profile']})",
          flush=True)
    print(f"endpoints     {path}", flush=True)
    tokens = info.get("tokens") or {}
    if tokens:
        print(f"admin tokens  operator {tokens.get('operator')}, viewer {tokens.get('viewer')} "
              "(the CLI finds them through the endpoints file)", flush=True)
    if info.get("metrics"):
        print(f"metrics       {', '.join(f'{k} {v}' for k, v in sorted(info['metrics'].items()))}", flush=True)
    print(f"logs          {info['run_dir']}", flush=True)


def run(args: argparse.Namespace) -> int:
    cfg = load(UpConfig, "up", args, args.config)
    logs.configure(cfg.log_level, cfg.log_json, process="up")
    path = cfg.endpoints_file or endpoints_file.default_path()
    install_stop_signals()
    fleet = Fleet(cfg)
    try:
        info = fleet.start()
        endpoints_file.write(path, info)
        print_endpoints(info, path)
        print("fleet is up; Ctrl-C to stop", flush=True)
        while True:
            fleet.check()
            time.sleep(0.5)
    except _Stop as sig:
        log.info("stopping", signal=str(sig))
        return 0
    except ChildStartError as exc:
        print(f"tidegate up: {exc}", file=sys.stderr)
        return 1
    finally:
        fleet.stop()
        try:
            if path.exists() and endpoints_file.read(path).get("launcher_pid") == os.getpid():
                path.unlink()
        except (OSError, ValueError):
            pass
