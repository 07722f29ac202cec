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
from typing import Any

import grpc
import grpc.aio
import structlog
from google.protobuf import timestamp_pb2
from prometheus_client import start_http_server
from pydantic import Field, field_validator

from tidegate import codec, config, keys, logs
from tidegate.aio import cancel_and_wait
from tidegate.controlplane.admin import AdminService
from tidegate.controlplane.admission_budgets import BudgetPublisher, tokens_of
from tidegate.controlplane.auth import Authenticator, load_tokens
from tidegate.controlplane.events import EventLog
from tidegate.controlplane.faultbook import FaultBook
from tidegate.controlplane.fleet import FleetState
from tidegate.controlplane.leader import Leadership, LeaderWatch
from tidegate.controlplane.metrics import Metrics
from tidegate.controlplane.publisher import TablePublisher
from tidegate.controlplane.slo import PoolSlos, ScaleReporter, slo_targets_ms
from tidegate.controlplane.telemetry import TelemetryService
from tidegate.controlplane.telemetry_auth import (
    DEFAULT_ALLOWED_NETWORKS,
    NO_CREDENTIALS,
    AllowedNetworks,
    CredentialsFile,
    TelemetryAccess,
)
from tidegate.controlplane.term import Plan, Term
from tidegate.errors import StoreError
from tidegate.policy.admission import parse_class_values
from tidegate.policy.admission_budget import DEFAULT_CLASS_FRACTION, BudgetConfig, Tokens
from tidegate.policy.continuity import ContinuityConfig
from tidegate.policy.faults import FaultPolicyConfig
from tidegate.policy.feedback import FeedbackConfig
from tidegate.policy.outliers import OutlierConfig
from tidegate.policy.scale import HEADROOM, ScaleConfig
from tidegate.policy.weights import ReplicaView, WeightPolicyConfig, compute_pool_tables, decide
from tidegate.store.election import Election
from tidegate.store.etcd import EtcdStore
from tidegate.store.lease import LeaseKeeper
from tidegate.store.watchcache import WatchCache
from tidegate.v1 import admin_pb2_grpc, records_pb2, telemetry_pb2_grpc

log = structlog.get_logger(__name__)

# Replicas per chunk of a tick's plan (see ControlPlane._plan_and_publish).
TICK_CHUNK_REPLICAS = 250

SECTION = "controlplane"
RS = records_pb2.ReplicaState


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
    auth_tokens_file: str = Field("", description="Admin API tokens: one 'token,name,role' line per token "
                                  "(role viewer or operator, '#' comments). Without it every admin call is "
                                  "UNAUTHENTICATED.")
    telemetry_credentials_file: str = Field(
        "", description="Agent credentials: one 'identity,sha256-of-token,replica-id globs' line per agent token "
        "(see docs/SECURITY.md; re-read when it changes). Without it (and without --telemetry-insecure) every "
        "telemetry stream is refused with UNAUTHENTICATED.")
    telemetry_insecure: bool = Field(
        False, description="Development only: accept telemetry streams without a token (any client may then "
        "register any replica id). Logged as a warning.")
    telemetry_allowed_networks: tuple[str, ...] = Field(
        DEFAULT_ALLOWED_NETWORKS, description="Where advertised engine endpoints may point, comma-separated CIDRs "
        "or host-name globs (10.0.0.0/8,*.svc.cluster.local); a Hello with another endpoint is refused "
        "with PERMISSION_DENIED.")
    slo_ttft_ms: float = Field(0.0, ge=0, description="TTFT target for pool SLO attainment (0 = unknown).")
    slo_itl_ms: float = Field(0.0, ge=0, description="ITL target for pool SLO attainment (0 = unknown).")
    unhealthy_reports: int = Field(3, ge=1, description="Consecutive reports with a failing engine /health "
                                   "before the replica is ejected.")
    preemption_storm_per_s: float = Field(5.0, ge=0, description="Preemptions/s above which a replica's "
                                          "weight is cut (0 = off).")
    pressure_eject_after_s: float = Field(30.0, ge=0, description="An OOM or preemption storm lasting this "
                                          "long ejects the replica.")
    readmit_backoff_s: float = Field(10.0, gt=0, description="First re-admission backoff after an ejection; "
                                     "doubles per ejection in a row.")
    readmit_backoff_max_s: float = Field(300.0, gt=0, description="Cap of the re-admission backoff.")
    events_keep: int = Field(5000, ge=1, description="Audit events kept in etcd (older ones are deleted).")
    scale_min_replicas: int = Field(1, ge=1, description="Floor of every pool's scale recommendation "
                                    "(tidegate_pool_recommended_replicas): an idle pool is recommended this many.")
    scale_headroom: float = Field(HEADROOM, gt=0, le=1, description="Target utilisation of the scale "
                                  "recommendation: replicas = work / headroom (lower when the TTFT target "
                                  "needs it; see tidegate/policy/scale.py).")
    slo_feedback: bool = Field(True, description="Correct each replica's weight (and budget share) by its measured "
                               "P95 TTFT/ITL against the pool's SLO (AIMD with a deadband; docs/OPERATIONS.md).")
    slo_feedback_min_multiplier: float = Field(0.2, gt=0, le=1, description="Lowest factor the SLO feedback "
                                               "may put on a replica's weight.")
    outlier_consecutive_errors: int = Field(5, ge=0, description="Consecutive upstream errors (as routers report "
                                            "them) that eject a replica as an outlier (0 = off).")
    # Off by default: TTFT grows with the share of traffic a replica takes, so near capacity the
    # busiest healthy replica looks like an outlier (measured in `tidegate demo` at load 1.0: a
    # factor of 3 ejected it and overloaded the rest). Error streaks and faults still eject.
    outlier_latency_factor: float = Field(0.0, ge=0, description="A replica whose TTFT p95 exceeds this many "
                                          "times the pool median is ejected as an outlier (0 = off, the "
                                          "default; else > 1, e.g. 5 for fleets of identical GPUs).")
    outlier_max_ejection_percent: float = Field(50.0, ge=0, le=100, description="At most this percent of a "
                                                "pool's replicas are outlier-ejected at once.")
    outlier_panic_threshold_percent: float = Field(50.0, ge=0, le=100, description="Below this percent of "
                                                   "healthy replicas a pool panics: outlier ejections are "
                                                   "lifted and routers use every replica (0 = never).")
    admission_budgets: bool = Field(True, description="Publish each pool's admission budget and every live "
                                    "router's share of it (/tidegate/v1/admission/<pool>; docs/OPERATIONS.md).")
    admission_class_fraction: str = Field(
        "critical=1,standard=1,sheddable=0.5", description="Fraction of a router's budget share each class may "
        "fill, CLASS=FRACTION comma-separated (lower classes stop first, leaving room for higher ones; over the "
        "share a critical request waits, a lower one is shed).")
    outlier_backoff_s: float = Field(30.0, gt=0, description="First outlier ejection's length; doubles per "
                                     "ejection in a row, up to 10x.")
    warmup_s: float = Field(5.0, ge=0, description="A new leader publishes nothing for up to this long while "
                            "replicas of the last table reconnect (it ends early once all have reported); "
                            "until warmup_s + stale_after_s they keep their last entry (see docs/RELIABILITY.md).")

    @field_validator("telemetry_allowed_networks", mode="before")
    @classmethod
    def _networks(cls, v: Any) -> tuple[str, ...]:
        items = tuple(str(x).strip() for x in (v.split(",") if isinstance(v, str) else v) if str(x).strip())
        AllowedNetworks.parse(items)  # ValueError names the bad entry
        return items

    @field_validator("admission_class_fraction")
    @classmethod
    def _class_fraction(cls, v: str) -> str:
        budget_config(v)  # ValueError names the bad entry
        return v

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ValueError(f"{v!r} is not host:port")
        return v


CONFIG_CLASS = ControlPlaneConfig


def budget_config(class_fraction: str) -> BudgetConfig:
    values = parse_class_values(class_fraction, "admission_class_fraction")
    return BudgetConfig(class_fraction={**DEFAULT_CLASS_FRACTION, **values})


def configure_parser(parser: argparse.ArgumentParser) -> None:
    config.add_flags(parser, ControlPlaneConfig)


def run(args: argparse.Namespace) -> int:
    try:
        cfg = config.load(ControlPlaneConfig, SECTION, args, getattr(args, "config", None))
        if not cfg.etcd:
            raise config.ConfigError(
                f"{SECTION}.etcd: the control plane needs etcd (give --etcd host:port or TIDEGATE_ETCD)")
        policy = WeightPolicyConfig(stale_after_s=cfg.stale_after_s, remove_after_s=cfg.remove_after_s)
        fault_policy = FaultPolicyConfig(
            unhealthy_reports=cfg.unhealthy_reports, preemption_storm_per_s=cfg.preemption_storm_per_s,
            pressure_eject_after_s=cfg.pressure_eject_after_s, backoff_initial_s=cfg.readmit_backoff_s,
            backoff_max_s=max(cfg.readmit_backoff_s, cfg.readmit_backoff_max_s))
        feedback_policy = FeedbackConfig(enabled=cfg.slo_feedback,
                                         min_multiplier=cfg.slo_feedback_min_multiplier)
        outlier_policy = OutlierConfig(
            consecutive_errors=cfg.outlier_consecutive_errors, latency_factor=cfg.outlier_latency_factor,
            max_ejection_percent=cfg.outlier_max_ejection_percent,
            panic_threshold_percent=cfg.outlier_panic_threshold_percent,
            backoff_initial_s=cfg.outlier_backoff_s, backoff_max_s=10 * cfg.outlier_backoff_s)
        tokens = load_tokens(cfg.auth_tokens_file) if cfg.auth_tokens_file else {}
        access = telemetry_access(cfg)
    except (config.ConfigError, ValueError) as e:
        print(f"tidegate controlplane: {e}", file=sys.stderr)
        return 2
    cp_id = cfg.id or f"{socket.gethostname()}-{os.getpid()}"
    logs.configure(cfg.log_level, cfg.log_json, process=f"controlplane:{cp_id}")
    if not tokens:
        log.warning("admin_auth_unconfigured", hint="no --auth-tokens-file: every admin call is refused")
    if access.credentials is None:
        log.warning("telemetry_insecure", hint="--telemetry-insecure: any client that reaches this port may "
                    "register any replica id and receive its traffic; development only")
    elif not cfg.telemetry_credentials_file:
        log.warning("telemetry_auth_unconfigured",
                    hint="no --telemetry-credentials-file: every agent stream is refused")
    return asyncio.run(ControlPlane(cfg, policy, cp_id, fault_policy=fault_policy, feedback_policy=feedback_policy,
                                    outlier_policy=outlier_policy, auth=Authenticator(tokens),
                                    telemetry_access=access).main())


def telemetry_access(cfg: ControlPlaneConfig) -> TelemetryAccess:
    """Raises ConfigError when the credentials file cannot be read or parsed."""
    networks = AllowedNetworks.parse(cfg.telemetry_allowed_networks)
    if cfg.telemetry_insecure:
        return TelemetryAccess(None, networks)
    if not cfg.telemetry_credentials_file:
        return TelemetryAccess(NO_CREDENTIALS, networks)
    return TelemetryAccess(CredentialsFile(cfg.telemetry_credentials_file), networks)


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
    def __init__(self, cfg: ControlPlaneConfig, policy: WeightPolicyConfig, cp_id: str, *,
                 fault_policy: FaultPolicyConfig | None = None, auth: Authenticator | None = None,
                 telemetry_access: TelemetryAccess | None = None, feedback_policy: FeedbackConfig | None = None,
                 outlier_policy: OutlierConfig | None = None) -> None:
        self.cfg = cfg
        self.id = cp_id
        self.metrics = Metrics()
        self.fleet = FleetState(policy, now=time.monotonic, fault_policy=fault_policy,
                                feedback_policy=feedback_policy, outlier_policy=outlier_policy,
                                on_state_change=self._state_changed)
        self.store = EtcdStore(cfg.etcd, timeout_s=cfg.etcd_timeout_s, security=cfg.etcd_security())
        self.publisher = TablePublisher(self.store, cp_id, metrics=self.metrics, on_fenced=self._fenced)
        self.term = Term(self.fleet, self.publisher,
                         ContinuityConfig(warmup_s=cfg.warmup_s, stale_after_s=cfg.stale_after_s),
                         faults=FaultBook(self.store, cp_id, on_fenced=self._fenced))
        self.leader_watch = LeaderWatch(self.store, keys.ELECTION, cp_id,
                                        timeout_s=min(1.0, cfg.etcd_timeout_s))
        self.presence = LeaseKeeper(self.store, cfg.presence_ttl_s)
        self.auth = auth or Authenticator({})
        self.telemetry_access = telemetry_access or TelemetryAccess(
            NO_CREDENTIALS, AllowedNetworks.parse(DEFAULT_ALLOWED_NETWORKS))
        # Any intent or router change wakes the decision loop at once (a standby may have
        # written the intent; a router's in-flight count may complete a drain).
        self._wake = asyncio.Event()
        self.intents = WatchCache(self.store, keys.INTENTS, on_change=lambda k, kv: self._wake.set())
        self.routers = WatchCache(self.store, keys.ROUTERS, on_change=lambda k, kv: self._wake.set())
        # Pool SLOs (any instance may write one) go into the tables at once; the scale
        # recommendation is recomputed every tick and written when it changes.
        self.slos = PoolSlos(self.store, on_change=self._wake.set)
        self.scale = ScaleReporter(self.store, cp_id, registry=self.metrics.registry, config=ScaleConfig(
            min_replicas=cfg.scale_min_replicas, headroom=cfg.scale_headroom), on_fenced=self._fenced)
        self.events = EventLog(self.store, cp_id, keep=cfg.events_keep)
        self.budgets = BudgetPublisher(self.store, cp_id, budget_config(cfg.admission_class_fraction),
                                       on_fenced=self._fenced)
        self._live_routers: set[str] = set()
        self._router_demand: dict[str, dict[str, Tokens]] = {}
        self._intent_cache: dict[str, tuple[int, records_pb2.ReplicaIntent]] = {}
        # Intents written by this instance that its WatchCache may not have seen yet:
        # replica -> (revision of the write, intent or None when deleted).
        self._pending: dict[str, tuple[int, records_pb2.ReplicaIntent | None]] = {}
        self._tick_lock = asyncio.Lock()
        self._last_state: dict[str, int] = {}
        self._timed_out: set[str] = set()
        self._outliers_at = float("-inf")
        # Pools with a replica whose state changed since the last pass of _urgent_loop.
        self._urgent: set[str] = set()
        self._urgent_wake = asyncio.Event()
        self._background: set[asyncio.Task[object]] = set()
        self.address = cfg.listen
        self.leadership = Leadership(self._make_election, self._elected, self._lost)

    def _fenced(self, reason: str) -> None:
        """A leader-only write was refused by its fence: another instance leads, so this term ends."""
        self.leadership.step_down("fenced")

    def _make_election(self) -> Election:
        ts = timestamp_pb2.Timestamp()
        ts.FromNanoseconds(time.time_ns())
        value = codec.encode(records_pb2.LeaderRecord(controlplane_id=self.id, admin_address=self.address,
                                                      elected_at=ts))
        return Election(self.cfg.etcd, keys.ELECTION, value, ttl_s=self.cfg.election_ttl_s,
                        timeout_s=self.cfg.etcd_timeout_s, security=self.cfg.etcd_security())

    def _elected(self) -> None:
        self.publisher.reset()
        self.term.begin()
        self.leader_watch.elected()
        self.scale.reset()
        self.budgets.reset()
        self._last_state.clear()
        self.metrics.leader.set(1)
        task = asyncio.get_running_loop().create_task(
            self.events.record("leader", reason=f"{self.id} elected leader (admin {self.address})"))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

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
        merged = {rid: intent for rid, (_, intent) in cache.items()}
        for rid, (rev, intent) in list(self._pending.items()):
            if rev and self.intents.revision >= rev or not rev and rid not in merged:
                del self._pending[rid]  # the cache has caught up
                continue
            if intent is None:
                merged.pop(rid, None)
            else:
                merged[rid] = intent
        self.fleet.set_intents(merged)

    def _refresh_routers(self) -> None:
        total: dict[str, int] = {}
        streaks: dict[str, int] = {}
        live: set[str] = set()
        demand: dict[str, dict[str, Tokens]] = {}
        for key, kv in self.routers.items().items():
            try:
                rp = codec.decode(kv.value, records_pb2.RouterPresence)
            except codec.DecodeError:
                log.warning("router_presence_undecodable", key=key)
                continue
            for rid, n in rp.inflight_by_replica.items():
                total[rid] = total.get(rid, 0) + max(0, n)
            for rid, n in rp.consecutive_errors_by_replica.items():
                streaks[rid] = max(streaks.get(rid, 0), n)
            router_id = keys.leaf(keys.ROUTERS, key)
            live.add(router_id)
            for pool, want in rp.demand_by_pool.items():
                demand.setdefault(pool, {})[router_id] = tokens_of(want)
        self._live_routers, self._router_demand = live, demand
        self.fleet.set_router_inflight(total)
        self.fleet.set_router_error_streaks(streaks)

    async def apply_intent(self, rid: str, intent: records_pb2.ReplicaIntent | None, revision: int) -> None:
        """Called by the admin API after writing an intent: apply it and publish now, so
        routers see weight 0 as soon as the RPC returns (not at the next tick)."""
        self._pending[rid] = (revision, intent)
        await self.tick()

    async def _record_transitions(self, views: list[ReplicaView]) -> None:
        for ev in self.fleet.take_events():
            await self.events.record(ev.kind, ev.replica_id, ev.pool, reason=ev.reason)
        seen = set()
        for view in views:
            rid = view.replica_id
            seen.add(rid)
            d = decide(view, self.fleet.policy)
            prev = self._last_state.get(rid)
            self._last_state[rid] = d.state
            if not view.draining:
                self._timed_out.discard(rid)
            if d.state == prev:
                if d.state == RS.REPLICA_STATE_DRAINING and view.drain_expired and rid not in self._timed_out:
                    self._timed_out.add(rid)
                    await self.events.record("drain_timeout", rid, view.pool, reason=d.reason)
                continue
            if d.state == RS.REPLICA_STATE_STALE and prev is not None:
                await self.events.record("stale", rid, view.pool, reason=d.reason)
            elif d.state == RS.REPLICA_STATE_DRAINED:
                kind = "drain_forced" if view.drain_expired and d.reason.startswith("drain forced") \
                    else "drain_complete"
                await self.events.record(kind, rid, view.pool, reason=d.reason)
            elif d.state == RS.REPLICA_STATE_DRAINING and view.drain_expired and rid not in self._timed_out:
                self._timed_out.add(rid)
                await self.events.record("drain_timeout", rid, view.pool, reason=d.reason)
        for rid in set(self._last_state) - seen:
            del self._last_state[rid]

    async def tick(self) -> None:
        async with self._tick_lock:
            await self._tick()

    async def _tick(self) -> None:
        started = time.perf_counter()
        self.metrics.ticks.inc()
        leader = self.leadership.is_leader
        pools = self.fleet.pools()
        for rid in self.fleet.prune():
            log.info("replica_removed", replica_id=rid, reason="no report within remove_after_s")
            if leader:
                await self.events.record("removed", rid, pools.get(rid, ""),
                                         reason=f"no report for {self.fleet.policy.remove_after_s:g}s")
        self._refresh_intents()
        self._refresh_routers()
        self.metrics.replicas.set(len(self.fleet))
        if leader:
            self.fleet.set_slo_targets(slo_targets_ms(self.slos.all()), (self.cfg.slo_ttft_ms, self.cfg.slo_itl_ms))
            # Outlier ejection keeps its period when a wake (a router's report) ticks early.
            if time.monotonic() - self._outliers_at >= self.cfg.tick_s:
                self._outliers_at = time.monotonic()
                self.fleet.evaluate_outliers()
                # Each step is tens of ms at thousands of replicas: let reports and an urgent
                # republish in between, rather than holding the loop for the whole tick.
                await asyncio.sleep(0)
            plan = await self._plan_and_publish()
            # One set of views per tick (building them is most of a tick's work at thousands of
            # replicas): the transitions recorded are those of the tables just computed.
            views = self.fleet.views() if plan is None else plan.views
            tables = compute_pool_tables(views, self.fleet.policy) if plan is None else plan.computed
            if plan is not None:
                await self.term.save_faults(self.leadership.fence)
            await self._record_transitions(views)
            await asyncio.sleep(0)
            self.scale.compute(tables, self.fleet, self.slos.all())
            await self.scale.publish(self.leadership.fence)
            if self.cfg.admission_budgets:
                self.budgets.compute(tables, self.fleet, self.slos.all(), self._live_routers, self._router_demand)
                await self.budgets.publish(self.leadership.fence)
        elapsed = time.perf_counter() - started
        self.metrics.tick_seconds.observe(elapsed)
        if elapsed > self.cfg.tick_s:
            log.warning("tick_slow", seconds=round(elapsed, 3), tick_s=self.cfg.tick_s)

    async def _plan_and_publish(self) -> Plan | None:
        """Computes and publishes this tick's tables a chunk of pools at a time (about
        TICK_CHUNK_REPLICAS replicas each), yielding between chunks. At 2,000 replicas one plan of
        every pool held the loop for ~400 ms, and a state flip's urgent republish waited behind it
        (propagation P99 ~0.9 s); now it waits for one chunk. Returns the merged plan, or None
        before the last tables could be read."""
        if await self.term.plan(()) is None:  # reads the last tables (and restores) once per term
            return None
        sizes: dict[str, int] = {}
        for pool in self.fleet.pools().values():
            sizes[pool] = sizes.get(pool, 0) + 1
        chunks: list[list[str]] = [[]]
        filled = 0
        for pool in sorted(set(self.publisher.previous()) | set(sizes)):
            if filled >= TICK_CHUNK_REPLICAS:
                chunks.append([])
                filled = 0
            chunks[-1].append(pool)
            filled += sizes.get(pool, 0)
        merged = Plan({}, frozenset(), {}, [], time.monotonic())
        for chunk in chunks:
            plan = await self.term.plan(chunk)
            if plan is None:
                return None
            await self.publisher.publish(plan.tables, self.leadership.fence, hold=plan.hold,
                                         slos=self.slos.all() if self.slos.synced else None,
                                         only=chunk, computed_at=plan.at)
            merged.tables.update(plan.tables)
            merged.computed.update(plan.computed)
            merged.views.extend(plan.views)
            merged = Plan(merged.tables, merged.hold | plan.hold, merged.computed, merged.views, plan.at)
            await asyncio.sleep(0)
        return merged

    def _state_changed(self, pool: str) -> None:
        self._urgent.add(pool)
        self._urgent_wake.set()

    async def _urgent_loop(self) -> None:
        """Republishes, between ticks, the pools in which a replica changed state (became
        unhealthy, degraded, ready...): routers learn it in milliseconds rather than at the next
        tick, and only those pools are recomputed, not the fleet. Each pass is followed by a pause
        as long as the pass, so a flapping fleet cannot take more than about half the process."""
        while True:
            await self._urgent_wake.wait()
            self._urgent_wake.clear()
            pools, self._urgent = self._urgent, set()
            started = time.monotonic()
            try:
                # Not under the tick lock: a tick of thousands of replicas would hold this back.
                # The publisher orders the writes (a tick's older views never overwrite these).
                if self.leadership.is_leader and self.term.ready:
                    plan = await self.term.plan(pools)
                    if plan is not None:
                        await self.publisher.publish(plan.tables, self.leadership.fence, hold=plan.hold,
                                                     slos=self.slos.all() if self.slos.synced else None,
                                                     only=pools, computed_at=plan.at)
            except Exception:  # the loop must survive a bug in one pass
                log.exception("urgent_publish_failed")
            await asyncio.sleep(time.monotonic() - started)

    async def _tick_loop(self) -> None:
        while True:
            # Cleared before the tick, so a change that arrives while it runs wakes the next one.
            self._wake.clear()
            started = time.monotonic()
            try:
                await self.tick()
            except Exception:  # the loop must survive a bug in one tick
                log.exception("tick_failed")
            ended = time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.cfg.tick_s)
            # A wake (an intent, a router, a pool SLO) ticks early, but not sooner
            # than the last tick's duration after it: bursts coalesce, and ticks never take more
            # than about half of the process however often routers report.
            rest = min(self.cfg.tick_s, ended - started) - (time.monotonic() - ended)
            if rest > 0:
                await asyncio.sleep(rest)

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
        telemetry = TelemetryService(self.fleet, self.presence, self.id, access=self.telemetry_access,
                                     metrics=self.metrics,
                                     is_leader=lambda: self.leadership.is_leader,
                                     redirect=lambda: self.leader_watch.redirect(self.leadership.is_leader))
        telemetry_pb2_grpc.add_TelemetryServicer_to_server(telemetry, server)
        admin = AdminService(self.fleet, self.store, self.publisher, self.id, lambda: self.leadership.is_leader,
                             auth=self.auth, events=self.events, apply_intent=self.apply_intent,
                             slo_ttft_ms=self.cfg.slo_ttft_ms, slo_itl_ms=self.cfg.slo_itl_ms,
                             scale=self.scale.latest, fence=self.leadership.fence, on_fenced=self._fenced)
        admin_pb2_grpc.add_AdminServicer_to_server(admin, server)
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
            ("routers", self.routers.run()), ("events", self.events.cache.run()), ("slos", self.slos.run()),
            ("events_trim", self.events.trim_loop()),
            ("leadership", self.leadership.run()), ("leader_watch", self.leader_watch.run()),
            ("ticks", self._tick_loop()), ("urgent", self._urgent_loop()))]
        waiter = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            if t is not waiter and t.exception() is not None:
                log.error("task_failed", task=t.get_name(), error=repr(t.exception()))
        log.info("controlplane_stopping", controlplane_id=self.id)
        await self.leadership.stop()
        await server.stop(grace=1.0)
        await admin.close()
        await telemetry.drain_cleanups()
        await self.presence.close()
        stuck = await cancel_and_wait([*tasks, waiter])
        if stuck:
            log.error("tasks_did_not_stop", tasks=sorted(t.get_name() for t in stuck if isinstance(t, asyncio.Task)))
        await self.store.close()
        log.info("controlplane_stopped", controlplane_id=self.id)
        return 0
