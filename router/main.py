"""`tidegate router`: the composition root of one router process."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import os
import random
import signal
import socket
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

import structlog
from pydantic import Field, field_validator

from tidegate import keys, logs
from tidegate.aio import cancel_and_wait
from tidegate.config import AdmissionFields, ConfigBase, ConfigError, EtcdFields, add_flags, load
from tidegate.errors import StoreError
from tidegate.policy import registry
from tidegate.policy.registry import SloTargets
from tidegate.router import credentials, prompt_tokens
from tidegate.router.admission import AdmissionMetrics, Gate
from tidegate.router.admission_budgets import AdmissionBudgets, BudgetCollector
from tidegate.router.app import MIB, build_app, make_session
from tidegate.router.budget import RetryBudget
from tidegate.router.frontdoor import (
    ACCEPT_BATCH,
    FrontDoor,
    FrontDoorLimits,
    RateLimitFilter,
    deepen_backlog,
    fd_budget,
    listen_socket,
    raise_nofile_limit,
    rate_limited_exception_handler,
)
from tidegate.router.http1 import Server
from tidegate.router.inflight import InflightCounter
from tidegate.router.metrics import RouterMetrics
from tidegate.router.parse import DEFAULT_MAX_JSON_DEPTH
from tidegate.router.peer_load import LoadPublisher, PeerLoadWatcher
from tidegate.router.presence import PresencePublisher
from tidegate.router.proxy import Proxy, ProxySettings
from tidegate.router.tables import RoutingTables
from tidegate.store.api import Store
from tidegate.store.etcd import EtcdStore
from tidegate.store.lease import LeaseKeeper
from tidegate.store.watchcache import WatchCache

log = structlog.get_logger(__name__)

GC_YOUNG = 10_000  # objects allocated (net) between young-generation collections (_tune_gc)
PRESENCE_TTL_S = 10
PRESENCE_INTERVAL_S = 2.0
# An etcd watch's delivery, allowed for on top of the write interval when reading how stale a
# peer's record may be (measured ~1 ms median, < 2 ms P99 on one host; more across regions).
ETCD_DELIVERY_S = 0.005


class RouterConfig(ConfigBase, EtcdFields, AdmissionFields):
    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8080, ge=0, le=65535, description="Port to listen on (0: any free port, printed as JSON).")
    router_id: str | None = Field(None, description="This router's id (default: hostname-pid).")
    region: str = Field("local", description="Region this router serves from.")
    max_retries: int = Field(2, ge=0, le=10, description="Retries to another replica before the first byte.")
    retry_budget_ratio: float = Field(0.2, ge=0, le=1,
                                      description="Router-wide retries allowed per request (token bucket).")
    connect_timeout_s: float = Field(2.0, gt=0, description="Timeout to connect to an engine, seconds.")
    first_byte_timeout_s: float = Field(60.0, gt=0,
                                        description="Timeout until an engine's first body byte, seconds (504).")
    max_body_bytes: int = Field(4 * MIB, gt=0, description="Largest request body accepted (413 above).")
    max_connections: int = Field(10_000, gt=0, description="Most open connections to engines, in total.")
    max_client_connections: int = Field(
        8192, gt=0, description="Most open client connections; beyond, the least recently active idle one is "
                                "closed, or the newcomer gets 503. Lowered (with engine connections) to fit "
                                "the open-file limit.")
    header_timeout_s: float = Field(10.0, gt=0, description="Time from a request's first byte to the end of its "
                                                            "headers, seconds (408, then close).")
    body_timeout_s: float = Field(30.0, gt=0, description="Time to receive a request body once its headers are in, "
                                                          "seconds (408, then close).")
    keepalive_timeout_s: float = Field(30.0, gt=0, description="Close a client connection idle this long between "
                                                               "requests (or before its first), seconds.")
    max_json_depth: int = Field(DEFAULT_MAX_JSON_DEPTH, ge=2, le=512,
                                description="Deepest JSON nesting accepted in a request body (400 above).")
    shutdown_grace_s: float = Field(5.0, ge=0, description="On SIGTERM, how long in-flight requests may finish.")
    seed: int | None = Field(None, description="Seed of the replica picker's RNG (reproducible runs).")
    policy: str = Field("tidegate", description="Routing policy, by name: tidegate (predicted TTFT/TPOT from load "
                                                "in tokens, with prefix-cache affinity) or a baseline "
                                                "(see tidegate/policy/baselines/README.md).")

    trust_priority_header: bool = Field(
        False, description="Read each request's priority class (critical, standard, sheddable) from its "
        "x-tidegate-priority header; a bad value is a 400. Only behind a gateway that sets or strips that "
        "header: otherwise any client could promote itself. Off: every request is standard.")

    default_slo_ttft_s: float = Field(
        2.0, gt=0, description="TTFT target, seconds, for pools without an SLO of their own (tidegate pool "
        "set-slo): the tidegate policy picks the replica predicted to meet it at the least cost.")
    default_slo_tpot_s: float = Field(
        0.1, gt=0, description="TPOT (time per output token) target, seconds, for pools without an SLO of "
        "their own; the tidegate policy spares decoders whose TPOT a placement would break.")

    peer_load_interval_s: float = Field(
        0.05, ge=0, description="How often this router writes its per-replica load and newly placed prefix blocks "
        "to etcd for its peers (router-load/<id>, under its presence lease; only when something changed), and "
        "reads theirs: with several routers, each counts the others' load and learns their prefix blocks. "
        "Seconds; 0: off (each router sees only its own requests).")

    engine_api_key: str = Field(
        "", description="Credential the router sends to engines as 'Authorization: Bearer KEY' (engines "
        "started with --api-key), per pool: POOL=file:PATH or POOL=env:VAR, comma-separated; POOL * covers "
        "every pool without its own. Read once at startup. Clients' own Authorization is never forwarded.")
    uvloop: bool = Field(True, description="Run on uvloop (libuv's event loop: less CPU per request) when it is "
                                           "installed, as it is with tidegate on Linux and macOS; --no-uvloop: "
                                           "asyncio's own loop.")
    tokenizer: str = Field(
        "", description="Path to the served model's tokenizer.json (Hugging Face 'tokenizers', read locally, "
        "never downloaded): prompt token counts become exact instead of the UTF-8 bytes / 4 estimate. Needs "
        "pip install 'tidegate[tokenizer]'.")

    @field_validator("engine_api_key")
    @classmethod
    def _engine_api_key(cls, v: str) -> str:
        credentials.parse_spec(v)
        return v

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        if v not in registry.names():
            raise ValueError(f"unknown policy {v!r}; valid policies: {', '.join(registry.names())}")
        return v


CONFIG_CLASS = RouterConfig


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, RouterConfig)


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load(RouterConfig, "router", args, getattr(args, "config", None))
        if not cfg.etcd:
            raise ConfigError("invalid configuration: router.etcd: required, give --etcd HOST:PORT[,...] "
                              "(from default)")
    except ConfigError as exc:
        print(f"tidegate router: {exc}", file=sys.stderr)
        return 2
    logs.configure(cfg.log_level, cfg.log_json, process="router")
    try:
        engine_credentials = credentials.load(credentials.parse_spec(cfg.engine_api_key), os.environ)
        counter = prompt_tokens.from_file(cfg.tokenizer) if cfg.tokenizer else prompt_tokens.ESTIMATE
    except ConfigError as exc:
        print(f"tidegate router: {exc}", file=sys.stderr)
        return 2
    with asyncio.Runner(loop_factory=_loop_factory(cfg.uvloop)) as runner:
        return runner.run(serve(cfg, engine_credentials, counter))


def _loop_factory(use_uvloop: bool) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when asked for and installed; None: asyncio's default."""
    if not use_uvloop:
        return None
    try:
        import uvloop
    except ImportError:  # not a dependency where it does not build (Windows)
        return None
    return uvloop.new_event_loop


def _tune_gc() -> None:
    """Once serving: what startup made (modules, config, the app) lives as long as the process, so
    it is frozen out of every collection; and the young generation is collected at GC_YOUNG
    allocations instead of 700. The requests in flight alone hold more than 700 objects, so the
    default rescans them over and over (measured: collections took ~20% of the router's CPU at
    64 connections, under 1% after; docs/BENCHMARKS.md, "Router overhead")."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG, *gc.get_threshold()[1:])


async def _connect(store: EtcdStore) -> None:
    attempt = 0
    while True:
        try:
            await store.connect()
            return
        except StoreError as exc:
            if attempt == 0:
                log.warning("etcd_connect_failed", error=str(exc))
            await asyncio.sleep(min(5.0, 0.2 * 2 ** attempt) * random.uniform(0.5, 1.0))
            attempt += 1


async def _sync_tables(store: Store, tables: RoutingTables) -> None:
    cache = WatchCache(store, keys.TABLES, on_change=tables.on_change)
    task = asyncio.create_task(cache.run(), name="tables-watch")
    try:
        while True:
            tables.etcd_healthy = cache.healthy
            if cache.synced.is_set():
                tables.mark_synced()
            await asyncio.sleep(0.05 if not tables.synced.is_set() else 0.5)
    finally:
        await cancel_and_wait([task])


async def serve(cfg: RouterConfig,
                engine_credentials: credentials.EngineCredentials = credentials.NO_CREDENTIALS,
                counter: prompt_tokens.PromptCounter = prompt_tokens.ESTIMATE) -> int:
    router_id = cfg.router_id or f"{socket.gethostname()}-{os.getpid()}"
    structlog.contextvars.bind_contextvars(router_id=router_id)
    tables = RoutingTables()
    inflight = InflightCounter()
    metrics = RouterMetrics(tables, inflight, wall=time.time)
    budget = RetryBudget(time.monotonic, ratio=cfg.retry_budget_ratio)
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(rate_limited_exception_handler())
    for name in ("asyncio",):
        logging.getLogger(name).addFilter(RateLimitFilter())
    # Client load must never take the descriptors that etcd (the presence lease) and engines need.
    nofile = raise_nofile_limit()
    try:
        max_clients, max_engine_conns = fd_budget(nofile, cfg.max_client_connections, cfg.max_connections)
    except ValueError as exc:
        log.error("fd_limit_too_low", error=str(exc))
        return 2
    if (max_clients, max_engine_conns) != (cfg.max_client_connections, cfg.max_connections):
        log.warning("connection_limits_lowered", nofile=nofile, max_client_connections=max_clients,
                    max_connections=max_engine_conns)
    session = make_session(cfg.connect_timeout_s, limit=max_engine_conns)
    proxy = Proxy(tables, session, inflight, budget, metrics, random.Random(cfg.seed),
                  ProxySettings(max_retries=cfg.max_retries, first_byte_timeout_s=cfg.first_byte_timeout_s,
                                policy=cfg.policy, body_timeout_s=cfg.body_timeout_s,
                                max_json_depth=cfg.max_json_depth,
                                trust_priority_header=cfg.trust_priority_header,
                                default_slo=SloTargets(ttft_s=cfg.default_slo_ttft_s, tpot_s=cfg.default_slo_tpot_s),
                                engine_credentials=engine_credentials, prompt_counter=counter))
    gate = None
    # A peer's held report is at most one write interval old, plus its etcd watch delivery.
    admission = cfg.admission_config(peer_report_s=cfg.peer_load_interval_s + ETCD_DELIVERY_S)
    if admission is not None:
        gate = Gate(admission, time.monotonic, AdmissionMetrics(metrics.registry))
        proxy.gate = gate
    app = build_app(proxy, tables, metrics, router_id, cfg.max_body_bytes)
    door = FrontDoor(FrontDoorLimits(header_timeout_s=cfg.header_timeout_s, body_timeout_s=cfg.body_timeout_s,
                                     keepalive_timeout_s=cfg.keepalive_timeout_s,
                                     max_client_connections=max_clients),
                     on_event=lambda kind: metrics.client_connection_events.labels(kind).inc())
    metrics.client_connections.set_function(lambda: len(door.table))
    server = Server(app, door, app.max_body_bytes)
    sock = listen_socket(cfg.host, cfg.port)
    listener = await loop.create_server(server, sock=sock, backlog=ACCEPT_BATCH)
    deepen_backlog(sock)
    _tune_gc()
    port = sock.getsockname()[1]
    print(json.dumps({"event": "listening", "port": port}), flush=True)
    log.info("router_listening", host=cfg.host, port=port, etcd=",".join(cfg.etcd), prompt_tokens=counter.source,
             event_loop=type(loop).__module__.partition(".")[0])  # uvloop | asyncio

    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    store = EtcdStore(cfg.etcd, timeout_s=cfg.etcd_timeout_s, security=cfg.etcd_security())
    keeper = LeaseKeeper(store, PRESENCE_TTL_S)
    budgets = AdmissionBudgets(store, router_id)
    metrics.registry.register(BudgetCollector(budgets))
    proxy.admission_budgets = budgets
    presence = PresencePublisher(keeper, router_id, cfg.region, f"http://{cfg.host}:{port}", inflight, tables,
                                 interval_s=PRESENCE_INTERVAL_S, budgets=budgets)
    # Peer load records (router/peer_load.py): what this router places, for the other routers.
    peer_tasks: list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = []
    if cfg.peer_load_interval_s > 0:
        watcher = PeerLoadWatcher(store, router_id, proxy.policy, proxy.policies,
                                  on_held=gate.on_peer_held if gate is not None else None)
        publisher = LoadPublisher(store, keeper, router_id, proxy.policies, interval_s=cfg.peer_load_interval_s,
                                  on_write=metrics.peer_load_writes.inc,
                                  held=gate.held_reports if gate is not None else dict,
                                  alone=lambda: watcher.peers == 0)
        metrics.peer_routers.set_function(lambda: watcher.peers)
        peer_tasks = [("peer_load_publish", publisher.run), ("peer_load_watch", watcher.run)]
    tasks: list[asyncio.Task[None]] = []

    async def background() -> None:
        await _connect(store)
        tasks.append(asyncio.create_task(_sync_tables(store, tables), name="tables"))
        tasks.append(asyncio.create_task(keeper.run(), name="lease"))
        tasks.append(asyncio.create_task(presence.run(), name="presence"))
        tasks.append(asyncio.create_task(budgets.run(), name="admission_budgets"))
        tasks.extend(asyncio.create_task(run(), name=name) for name, run in peer_tasks)

    starter = asyncio.create_task(background(), name="connect")
    try:
        await stop.wait()
        log.info("router_stopping", inflight=inflight.total, grace_s=cfg.shutdown_grace_s)
        # stops accepting, then lets in-flight handlers finish for up to shutdown_grace_s
        listener.close()
        await server.shutdown(cfg.shutdown_grace_s)
    finally:
        stuck = await cancel_and_wait([starter, *tasks])
        if stuck:
            log.error("tasks_did_not_stop", tasks=sorted(t.get_name() for t in stuck if isinstance(t, asyncio.Task)))
        with contextlib.suppress(Exception):
            await keeper.close()
        if gate is not None:
            gate.close()
        await session.close()
        await store.close()
    log.info("router_stopped")
    return 0
