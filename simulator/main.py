"""`tidegate sim`: run one simulated vLLM replica (OpenAI HTTP API + vLLM /metrics).

The default profile is ``llama3-8b-h100``: a faithful stand-in for the most common replica
(28,000 KV blocks, measured-calibrated step times), so that `tidegate sim` alone behaves like
`vllm serve` of Llama-3.1-8B on one H100. Demos on a laptop that want to show KV pressure at a
few dozen concurrent requests pass ``--profile tiny-h100``; router-overhead benchmarks pass
``--profile instant``.

With ``--port 0`` the OS picks a free port, and one JSON line ``{"event": "listening", "port": N}``
is printed on stdout so that a parent process can find it.

Simulated NVML (GET /sim/gpu) and fault injection (POST /sim/faults) are documented in
simulator.server and simulator.faults; ``--gpu-count`` sets how many simulated GPUs the replica
has. A ``{"crash": true}`` fault ends the process at once with status ``CRASH_EXIT_CODE``.

``tidegate sim calibrate [--profile NAME] [--json]`` prints the cost model's step times next to the
packaged reference measurements (simulator.calibrate) and exits 1 when a point is off by more than
its tolerance.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import uuid

import structlog
from aiohttp import web
from pydantic import Field, field_validator

from tidegate import logs
from tidegate.config import ConfigBase, ConfigError, add_flags, load
from tidegate.simulator import calibrate
from tidegate.simulator.engine import Engine
from tidegate.simulator.faults import SimulatedGpus, layout_for
from tidegate.simulator.metrics import FLAVORS
from tidegate.simulator.profiles import Profile, ProfileError, get_profile, profile_names
from tidegate.simulator.server import create_app

log = structlog.get_logger(__name__)

DEFAULT_PROFILE = "llama3-8b-h100"
CRASH_EXIT_CODE = 70  # EX_SOFTWARE: what a {"crash": true} fault exits with


class SimConfig(ConfigBase):
    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8000, ge=0, lt=65536, description="Port to listen on; 0 picks a free port and prints it.")
    model: str | None = Field(None, description="Served model name (default: the profile's model).")
    profile: str = Field(DEFAULT_PROFILE, description="Simulated GPU/model profile (see simulator/profiles).")
    metrics_flavor: str = Field("vllm", description="Names of /metrics: vllm (V1), vllm-v0 or sglang.")
    seed: int = Field(0, description="Seed of the simulator's random generator.")
    max_num_seqs: int | None = Field(None, gt=0, description="Override the profile's max_num_seqs.")
    max_num_batched_tokens: int | None = Field(None, gt=0,
                                               description="Override the profile's max_num_batched_tokens.")
    num_gpu_blocks: int | None = Field(None, gt=0, description="Override the profile's KV cache size, in blocks.")
    max_model_len: int | None = Field(None, gt=0, description="Override the profile's max_model_len.")
    fail_health: bool = Field(False, description="Answer GET /health with 503 (an unhealthy replica).")
    api_key: str = Field("", description="Require 'Authorization: Bearer KEY' on the /v1 routes, as vLLM's "
                                         "--api-key does (401 otherwise); /health, /metrics and /sim stay open.")
    speedup: float = Field(1.0, gt=0, description="Divide every step time by this factor (fast tests).")
    gpu_count: int | None = Field(
        None, gt=0, le=64,
        description="Simulated GPUs of the replica in GET /sim/gpu (default: the profile's tensor-parallel "
                    "degree, 1 unless its name has tpN).",
    )

    @field_validator("metrics_flavor")
    @classmethod
    def _flavor(cls, v: str) -> str:
        if v not in FLAVORS:
            raise ValueError(f"must be one of {', '.join(FLAVORS)}")
        return v


def build_profile(cfg: SimConfig) -> Profile:
    base = get_profile(cfg.profile)
    return base.with_overrides(max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
                               num_gpu_blocks=cfg.num_gpu_blocks, max_model_len=cfg.max_model_len)


CONFIG_CLASS = SimConfig


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, SimConfig)
    parser.epilog = "profiles: " + ", ".join(profile_names())
    # Optional, so that `tidegate sim --port 0 ...` (no sub-subcommand) still serves.
    sub = parser.add_subparsers(dest="sim_command", metavar="{calibrate}", required=False)
    cal = sub.add_parser("calibrate", help="Compare the profiles' step times with reference measurements.",
                         description="Print the cost model's step times next to the packaged reference "
                                     "measurements and the relative error; exit 1 when a point is off by "
                                     "more than its tolerance.")
    cal.add_argument("--profile", dest="calibrate_profile", default=None, metavar="NAME",
                     help="Check one profile (default: every profile with reference data).")
    cal.add_argument("--json", dest="calibrate_json", action="store_true", help="Print JSON instead of a table.")


async def serve(cfg: SimConfig, profile: Profile) -> None:
    model = cfg.model or profile.model
    engine = Engine(profile, random.Random(cfg.seed), keep_results=False)
    layout = layout_for(profile, cfg.gpu_count)
    # Random, not seeded: replicas started with the same seed must still have distinct GPUs.
    gpus = SimulatedGpus(layout, ["GPU-" + str(uuid.uuid4()) for _ in range(layout.gpu_count)])
    app = create_app(engine, model, metrics_flavor=cfg.metrics_flavor, speedup=cfg.speedup,
                     fail_health=cfg.fail_health, gpus=gpus, on_crash=_crash, api_key=cfg.api_key or None)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port)
    await site.start()
    port = cfg.port
    # aiohttp exposes bound sockets only through the asyncio server
    sockets = getattr(site._server, "sockets", None)
    if sockets:
        port = sockets[0].getsockname()[1]
    log.info("sim_listening", host=cfg.host, port=port, model=model, profile=profile.name,
             num_gpu_blocks=profile.num_gpu_blocks, metrics_flavor=cfg.metrics_flavor, speedup=cfg.speedup,
             simulated_gpus=layout.gpu_count, gpu_name=layout.name)
    if cfg.port == 0:
        print(json.dumps({"event": "listening", "port": port}), flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
        log.info("sim_stopping")
        await runner.cleanup()


def _crash() -> None:
    """A {"crash": true} fault: die now, without cleanup, like an engine process that fails."""
    log.error("sim_crash_injected", exit_code=CRASH_EXIT_CODE)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(CRASH_EXIT_CODE)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "sim_command", None) == "calibrate":
        return calibrate.run_cli(args.calibrate_profile, args.calibrate_json)
    try:
        cfg = load(SimConfig, "sim", args, getattr(args, "config", None))
        logs.configure(cfg.log_level, cfg.log_json, process="sim")
        profile = build_profile(cfg)
    except (ConfigError, ProfileError) as exc:
        print(f"tidegate sim: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve(cfg, profile))
    return 0
