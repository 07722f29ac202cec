"""The in-memory fleet of one control-plane instance: last hello and report per replica.

No gRPC and no etcd here: the telemetry servicer feeds it, the publisher and the
admin API read `views(now)`. The clock is injected (monotonic seconds).
Garbage telemetry (negative counts, NaN, usage > 1, capacity 0) is clamped and
flagged, never trusted and never a crash.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

from tidegate.policy import faults, feedback, outliers
from tidegate.policy.predict import unbacked_prefill
from tidegate.policy.rates import EngineRates, RateEstimator, RateEstimatorConfig, WorkWindow
from tidegate.policy.weights import ROUTABLE_STATES, ReplicaDecision, ReplicaView, WeightPolicyConfig, decide
from tidegate.v1 import records_pb2, telemetry_pb2


@dataclass(frozen=True)
class CleanStats:
    """Engine and GPU numbers of one report after sanitising."""

    healthy: bool = False
    engine_error: str = ""
    running: int = 0
    waiting: int = 0
    kv_capacity_tokens: int = 0
    kv_free_tokens: int = 0
    kv_usage: float = 0.0
    ttft_p95_ms: float = 0.0
    itl_p95_ms: float = 0.0
    ttft_count: float = 0.0            # TTFT observations in the report's window
    max_num_seqs: int = 0              # the engine's limit on running sequences; 0 = unknown
    preemptions_total: float = 0.0
    gpu_telemetry_available: bool = False
    gpu_faults: tuple[str, ...] = ()
    xid_events: tuple[int, ...] = ()
    ecc_uncorrected: int = 0
    gpu_lost: bool = False
    row_remap_failed: bool = False
    oom: bool = False
    flags: tuple[str, ...] = ()


# Horizon of the smoothed completion rate, seconds: five one-second reports, so that the
# Poisson noise of a second's count (~20 % at 25 completions/s) is ~9 % of the figure while a
# step change still shows within a few seconds.
COMPLETIONS_TAU_S = 5.0


def smoothed_rate(prev: float, count: float, interval_s: float, tau_s: float = COMPLETIONS_TAU_S) -> float:
    """An exponential moving average of count / interval over `tau_s`; a window with garbage (not
    finite, negative, no interval) leaves it as it was."""
    if not (math.isfinite(count) and math.isfinite(interval_s) and count >= 0 and interval_s > 0):
        return prev
    a = 1.0 - math.exp(-interval_s / tau_s)
    return prev + a * (count / interval_s - prev)


def _is_oom(text: str) -> bool:
    t = text.lower()
    return "out of memory" in t or "oom" in t.split() or "cuda oom" in t


def sanitize(report: telemetry_pb2.Report) -> CleanStats:
    """Clamp a report into sane ranges; every clamp adds a flag naming the field."""
    flags: list[str] = []
    eng = report.engine

    def count(name: str, v: int) -> int:
        if v < 0:
            flags.append(f"{name} {v} < 0")
            return 0
        return v

    def num(name: str, v: float, hi: float = math.inf) -> float:
        if not math.isfinite(v):
            flags.append(f"{name} not finite")
            return 0.0
        if v < 0:
            flags.append(f"{name} {v:g} < 0")
            return 0.0
        if v > hi:
            flags.append(f"{name} {v:g} > {hi:g}")
            return hi
        return v

    if not report.HasField("engine"):
        return CleanStats(healthy=False, engine_error="report has no engine stats",
                          gpu_telemetry_available=report.gpu_telemetry_available)
    running = count("running", eng.num_requests_running)
    waiting = count("waiting", eng.num_requests_waiting)
    usage = num("kv_cache_usage", eng.kv_cache_usage, 1.0)
    capacity = eng.kv_capacity_tokens
    free = eng.kv_free_tokens
    if capacity <= 0:
        if eng.has_kv_capacity or capacity < 0:
            flags.append(f"kv_capacity_tokens {capacity} <= 0, treated as unknown")
        capacity, free = 0, 0
    else:
        if free < 0:
            flags.append(f"kv_free_tokens {free} < 0")
            free = 0
        elif free > capacity:
            flags.append(f"kv_free_tokens {free} > capacity {capacity}")
            free = capacity
    gpu_faults: list[str] = []
    xids: list[int] = []
    ecc = 0
    lost = remap_failed = False
    oom = _is_oom(eng.error)
    if report.gpu_telemetry_available:
        for g in report.gpus:
            if g.lost:
                lost = True
                gpu_faults.append(f"gpu {g.index} lost")
            if g.ecc_uncorrected_volatile > 0:
                ecc += g.ecc_uncorrected_volatile
                gpu_faults.append(f"gpu {g.index}: {g.ecc_uncorrected_volatile} uncorrectable ECC errors")
            if g.row_remap_failed:
                remap_failed = True
                gpu_faults.append(f"gpu {g.index}: row remapping failed (memory needs service)")
            xids.extend(g.xid_events)
            oom = oom or _is_oom(g.error)
    return CleanStats(
        healthy=eng.healthy,
        engine_error=eng.error,
        running=running,
        waiting=waiting,
        kv_capacity_tokens=capacity,
        kv_free_tokens=free,
        kv_usage=usage,
        ttft_p95_ms=num("ttft_p95_ms", eng.ttft.p95_ms),
        itl_p95_ms=num("itl_p95_ms", eng.itl.p95_ms),
        ttft_count=num("ttft_count", eng.ttft.count),
        max_num_seqs=count("max_num_seqs", eng.max_num_seqs),
        preemptions_total=num("preemptions_total", eng.preemptions_total),
        gpu_telemetry_available=report.gpu_telemetry_available,
        gpu_faults=tuple(gpu_faults),
        xid_events=tuple(xids),
        ecc_uncorrected=ecc,
        gpu_lost=lost,
        row_remap_failed=remap_failed,
        oom=oom,
        flags=tuple(flags),
    )


@dataclass
class ReplicaRecord:
    hello: telemetry_pb2.Hello
    hello_at: float
    report: telemetry_pb2.Report | None = None
    report_at: float | None = None
    stats: CleanStats = field(default_factory=CleanStats)
    preemptions_per_s: float = 0.0
    completions_per_s: float = 0.0     # requests finished per second, smoothed (COMPLETIONS_TAU_S)
    streams: int = 0                   # open telemetry streams for this replica on this instance
    fault: faults.FaultState = field(default_factory=faults.FaultState)
    rates: RateEstimator = field(default_factory=RateEstimator)  # fitted from this endpoint's reports
    feedback: feedback.FeedbackState = field(default_factory=feedback.FeedbackState)  # in memory only
    state: int | None = None           # the state the last report's Ack carried
    # Its fitted prefill rate has been published as its own once (predict.unbacked_prefill: only
    # a first claim of a faster kind waits for evidence). Reset with the fit.
    prefill_settled: bool = False
    # (seats, running): a max_num_seqs its engine was seen to run past, and how many it ran
    # (_check_seats); (0, 0): none.
    seats_refuted: tuple[int, int] = (0, 0)


def _check_seats(rec: ReplicaRecord, stats: CleanStats) -> CleanStats:
    """An engine never runs more sequences than its max_num_seqs, so one seen running more proves
    the reported seats wrong (an agent's --engine-max-num-seqs that is not its engine's setting).
    From then on that figure reads as unknown: no seat wait in the pick, no seat bound in the
    admission budget, rather than a replica with room predicted full and throttled. A different
    figure (the agent restarted with the engine's own) is believed again."""
    seats = stats.max_num_seqs
    if seats <= 0:
        return stats
    refuted, most_seen = rec.seats_refuted
    if refuted != seats:   # a figure not refuted yet (or another one than the refuted)
        refuted, most_seen = 0, 0
    if stats.running > seats:
        refuted, most_seen = seats, max(most_seen, stats.running)
        rec.seats_refuted = (refuted, most_seen)
    if refuted != seats:
        return stats
    flag = f"max_num_seqs {seats} < running {most_seen} seen (seats unknown)"
    return dataclasses.replace(stats, max_num_seqs=0, flags=(*stats.flags, flag))


def _rate_estimator(hello: telemetry_pb2.Hello, cfg: RateEstimatorConfig | None = None) -> RateEstimator:
    """A fresh fit, seeded with the hello's profile figures when it carries all three."""
    prior = EngineRates(prefill_tokens_per_s=hello.prior_prefill_tokens_per_s,
                        decode_step_base_ms=hello.prior_decode_step_base_ms,
                        decode_step_per_seq_ms=hello.prior_decode_step_per_seq_ms)
    return RateEstimator(cfg or RateEstimatorConfig(), prior=prior if prior.complete else None)


@dataclass(frozen=True)
class PendingEvent:
    """A decision to record in the audit trail (the control plane writes it to etcd)."""

    kind: str
    replica_id: str
    pool: str
    reason: str


class FleetState:
    """`now` is monotonic seconds (ages, fault timers); `wall` is unix seconds (drain deadlines,
    which are timestamps in etcd)."""

    def __init__(self, policy: WeightPolicyConfig, now: Callable[[], float], *,
                 fault_policy: faults.FaultPolicyConfig | None = None,
                 feedback_policy: feedback.FeedbackConfig | None = None,
                 outlier_policy: outliers.OutlierConfig | None = None,
                 wall: Callable[[], float] = time.time,
                 on_state_change: Callable[[str], None] = lambda pool: None,
                 rate_config: RateEstimatorConfig | None = None) -> None:
        self.policy = policy
        self.rate_config = rate_config  # the engine-rate fit's (None: RateEstimatorConfig())
        self.fault_policy = fault_policy or faults.FaultPolicyConfig()
        self.feedback_policy = feedback_policy or feedback.FeedbackConfig()
        self.outlier_policy = outlier_policy or outliers.OutlierConfig()
        self._slo_targets: dict[str, tuple[float, float]] = {}   # pool -> (ttft ms, tpot ms)
        self._slo_default = (0.0, 0.0)
        self._error_streaks: dict[str, int] = {}
        self._outliers: dict[str, outliers.PoolOutliers] = {}
        self._now = now
        self._wall = wall
        self._replicas: dict[str, ReplicaRecord] = {}
        self._intents: dict[str, records_pb2.ReplicaIntent] = {}
        self._router_inflight: dict[str, int] = {}
        self._events: list[PendingEvent] = []
        # Called with the pool when a report changes its replica's state (not its weight alone):
        # the control plane then republishes that pool at once, not at the next periodic tick.
        self._on_state_change = on_state_change

    # ------------------------------------------------------------ ingest

    def on_hello(self, hello: telemetry_pb2.Hello) -> None:
        """Register or refresh a replica. Raises ValueError when the hello cannot identify it."""
        if not hello.replica_id:
            raise ValueError("hello.replica_id is empty")
        if not hello.pool:
            raise ValueError("hello.pool is empty")
        rec = self._replicas.get(hello.replica_id)
        now = self._now()
        if rec is None:
            self._replicas[hello.replica_id] = ReplicaRecord(hello=hello, hello_at=now,
                                                             rates=_rate_estimator(hello, self.rate_config))
        else:
            if hello.endpoint != rec.hello.endpoint:
                # Another engine behind the same id: what was learnt describes the old one.
                rec.rates = _rate_estimator(hello, self.rate_config)
                rec.prefill_settled = False
            rec.hello = hello
            rec.hello_at = now

    def on_report(self, hello: telemetry_pb2.Hello, report: telemetry_pb2.Report) -> ReplicaDecision:
        """Store the report with its receive time; re-register the replica if it was pruned.
        Returns the replica's current decision (for the Ack)."""
        rec = self._replicas.get(hello.replica_id)
        if rec is None:
            self.on_hello(hello)
            rec = self._replicas[hello.replica_id]
        now = self._now()
        stats = _check_seats(rec, sanitize(report))
        rate = 0.0
        if rec.report_at is not None and now > rec.report_at:
            delta = stats.preemptions_total - rec.stats.preemptions_total
            # A counter that went down means the engine restarted: no rate this time.
            rate = delta / (now - rec.report_at) if delta > 0 else 0.0
        rec.report, rec.report_at, rec.stats, rec.preemptions_per_s = report, now, stats, rate
        if report.HasField("engine") and report.engine.HasField("work"):
            window = WorkWindow.from_proto(report.engine.work)
            rec.rates.observe(window)
            rec.completions_per_s = smoothed_rate(rec.completions_per_s, window.finished_requests, window.interval_s)
        signals = faults.FaultSignals(
            healthy=stats.healthy, engine_error=stats.engine_error, xid_events=stats.xid_events,
            ecc_uncorrected=stats.ecc_uncorrected, gpu_lost=stats.gpu_lost, oom=stats.oom,
            preemptions_per_s=rate, row_remap_failed=stats.row_remap_failed)
        self._apply_fault(rec, faults.step(rec.fault, signals, now, self.fault_policy))
        ttft_t, tpot_t = self._slo_targets.get(rec.hello.pool, self._slo_default)
        rec.feedback = feedback.step(rec.feedback, feedback.FeedbackSample(
            stats.ttft_p95_ms, stats.itl_p95_ms, stats.ttft_count, ttft_t, tpot_t), self.feedback_policy)
        decision = decide(self._view(rec, now), self.policy)
        if decision.state != rec.state:
            rec.state = decision.state
            self._on_state_change(rec.hello.pool)
        return decision

    def _apply_fault(self, rec: ReplicaRecord, result: faults.FaultStep) -> None:
        rec.fault = result.state
        for ev in result.events:
            self._events.append(PendingEvent(ev.kind, rec.hello.replica_id, rec.hello.pool, ev.reason))

    def restore(self, entries: Iterable[records_pb2.RouteEntry], pool: str, at: float | None = None) -> list[str]:
        """A new leader learns the replicas of the last published table of `pool` (endpoint,
        location) as if each had said hello at `at` (the term's start; default now): unknown
        for now, not stale (see `tidegate.policy.continuity`). Replicas already known here are
        left alone. Returns the ids added."""
        now = self._now() if at is None else at
        added = []
        for e in entries:
            if not e.replica_id or e.replica_id in self._replicas:
                continue
            hello = telemetry_pb2.Hello(replica_id=e.replica_id, pool=pool, endpoint=e.endpoint,
                                        region=e.region, zone=e.zone)
            self._replicas[e.replica_id] = ReplicaRecord(hello=hello, hello_at=now)
            added.append(e.replica_id)
        return added

    def fault_states(self) -> dict[str, faults.FaultState]:
        """Every replica's fault-policy state (what `controlplane.faultbook` persists)."""
        return {rid: rec.fault for rid, rec in self._replicas.items()}

    def restore_fault(self, replica_id: str, state: faults.FaultState) -> bool:
        """A new leader's copy of a fault state from etcd, for a replica still in the default
        state here (what this instance learnt itself wins). Returns whether it was applied."""
        rec = self._replicas.get(replica_id)
        if rec is None or rec.fault != faults.FaultState():
            return False
        rec.fault = state
        return True

    def heard_since(self, since: float) -> set[str]:
        """Replicas with a report received at or after `since` (monotonic seconds)."""
        return {rid for rid, rec in self._replicas.items() if rec.report_at is not None and rec.report_at >= since}

    def stream_opened(self, replica_id: str) -> None:
        rec = self._replicas.get(replica_id)
        if rec is not None:
            if rec.streams == 0:
                self._apply_fault(rec, faults.reconnected(rec.fault, self._now()))
            rec.streams += 1
            # Reports sent while no stream was open are lost: the next window need not follow
            # the last one received, so it must not be merged with it.
            rec.rates.interrupt()

    def stream_closed(self, replica_id: str) -> None:
        # The replica stays: it goes STALE, then is pruned, unless it reconnects.
        rec = self._replicas.get(replica_id)
        if rec is not None and rec.streams > 0:
            rec.streams -= 1

    def set_intents(self, intents: Mapping[str, records_pb2.ReplicaIntent]) -> None:
        self._intents = dict(intents)

    def set_router_inflight(self, inflight: Mapping[str, int]) -> None:
        """Requests the routers hold per replica (sum over RouterPresence records)."""
        self._router_inflight = dict(inflight)

    def router_inflight(self, replica_id: str) -> int:
        return self._router_inflight.get(replica_id, 0)

    def set_slo_targets(self, targets: Mapping[str, tuple[float, float]],
                        default: tuple[float, float] = (0.0, 0.0)) -> None:
        """Pool -> (TTFT, TPOT) targets in ms that the SLO feedback compares reports against;
        `default` for pools without their own (0 = none)."""
        self._slo_targets = dict(targets)
        self._slo_default = default

    def set_router_error_streaks(self, streaks: Mapping[str, int]) -> None:
        """Consecutive upstream errors per replica (the largest any router reports)."""
        self._error_streaks = dict(streaks)

    def evaluate_outliers(self, now: float | None = None) -> None:
        """One outlier-ejection round per pool (call once per tick); events go to take_events()."""
        now = self._now() if now is None else now
        by_pool: dict[str, list[outliers.OutlierInput]] = {}
        for rid, rec in sorted(self._replicas.items()):
            d = decide(self._view(rec, now, with_outliers=False), self.policy)
            by_pool.setdefault(rec.hello.pool, []).append(outliers.OutlierInput(
                rid, d.state in ROUTABLE_STATES, self._error_streaks.get(rid, 0),
                rec.stats.ttft_p95_ms, rec.stats.ttft_count))
        result = {}
        for pool, inputs in by_pool.items():
            prev = self._outliers.get(pool, outliers.PoolOutliers())
            res = outliers.evaluate(inputs, prev.states, now, self.outlier_policy)
            for rid, ev in res.events:
                self._events.append(PendingEvent(ev.kind, rid, pool, ev.reason))
            if res.panic != prev.panic:
                self._events.append(PendingEvent(
                    "outlier_panic" if res.panic else "outlier_panic_over", "", pool,
                    "too few healthy replicas: outlier ejections lifted, routing to all" if res.panic
                    else "enough healthy replicas: outlier ejections apply again"))
            result[pool] = res
        self._outliers = result

    def outlier_panic(self, pool: str) -> bool:
        res = self._outliers.get(pool)
        return bool(res and res.panic)

    def take_events(self) -> list[PendingEvent]:
        """Automatic decisions since the last call (eject, readmit)."""
        out, self._events = self._events, []
        return out

    # ------------------------------------------------------------ read

    def get(self, replica_id: str) -> ReplicaRecord | None:
        return self._replicas.get(replica_id)

    def intent(self, replica_id: str) -> records_pb2.ReplicaIntent | None:
        return self._intents.get(replica_id)

    def view(self, replica_id: str, now: float | None = None) -> ReplicaView | None:
        rec = self._replicas.get(replica_id)
        if rec is None:
            return None
        # As the table shows it: among its pool's views (an unbacked rate claim, views()).
        return next(v for v in self.views(now, pools=(rec.hello.pool,)) if v.replica_id == replica_id)

    def views(self, now: float | None = None, pools: Collection[str] | None = None) -> list[ReplicaView]:
        """Every replica's view, or those of `pools` only."""
        now = self._now() if now is None else now
        views = [self._view(rec, now) for _, rec in sorted(self._replicas.items())
                 if pools is None or rec.hello.pool in pools]
        return self._backed(views)

    def _backed(self, views: list[ReplicaView]) -> list[ReplicaView]:
        """A replica's first prefill rate that claims a faster kind of GPU is published only once
        its fit backs the claim; until then the pool's median (predict.unbacked_prefill)."""
        by_pool: dict[str, dict[str, float]] = {}
        for v in views:
            by_pool.setdefault(v.pool, {})[v.replica_id] = v.prefill_tokens_per_s
        swap: dict[str, float] = {}
        recs = self._replicas
        for figures in by_pool.values():
            swap.update(unbacked_prefill(figures, lambda rid: recs[rid].rates.prefill_rel_se(),
                                         lambda rid: recs[rid].prefill_settled))
            for rid, figure in figures.items():
                if figure > 0 and rid not in swap:
                    recs[rid].prefill_settled = True
        if not swap:
            return views
        return [dataclasses.replace(v, prefill_tokens_per_s=swap[v.replica_id]) if v.replica_id in swap else v
                for v in views]

    def pools(self) -> dict[str, str]:
        """replica id -> pool, without computing views."""
        return {rid: rec.hello.pool for rid, rec in self._replicas.items()}

    def prune(self, now: float | None = None) -> list[str]:
        """Forget replicas without a report (or hello) for longer than remove_after_s."""
        now = self._now() if now is None else now
        gone = [rid for rid, rec in self._replicas.items()
                if now - _last_seen(rec) > self.policy.remove_after_s]
        for rid in gone:
            del self._replicas[rid]
        return sorted(gone)

    def __len__(self) -> int:
        return len(self._replicas)

    def _view(self, rec: ReplicaRecord, now: float, with_outliers: bool = True) -> ReplicaView:
        h = rec.hello
        intent = self._intents.get(h.replica_id)
        draining = bool(intent and intent.draining)
        hold = expired = force = False
        if intent is not None and draining:
            wall = self._wall()
            created = intent.created_at.ToNanoseconds() / 1e9 if intent.HasField("created_at") else 0.0
            hold = intent.grace_period_s > 0 and wall < created + intent.grace_period_s
            expired = intent.HasField("drain_deadline") and wall >= intent.drain_deadline.ToNanoseconds() / 1e9
            force = intent.force
        ejected, cut = faults.view_reasons(rec.fault, now)
        if not ejected and with_outliers and h.pool in self._outliers:
            ejected = self._outliers[h.pool].ejected_reason(h.replica_id, now)
        if rec.report is None:
            # Hello only (JOINING): no engine numbers, rates or feedback yet.
            s, preempt, rates, factor, note = _NO_STATS, 0.0, _NO_RATES, 1.0, ""
        else:
            s, preempt, rates = rec.stats, rec.preemptions_per_s, rec.rates.published
            factor, note = rec.feedback.multiplier, feedback.describe(rec.feedback)
        # One construction, not a base view and dataclasses.replace(): views are built for every
        # replica several times per tick, and replace() cost more than the view itself.
        return ReplicaView(
            replica_id=h.replica_id, pool=h.pool, endpoint=h.endpoint, region=h.region, zone=h.zone,
            has_report=rec.report is not None,
            report_age_s=max(0.0, now - _last_seen(rec)),
            cordoned=bool(intent and intent.cordoned),
            draining=draining,
            router_inflight=self._router_inflight.get(h.replica_id, 0),
            drain_hold=hold, drain_expired=expired, drain_force=force,
            ejected=ejected, cut=cut,
            healthy=s.healthy, engine_error=s.engine_error, running=s.running, waiting=s.waiting,
            kv_capacity_tokens=s.kv_capacity_tokens, kv_free_tokens=s.kv_free_tokens, kv_usage=s.kv_usage,
            ttft_p95_ms=s.ttft_p95_ms, itl_p95_ms=s.itl_p95_ms, preemptions_per_s=preempt,
            gpu_telemetry_available=s.gpu_telemetry_available, gpu_faults=s.gpu_faults,
            telemetry_flags=s.flags, prefill_tokens_per_s=rates.prefill_tokens_per_s,
            decode_step_base_ms=rates.decode_step_base_ms, decode_step_per_seq_ms=rates.decode_step_per_seq_ms,
            max_num_seqs=s.max_num_seqs, slo_factor=factor, slo_note=note,
        )


_NO_STATS = CleanStats()
_NO_RATES = EngineRates()


def _last_seen(rec: ReplicaRecord) -> float:
    return rec.report_at if rec.report_at is not None else rec.hello_at
