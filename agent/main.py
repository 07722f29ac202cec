"""`tidegate agent`: the sidecar of one engine replica (composition root)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import structlog
from prometheus_client import start_http_server
from pydantic import Field, field_validator

import tidegate.config
import tidegate.logs
from tidegate.agent.collector import Collector
from tidegate.agent.metrics import AgentMetrics
from tidegate.agent.nvml import NvmlReader
from tidegate.agent.simgpu import SimulatedGpuReader
from tidegate.agent.stream import HelloInfo, StreamClient
from tidegate.config import ConfigBase, ConfigError, parse_endpoints
from tidegate.engine_metrics import DIALECTS

log = structlog.get_logger(__name__)

SECTION = "agent"
GPU_SOURCES = ("nvml", "sim")
TOKEN_ENV = "TIDEGATE_TELEMETRY_TOKEN"


class AgentConfig(ConfigBase):
    engine_url: str = Field(
        "", validate_default=True,
        description="(required) Engine base URL to scrape, e.g. http://127.0.0.1:8000.",
    )
    replica_id: str = Field("", validate_default=True, description="(required) Unique id of this replica.")
    model: str = Field("", validate_default=True, description="(required) Model served: the pool name.")
    advertise_url: str = Field(
        "", description="URL routers should use for this engine (default: engine_url)."
    )
    region: str = Field("local", description="Region of the replica.")
    zone: str = Field("local-a", description="Zone of the replica.")
    gpu_indices: tuple[int, ...] = Field(
        (), description="GPU indices of the replica, comma-separated (default: every visible GPU)."
    )
    controlplane: tuple[str, ...] = Field(
        (), validate_default=True,
        description="(required) Control-plane addresses, comma-separated host:port; tried in order.",
    )
    telemetry_token_file: str = Field(
        "", description=f"File holding this agent's telemetry token (sent as 'authorization: Bearer' "
        f"metadata; the control plane binds it to replica ids). Else the token comes from ${TOKEN_ENV}.")
    report_interval_s: float = Field(1.0, gt=0, description="Seconds between reports.")
    scrape_timeout_s: float = Field(2.0, gt=0, description="Timeout of each engine poll and GPU read, seconds.")
    latency_window_s: float = Field(
        30.0, gt=0, description="Window of the TTFT/ITL/E2E percentiles, seconds."
    )
    engine_kind: str = Field("vllm", description="Engine kind: vllm, sglang, tgi, tidegate-sim.")
    metrics_dialect: str = Field(
        "auto", description="Metric names to read from the engine's /metrics: auto (detected from the "
                            "prefixes vllm:, sglang:, tgi_), vllm, sglang or tgi.")
    metrics_port: int = Field(0, ge=0, lt=65536, description="Port of the agent's own /metrics (0 = off).")
    engine_max_num_seqs: int = Field(
        0, ge=0, le=1_000_000,
        description="The engine's limit on sequences running at once (vLLM --max-num-seqs; SGLang "
                    "--max-running-requests). vLLM does not export it, so say it here; the control plane "
                    "then bounds the sequences the pool's admission budget lets in to what the seats and "
                    "the engine's own queue serve within the TTFT target. 0 = the engine's page (SGLang), "
                    "else unknown (no bound).")
    rate_prior: tuple[float, ...] = Field(
        (), description="Optional seed of the control plane's rate fit, from a known profile: "
                        "PREFILL_TOKENS_PER_S,DECODE_STEP_BASE_MS,DECODE_STEP_PER_SEQ_MS (all > 0). Without it "
                        "the fit starts from a generic prior; either way the engine's counters take over.")
    gpu_source: str = Field(
        "nvml",
        description="Where GPU telemetry comes from: nvml (the real driver) or sim (the Tidegate simulator's "
                    "labelled simulated-NVML endpoint, engine_url/sim/gpu; reports carry simulated_gpu=true).",
    )

    @field_validator("rate_prior", mode="before")
    @classmethod
    def _rate_prior_list(cls, v: Any) -> Any:
        if isinstance(v, str):
            return tuple(float(x) for x in v.split(",") if x.strip())
        return v

    @field_validator("rate_prior")
    @classmethod
    def _rate_prior(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if v and (len(v) != 3 or not all(x > 0 and math.isfinite(x) for x in v)):
            raise ValueError("needs three positive numbers: prefill tokens/s, step base ms, step ms per sequence")
        return v

    @field_validator("gpu_source")
    @classmethod
    def _gpu_source(cls, v: str) -> str:
        if v not in GPU_SOURCES:
            raise ValueError(f"must be one of {', '.join(GPU_SOURCES)}")
        return v

    @field_validator("metrics_dialect")
    @classmethod
    def _metrics_dialect(cls, v: str) -> str:
        if v != "auto" and v not in DIALECTS:
            raise ValueError(f"must be one of auto, {', '.join(DIALECTS)}")
        return v

    @field_validator("engine_url", "replica_id", "model")
    @classmethod
    def _required(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("is required")
        return v.strip()

    @field_validator("engine_url", "advertise_url")
    @classmethod
    def _url(cls, v: str) -> str:
        if v and not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v.rstrip("/")

    @field_validator("controlplane", mode="before")
    @classmethod
    def _endpoints(cls, v: Any) -> tuple[str, ...]:
        out = parse_endpoints(v)
        if not out:
            raise ValueError("is required (comma-separated host:port)")
        return out

    @field_validator("gpu_indices", mode="before")
    @classmethod
    def _indices(cls, v: Any) -> Any:
        if isinstance(v, str):
            return tuple(int(x) for x in v.split(",") if x.strip())
        if isinstance(v, int):
            return (v,)
        return v

    @property
    def endpoint(self) -> str:
        return self.advertise_url or self.engine_url


CONFIG_CLASS = AgentConfig


def configure_parser(parser: argparse.ArgumentParser) -> None:
    tidegate.config.add_flags(parser, AgentConfig)


def load_config(args: argparse.Namespace) -> AgentConfig:
    return tidegate.config.load(AgentConfig, SECTION, args, getattr(args, "config", None))


def load_token(cfg: AgentConfig, environ: Mapping[str, str]) -> str | None:
    """The telemetry token: --telemetry-token-file, else $TIDEGATE_TELEMETRY_TOKEN, else None.
    Raises ConfigError (which never quotes the token) when the file is unreadable or empty."""
    if cfg.telemetry_token_file:
        try:
            token = Path(cfg.telemetry_token_file).read_text(encoding="utf-8").strip()
        except OSError as e:
            raise ConfigError(f"agent.telemetry_token_file: cannot read {cfg.telemetry_token_file}: "
                              f"{e.strerror or e}") from None
        if not token or any(c.isspace() for c in token):
            raise ConfigError(f"agent.telemetry_token_file: {cfg.telemetry_token_file} must hold one token "
                              "(no spaces)")
        return token
    return environ.get(TOKEN_ENV, "").strip() or None


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args)
        token = load_token(cfg, os.environ)
    except ConfigError as exc:
        print(f"tidegate agent: {exc}", file=sys.stderr)
        return 2
    tidegate.logs.configure(cfg.log_level, cfg.log_json, process="agent")
    if token is None:
        log.warning("telemetry_token_unset", hint=f"no --telemetry-token-file or ${TOKEN_ENV}: a control plane "
                    "that authenticates agents refuses this agent's stream")
    return asyncio.run(serve(cfg, token=token))


async def serve(cfg: AgentConfig, stop: asyncio.Event | None = None, *, token: str | None = None) -> int:
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)

    metrics = AgentMetrics()
    http_server = None
    if cfg.metrics_port:
        http_server, _ = start_http_server(cfg.metrics_port, registry=metrics.registry)
    nvml = NvmlReader() if cfg.gpu_source == "nvml" else None
    log.info(
        "agent_starting", replica_id=cfg.replica_id, model=cfg.model, engine_url=cfg.engine_url,
        controlplane=list(cfg.controlplane), gpu_source=cfg.gpu_source,
    )
    try:
        async with aiohttp.ClientSession() as session:
            gpu_reader = nvml or SimulatedGpuReader(cfg.engine_url, session, timeout_s=cfg.scrape_timeout_s)
            collector = Collector(
                cfg.engine_url, session, model=cfg.model, gpu_reader=gpu_reader, gpu_indices=cfg.gpu_indices,
                scrape_timeout_s=cfg.scrape_timeout_s, window_s=cfg.latency_window_s, metrics=metrics,
                dialect=cfg.metrics_dialect, max_num_seqs=cfg.engine_max_num_seqs,
            )
            hello = HelloInfo(
                replica_id=cfg.replica_id, pool=cfg.model, endpoint=cfg.endpoint, region=cfg.region,
                zone=cfg.zone, gpu_indices=cfg.gpu_indices, engine_kind=cfg.engine_kind,
                capabilities=("nvml" if nvml else "sim-gpu", "histograms", "kv_capacity"),
                rate_prior=cfg.rate_prior,
            )
            client = StreamClient(
                cfg.controlplane, hello, collector, report_interval_s=cfg.report_interval_s,
                rng=random.Random().random, metrics=metrics, token=token,
            )
            await client.run(stop)
    finally:
        if nvml is not None and not await asyncio.to_thread(nvml.close):
            log.warning("nvml_not_shut_down", reason="a read is still inside NVML (hung GPU or driver?)")
        if http_server is not None:
            http_server.shutdown()
        log.info("agent_stopped", replica_id=cfg.replica_id)
    return 0
