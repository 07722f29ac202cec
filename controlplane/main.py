"""`tidegate controlplane`: telemetry ingest, weights, etcd publisher, admin API.

Composition root: config -> logging -> FleetState, etcd store, presence LeaseKeeper, intents
WatchCache, leader election, gRPC server (Telemetry + Admin), decision loop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time

import grpc
import grpc.aio
import structlog
from google.protobuf import timestamp_pb2
from prometheus_client import start_http_server
from pydantic import Field, field_validator

from controlplane.admin import AdminService
from controlplane.fleet import FleetState
from controlplane.leader import Leadership
from controlplane.metrics import Metrics
from controlplane.publisher import TablePublisher
from controlplane.telemetry import TelemetryService
from tidegate import codec, config, keys, logs
from tidegate.errors import StoreError
from tidegate.policy.weights import WeightPolicyConfig, compute_pool_tables
from tidegate.store.election import Election
from tidegate.store.etcd import EtcdStore
from tidegate.store.lease import LeaseKeeper
from tidegate.store.watchcache import WatchCache
from tidegate.v1 import admin_pb2_grpc, records_pb2, telemetry_pb2_grpc

log = structlog.get_logger(__name__)

SECTION = "controlplane"


class ControlPlaneConfig(config.ConfigBase, config.EtcdFields):
    id: str = Field("", description="Instance id (default: <hostname>-<pid>).")
    listen: str = Field("127.0.0.1:50051", description="host:port of the gRPC server (Telemetry + Admin); "
                        "port 0 picks a free port and prints {\"event\": \"listening\", \"port\": N} on stdout.")
    metrics_port: int = Field(0, ge=0, lt=65536, description="Prometheus /metrics port (0 = off).")
    tick_s: float = Field(0.5, gt=0, description="Decision-loop period, seconds.")
    stale_after_s: float = Field(3.0, gt=0, description="A replica without a report for longer is STALE.")
    remove_after_s: float = Field(30.0, gt=0, description="A replica without a report for longer is forgotten.")
    election_ttl_s: int = Field(3, ge=1, description="Leader lease TTL, seconds (failover takes about this).")
    presence_ttl_s: int = Field(5, ge=1, description="TTL of the leased ReplicaPresence keys, seconds.")

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ValueError(f"{v!r} is not host:port")
        return v


CONFIG_CLASS = ControlPlaneConfig


def configure_parser(parser: argparse.ArgumentParser) -> None:
    config.add_flags(parser, ControlPlaneConfig)


def run(args: argparse.Namespace) -> int:
    try:
        cfg = config.load(ControlPlaneConfig, SECTION, args, getattr(args, "config", None))
        if not cfg.etcd:
            raise config.ConfigError(
                f"{SECTION}.etcd: the control plane needs etcd (give --etcd host:port or TIDEGATE_ETCD)")
        policy = WeightPolicyConfig(stale_after_s=cfg.stale_after_s, remove_after_s=cfg.remove_after_s)
    except (config.ConfigError, ValueError) as e:
        print(f"tidegate controlplane: {e}", file=sys.stderr)
        return 2
    cp_id = cfg.id or f"{socket.gethostname()}-{os.getpid()}"
    logs.configure(cfg.log_level, cfg.log_json, process=f"controlplane:{cp_id}")
    return asyncio.run(ControlPlane(cfg, policy, cp_id).main())


def server_options() -> list[tuple[str, int]]:
    # See NOTES-infra: reconnect storms overflow the default pending-call backlog (1,000).
    return [
        ("grpc.max_concurrent_streams", 100_000),
        ("grpc.server.max_pending_requests", 3_000),
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ("grpc.http2.max_pings_without_data", 0),
    ]


class ControlPlane:
    def __init__(self, cfg: ControlPlaneConfig, policy: WeightPolicyConfig, cp_id: str) -> None:
        self.cfg = cfg
        self.id = cp_id
        self.metrics = Metrics()
        self.fleet = FleetState(policy, now=time.monotonic)
        self.store = EtcdStore(cfg.etcd, timeout_s=cfg.etcd_timeout_s)
        self.publisher = TablePublisher(self.store, cp_id, metrics=self.metrics)
        self.presence = LeaseKeeper(self.store, cfg.presence_ttl_s)
        self.intents = WatchCache(self.store, keys.INTENTS)
        self._intent_cache: dict[str, tuple[int, records_pb2.ReplicaIntent]] = {}
        self.address = cfg.listen
        self.leadership = Leadership(self._make_election, self._elected, self._lost)

    def _make_election(self) -> Election:
        ts = timestamp_pb2.Timestamp()
        ts.FromNanoseconds(time.time_ns())
        value = codec.encode(records_pb2.LeaderRecord(controlplane_id=self.id, admin_address=self.address,
                                                      elected_at=ts))
        return Election(self.cfg.etcd, keys.ELECTION, value, ttl_s=self.cfg.election_ttl_s,
                        timeout_s=self.cfg.etcd_timeout_s)

    def _elected(self) -> None:
        self.publisher.reset()
        self.metrics.leader.set(1)

    def _lost(self) -> None:
        self.metrics.leader.set(0)

    def _refresh_intents(self) -> None:
        cache: dict[str, tuple[int, records_pb2.ReplicaIntent]] = {}
        for key, kv in self.intents.items().items():
            rid = keys.leaf(keys.INTENTS, key)
            old = self._intent_cache.get(rid)
            if old is not None and old[0] == kv.mod_revision:
                cache[rid] = old
                continue
            try:
                cache[rid] = (kv.mod_revision, codec.decode(kv.value, records_pb2.ReplicaIntent))
            except codec.DecodeError:
                log.warning("intent_undecodable", replica_id=rid)
        self._intent_cache = cache
        self.fleet.set_intents({rid: intent for rid, (_, intent) in cache.items()})

    async def tick(self) -> None:
        started = time.perf_counter()
        self.metrics.ticks.inc()
        for rid in self.fleet.prune():
            log.info("replica_removed", replica_id=rid, reason="no report within remove_after_s")
        self._refresh_intents()
        self.metrics.replicas.set(len(self.fleet))
        if self.leadership.is_leader:
            tables = compute_pool_tables(self.fleet.views(), self.fleet.policy)
            await self.publisher.publish(tables, lambda: self.leadership.is_leader)
        elapsed = time.perf_counter() - started
        self.metrics.tick_seconds.observe(elapsed)
        if elapsed > self.cfg.tick_s:
            log.warning("tick_slow", seconds=round(elapsed, 3), tick_s=self.cfg.tick_s)

    async def _tick_loop(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:  # the loop must survive a bug in one tick
                log.exception("tick_failed")
            await asyncio.sleep(self.cfg.tick_s)

    async def main(self) -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await self.store.connect()
        except StoreError as e:
            log.error("etcd_unreachable", error=str(e))
            return 1
        server = grpc.aio.server(options=server_options())
        telemetry = TelemetryService(self.fleet, self.presence, self.id, metrics=self.metrics,
                                     is_leader=lambda: self.leadership.is_leader)
        telemetry_pb2_grpc.add_TelemetryServicer_to_server(telemetry, server)
        admin_pb2_grpc.add_AdminServicer_to_server(
            AdminService(self.fleet, self.store, self.publisher, self.id, lambda: self.leadership.is_leader),
            server)
        host = self.cfg.listen.rpartition(":")[0]
        try:
            port = server.add_insecure_port(self.cfg.listen)
        except RuntimeError as e:
            log.error("listen_failed", listen=self.cfg.listen, error=str(e))
            return 1
        self.address = f"{host}:{port}"
        await server.start()
        if self.cfg.metrics_port:
            start_http_server(self.cfg.metrics_port, addr=host, registry=self.metrics.registry)
        print(json.dumps({"event": "listening", "port": port, "controlplane_id": self.id}), flush=True)
        log.info("controlplane_started", controlplane_id=self.id, listen=self.address,
                 metrics_port=self.cfg.metrics_port)
        tasks = [asyncio.create_task(c, name=n) for n, c in (
            ("presence", self.presence.run()), ("intents", self.intents.run()),
            ("leadership", self.leadership.run()), ("ticks", self._tick_loop()))]
        waiter = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            if t is not waiter and t.exception() is not None:
                log.error("task_failed", task=t.get_name(), error=repr(t.exception()))
        log.info("controlplane_stopping", controlplane_id=self.id)
        await self.leadership.stop()
        await server.stop(grace=1.0)
        await telemetry.drain_cleanups()
        await self.presence.close()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        waiter.cancel()
        await self.store.close()
        log.info("controlplane_stopped", controlplane_id=self.id)
        return 0
