"""The event loop: replicas, agents, the control plane's weight code and N routers, on a virtual clock.

What runs, and with which real code:

- each replica is a `simulator.engine.Engine` (fleetsim.replica), at its profile's speed unless a
  `Slowdown` (SimConfig.slowdowns) makes its steps longer from some time on: a degraded GPU that
  only its own telemetry reveals;
- each agent samples its engine every `report_interval_s` (phases spread at random over the
  first interval, like agents started at different times) and builds the same Report as the
  real agent (fleetsim.agent);
- the control plane is the real `controlplane.fleet.FleetState` (sanitize, on_report, views)
  on the virtual clock; every `tick_s` it runs the real `tidegate.policy.weights
  .compute_pool_tables`; the table is written, and reaches every router `propagation_s` later
  (etcd write + watch), only when the real publisher would write it: when
  `controlplane.publisher.routing_key` (replica, endpoint, location, state, weight) changed. The
  queue/KV/latency/rate figures in an entry are therefore a snapshot from the last such write;
- `routers` routers (SimConfig.routers), each with its own policy instance (its own prefix
  index, cursor...), its own in-flight counts (acquired at dispatch, released when the request
  finishes) and its own delivered table; requests are spread over them round-robin (`rr`, like a
  Kubernetes Service or an L4 balancer in front of stateless routers) or by a session hash
  (`hash`: the request's first prefix hash, so one client's prefix-sharing traffic meets one
  router; requests without prefix hashes go round-robin). The control plane sees the routers'
  in-flight counts summed;
- with several routers, each whose policy has `take_report` (`tidegate`) hands its per-replica
  load, the prefix blocks its requests used and those of its requests that finished (peers pin
  the first until the second) to its peers' `on_peer_load` every `peer_interval_s`
  (default 0.05 s, the live router's `--peer-load-interval-s`; 0: off), delivered
  `propagation_s` later, as the live router's etcd load record; other policies share nothing;
- a router may poll every engine's queue and KV itself (`scrape_interval_s`, else the policy's
  own `scrape_interval_s` attribute: `llmd` polls every 50 ms as llm-d's endpoint picker does);
  those figures then replace the table's (weights and states still come only from the control
  plane, so the `tidegate` policy is unaffected). Router 0's scrape starts one interval after the
  start, the others at random phases: routers are not synchronised, and scraping in lockstep
  would make them herd together onto the same stale view (measured: 2x the TTFT p50);
- requests no replica can ever serve (prompt + output beyond every profile's context, or a
  prompt beyond every KV cache) are answered as client errors at once (`rejected =
  "client_error"`), as the router's request validation would; they reach no policy;
- admission (SimConfig.admission, for policies with `predictions`: `tidegate`): each router runs
  the live router's code, `tidegate.policy.admission` (an AdmissionQueue per router, `pump` to
  dispatch and reject): a request is dispatched, held in the router's queue, or rejected with a
  reason (`rejected` = queue_full, deadline_unmeetable, shed, queue_timeout, at `reject_s`). The
  live router pumps on every first token, completion and table change; here a router with held
  requests pumps every `wake_s` of virtual time and at each arrival it takes (engine events are
  seen when the engines are advanced, which happens then). Held time counts in TTFT. With
  several routers, what each one's queue holds (`held_report`: prefill tokens per class, its
  critical head's slack) rides with its peer load report to the others' `on_peer_held` (class
  order across routers; the live router's load record carries it too, `HeldLoad`);
- admission budgets (SimConfig.budgets, with admission): every control-plane tick the real
  `controlplane.admission_budgets.BudgetPublisher.compute` splits the pool's budget among the
  routers by the demand each reports (what its presence record carries: held + queued + refused),
  and the record reaches the routers `propagation_s` later when the publisher's `moved` rule would
  write it; each router keeps its share in the live router's `AdmissionBudgets` ledger and its
  queue asks it as part of every dispatch decision (`Placement.within_budget`). Demand is read
  every tick here, every presence interval (2 s) live.

Events at one instant are handled in the order: table delivery, router scrape, agent report,
control-plane tick, arrival. Before an event at time t that reads engine state every engine it reads is
advanced to t (all of them before an arrival, since the pick reads the router's in-flight counts;
the reporting one before a report), so nothing is seen before it happens and nothing that has
happened is missed. The agents and the control plane start `warmup_s`
before the first arrival, so the first requests find a published table. Deterministic for a seed.
"""

from __future__ import annotations

import heapq
import math
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from tidegate import codec, keys
from tidegate.controlplane.admission_budgets import BudgetPublisher, moved
from tidegate.controlplane.fleet import FleetState
from tidegate.controlplane.publisher import routing_key
from tidegate.errors import RequestError
from tidegate.fleetsim.agent import SimAgent
from tidegate.fleetsim.replica import SimReplica
from tidegate.fleetsim.workload import SimRequest
from tidegate.policy import admission as adm
from tidegate.policy.admission_budget import BudgetConfig, Hold, Tokens
from tidegate.policy.classes import class_of
from tidegate.policy.peer_queues import HeldReport
from tidegate.policy.predict import Prediction
from tidegate.policy.rates import RateEstimatorConfig
from tidegate.policy.registry import (
    LiveLoad,
    Policy,
    PoolSnapshot,
    RequestFeatures,
    RouteInfo,
    SloTargets,
    enforce_tpot_plan,
    expected_output,
    notify,
    notify_output,
    notify_tpot,
)
from tidegate.policy.tpot_plan import EARLY_TOKENS
from tidegate.policy.weights import WeightPolicyConfig, compute_pool_tables
from tidegate.router.admission_budgets import AdmissionBudgets
from tidegate.simulator.profiles import Profile
from tidegate.store.api import KeyValue
from tidegate.v1 import records_pb2

_DELIVER, _SCRAPE, _REPORT, _TICK, _WAKE, _BUDGET, _PEER_PUBLISH, _PEER_DELIVER = 0, 1, 2, 3, 4, 5, 6, 7
ROUTER_SPREADS = ("rr", "hash")
CLIENT_ERROR = "client_error"


@dataclass(frozen=True)
class Slowdown:
    """Replica `replica` (its index) runs every step `factor` times slower from `from_s` seconds
    after the first arrival (0: from the start)."""

    replica: int
    factor: float
    from_s: float = 0.0

    def __post_init__(self) -> None:
        if self.replica < 0 or not (1.0 < self.factor < 100.0) or not (0.0 <= self.from_s < math.inf):
            raise ValueError(f"slowdown {self!r}: need replica >= 0, 1 < factor < 100, 0 <= from_s < inf")


@dataclass(frozen=True)
class SimConfig:
    report_interval_s: float = 1.0
    tick_s: float = 0.5
    propagation_s: float = 0.005
    # Client -> router -> engine transport, each way (HTTP hops, the router's own work): the
    # request reaches the engine this much after it arrives, and every token reaches the client
    # this much after the engine produced it. 0 = an ideal network.
    hop_s: float = 0.0
    warmup_s: float = 3.0
    window_s: float = 30.0              # the agents' latency window
    pool: str = "sim"
    max_drain_s: float = 6 * 3600.0     # after the last arrival; what is still running then is aborted
    weights: WeightPolicyConfig = field(default_factory=WeightPolicyConfig)
    record_samples: bool = False        # keep (t, running, waiting, kv) per report, for plots
    engine_fast_path: bool = True       # Engine.advance when it exists; False: step by step (reference)
    # The router's own scrape of every engine (llm-d's EPP polls each engine every 50 ms): when
    # set, the running / waiting / KV figures the router's policy sees are refreshed from the
    # engines this often; weights and states still come only from the control plane's tables.
    scrape_interval_s: float | None = None
    routers: int = 1
    router_spread: str = "rr"           # rr | hash (see the module doc)
    # The router the first request reaches under rr (the rest follow in turn): another assignment
    # of the same trace to the same routers, to measure how far a several-router figure moves with
    # which router each request happens to reach (docs/BENCHMARKS.md, "How far one run moves").
    router_offset: int = 0
    # With several routers, how often each publishes its own per-replica load and learned prefix
    # blocks to its peers (the live router's load record, written every 0.05 s by default:
    # RouterConfig.peer_load_interval_s); it reaches them `propagation_s` later. Only policies
    # with `take_report` publish. 0 or None: routers share nothing, and policies scale their own
    # load up to the pool's.
    peer_interval_s: float | None = 0.05
    # Requests carry no max_tokens (as from clients that set no cap): the replay's max_tokens is
    # otherwise the true output length, which no real client knows in advance.
    hide_max_tokens: bool = False
    # Or only this share of them, chosen by the seed and each request's id (a fleet where some
    # clients send max_tokens and others do not).
    hide_max_tokens_share: float = 0.0
    # Requests that send max_tokens send max(this, their true output): clients that set one
    # generous cap (4,096, say) whatever the answer (None: the true output, as the replay does).
    max_tokens_cap: int | None = None
    # Stop as soon as more than `stop_after_misses` requests are known to miss the SLOs
    # (stop_slo = (ttft_s, tpot_s)): the SLO-capacity search only needs to know that a rate fails.
    stop_after_misses: int | None = None
    stop_slo: tuple[float, float] = (math.inf, math.inf)
    slo: SloTargets | None = None       # given to the policies in every PoolSnapshot (None: their default)
    # Router admission (queue, early rejection, TPOT protection) for policies with `predictions`;
    # None: every request is dispatched at once, as before.
    admission: adm.AdmissionConfig | None = None
    wake_s: float = 0.01                # how often a router with held requests looks again
    # Admission budgets shared by the routers (with admission): the control plane's
    # BudgetPublisher.compute every tick on its tables and the routers' demand, the record
    # delivered when the publisher would write it; None: no budget, as before.
    budgets: BudgetConfig | None = None
    budget_refresh_s: float = 30.0      # the publisher's rewrite of an unmoved record
    # The replicas' ids, one per profile (default replica-00, replica-01, ...). Rendezvous homes of
    # prefix affinity hash them, so a comparison with a live fleet gives that fleet's ids.
    replica_ids: tuple[str, ...] = ()
    rates: RateEstimatorConfig | None = None  # the control plane's engine-rate fit (None: its default)
    # Degraded replicas (a throttled GPU, a noisy neighbour): (replica index, from s after the first
    # arrival, factor): from then on every step of that replica lasts `factor` times its profile's.
    # Nothing tells the control plane or the routers but the replica's own telemetry.
    slowdowns: tuple[Slowdown, ...] = ()

    def __post_init__(self) -> None:
        if not (self.report_interval_s > 0 and self.tick_s > 0 and self.propagation_s >= 0 and self.warmup_s >= 0
                and self.hop_s >= 0):
            raise ValueError("need report_interval_s > 0, tick_s > 0, propagation_s >= 0, warmup_s >= 0, hop_s >= 0")
        if self.scrape_interval_s is not None and not self.scrape_interval_s > 0:
            raise ValueError("scrape_interval_s must be positive (or None)")
        if self.routers < 1:
            raise ValueError("routers must be >= 1")
        if self.peer_interval_s is not None and not (math.isfinite(self.peer_interval_s) and self.peer_interval_s >= 0):
            raise ValueError(f"peer_interval_s must be a finite number of seconds >= 0 (0 or None: off), "
                             f"not {self.peer_interval_s!r}")
        if not self.wake_s > 0:
            raise ValueError("wake_s must be positive")
        if not 0.0 <= self.hide_max_tokens_share <= 1.0:
            raise ValueError("hide_max_tokens_share must be in [0, 1]")
        if self.max_tokens_cap is not None and self.max_tokens_cap < 1:
            raise ValueError("max_tokens_cap must be >= 1 (None: the true output)")
        if self.router_spread not in ROUTER_SPREADS:
            raise ValueError(f"router_spread must be one of {', '.join(ROUTER_SPREADS)}")
        if self.router_offset < 0:
            raise ValueError("router_offset must be >= 0")
        if len(set(self.replica_ids)) != len(self.replica_ids) or not all(self.replica_ids):
            raise ValueError("replica_ids must be distinct and non-empty")
        if len({d.replica for d in self.slowdowns}) != len(self.slowdowns):
            raise ValueError("slowdowns: at most one per replica")


@dataclass(slots=True)
class RequestRecord:
    req: SimRequest
    replica: str | None = None
    rejected: str = ""                  # why, when the request was never served
    router: int = 0
    first_token_s: float | None = None
    finish_s: float | None = None
    queue_s: float | None = None        # TTFT minus its own prefill alone (see results.py)
    dispatch_s: float | None = None     # when the router sent it (later than arrival when it was held)
    reject_s: float | None = None       # when the router rejected it (admission)
    cached_tokens: int = 0
    preemptions: int = 0

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.req.arrival_s

    @property
    def tpot_s(self) -> float | None:
        if self.finish_s is None or self.first_token_s is None or self.req.output_tokens <= 1:
            return None
        return (self.finish_s - self.first_token_s) / (self.req.output_tokens - 1)


@dataclass(frozen=True)
class ReplicaSummary:
    replica_id: str
    profile: str
    busy_s: float
    peak_kv: float
    requests: int
    preemptions: int


@dataclass(frozen=True)
class TableDelivery:
    computed_s: float
    delivered_s: float
    entries: tuple[RouteInfo, ...]


@dataclass
class SimResult:
    records: list[RequestRecord]
    replicas: list[ReplicaSummary]
    end_s: float
    deliveries: list[TableDelivery]
    samples: dict[str, list[tuple[float, int, int, float]]]
    engine_fast_path: bool
    stopped_early: bool = False         # stop_after_misses was exceeded; unfinished requests were cut
    # Per router, the measured margins its decisions ended the run with (admission runs):
    # "tpot_plan" / "tpot_plan_critical" (realized over planned TPOT, tpot_plan.py) and "ttft"
    # (seconds, admission.py). Where several routers plan worse than one, these show it.
    margins: list[dict[str, float]] = field(default_factory=list)


VIRTUAL_EPOCH = 1_700_000_000.0  # unix seconds at virtual time 0, for FleetState's wall clock


def _fleet_state(weights: WeightPolicyConfig, now, rates: RateEstimatorConfig | None = None) -> FleetState:
    """The control plane's FleetState on the virtual clock (its wall clock too)."""
    return FleetState(weights, now=now, wall=lambda: VIRTUAL_EPOCH + now(), rate_config=rates)


def _route_info(e) -> RouteInfo:  # e: tidegate.v1.RouteEntry
    return RouteInfo.from_entry(e)


def servable(profiles: Sequence[Profile], prompt_tokens: int, output_tokens: int) -> bool:
    """Whether some replica could ever serve the request (its context and KV cache hold it)."""
    return any(prompt_tokens <= p.kv_capacity_tokens and prompt_tokens + output_tokens <= p.max_model_len
               for p in profiles)


def session_router(req: SimRequest, routers: int) -> int | None:
    """The router of a request's session under `hash` spread: its first prefix hash, hashed
    stably across processes; None without prefix hashes."""
    if not req.prefix_hashes:
        return None
    return zlib.crc32(repr(req.prefix_hashes[0]).encode()) % routers


class SimRouter:
    """One router: its own policy instance, in-flight counts, delivered table and scrape."""

    __slots__ = ("budgets", "inflight", "policy", "queue", "rng", "router_id", "scrape_s", "scraped", "table", "view",
                 "wants_live", "waking")

    def __init__(self, policy: Policy, replica_ids: Sequence[str], rng: random.Random,
                 scrape_s: float | None) -> None:
        self.policy = policy
        self.rng = rng
        self.inflight: dict[str, int] = {rid: 0 for rid in replica_ids}
        self.table: tuple[RouteInfo, ...] = ()      # as delivered by the control plane
        self.view: tuple[RouteInfo, ...] = ()       # what the policy sees: the table, plus the scrape
        self.scraped: dict[str, tuple[int, int, int, int]] = {}
        self.scrape_s = scrape_s
        self.wants_live = bool(getattr(policy, "reads_live_state", False))
        self.queue: adm.AdmissionQueue | None = None
        self.waking = False
        self.router_id = ""
        self.budgets: AdmissionBudgets | None = None   # the live router's ledger of its shares

    def refresh_view(self) -> None:
        if not self.scraped:
            self.view = self.table
            return
        out = []
        for e in self.table:
            m = self.scraped.get(e.replica_id)
            out.append(e if m is None else replace(e, running=m[0], waiting=m[1], kv_free_tokens=m[2],
                                                   kv_capacity_tokens=m[3]))
        self.view = tuple(out)


class Simulation:
    def __init__(self, profiles: Sequence[Profile], policy: Policy | Sequence[Policy],
                 requests: Sequence[SimRequest], cfg: SimConfig | None = None, seed: int = 0) -> None:
        """`policy`: one instance, or one per router (`cfg.routers` of them, each its own state)."""
        if not profiles:
            raise ValueError("need at least one replica")
        self.cfg = cfg or SimConfig()
        self._seed = seed
        policies = list(policy) if isinstance(policy, Sequence) else [policy]
        if len(policies) != self.cfg.routers:
            raise ValueError(f"need one policy instance per router ({self.cfg.routers}), got {len(policies)}")
        if len({id(p) for p in policies}) != len(policies):
            raise ValueError("each router needs its own policy instance")
        self.policy = policies[0]
        self._profiles = tuple(profiles)
        self.requests = sorted(requests, key=lambda r: (r.arrival_s, r.index))
        self.now = -self.cfg.warmup_s + (self.requests[0].arrival_s if self.requests else 0.0)
        phase_rng = random.Random(f"phases/{seed}")
        width = max(2, len(str(len(profiles) - 1)))
        ids = self.cfg.replica_ids or tuple(f"replica-{i:0{width}d}" for i in range(len(profiles)))
        if len(ids) != len(profiles):
            raise ValueError(f"{len(ids)} replica ids for {len(profiles)} replicas")
        self.replicas = [SimReplica(rid, p, random.Random(f"engine/{seed}/{i}"), self.now,
                                 use_engine_advance=self.cfg.engine_fast_path)
                         for i, (rid, p) in enumerate(zip(ids, profiles, strict=True))]
        first = self.requests[0].arrival_s if self.requests else 0.0
        for d in self.cfg.slowdowns:
            if d.replica >= len(self.replicas):
                raise ValueError(f"slowdown of replica {d.replica}: the fleet has {len(self.replicas)}")
            rep = self.replicas[d.replica]
            rep.slow_down(first + d.from_s if d.from_s > 0 else self.now, d.factor)
        self.agents = [SimAgent(r.replica_id, self.cfg.pool, self.cfg.window_s) for r in self.replicas]
        self.fleet = _fleet_state(self.cfg.weights, lambda: self.now, self.cfg.rates)
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        for i, agent in enumerate(self.agents):
            self.fleet.on_hello(agent.hello)
            self._push(self.now + phase_rng.uniform(0.0, self.cfg.report_interval_s), _REPORT, i)
        self._push(self.now + self.cfg.tick_s, _TICK, None)
        ids = tuple(r.replica_id for r in self.replicas)
        # Router 0 keeps the single router's RNG stream, so a 1-router run is what it always was.
        self.routers = [
            SimRouter(p, ids, random.Random(f"router/{seed}" if k == 0 else f"router/{seed}/{k}"),
                      self.cfg.scrape_interval_s if self.cfg.scrape_interval_s is not None
                      else getattr(p, "scrape_interval_s", None))
            for k, p in enumerate(policies)]
        for k, router in enumerate(self.routers):
            if self.cfg.admission is not None and callable(getattr(router.policy, "predictions", None)):
                router.queue = adm.AdmissionQueue(self.cfg.admission)
                enforce_tpot_plan(router.policy)
            # Its id as its peers' reports will name it (_peer_deliver), as the live router's
            # PeerLoadWatcher binds its own.
            bind = getattr(router.policy, "bind_router", None)
            if callable(bind):
                bind(f"router-{k}")
        self.admission = any(r.queue is not None for r in self.routers)
        # Admission budgets: the control plane's publisher (compute only: the sim delivers what it
        # would write) and, per router, the live router's ledger of its shares.
        self._budget_pub: BudgetPublisher | None = None
        self._budget_written: tuple[records_pb2.AdmissionBudget, float] | None = None
        self._holds: dict[str, Hold] = {}
        if self.cfg.budgets is not None and self.admission:
            self._budget_pub = BudgetPublisher(None, "sim", self.cfg.budgets,
                                               refresh_s=self.cfg.budget_refresh_s,
                                               wall_clock=lambda: VIRTUAL_EPOCH + self.now)
            for k, router in enumerate(self.routers):
                router.router_id = f"router-{k}"
                router.budgets = AdmissionBudgets(None, router.router_id)
        self._slo = self.cfg.slo or SloTargets()
        self._held = 0
        for k, router in enumerate(self.routers):
            if router.scrape_s is not None:
                phase = router.scrape_s if k == 0 else phase_rng.uniform(0.0, router.scrape_s)
                self._push(self.now + phase, _SCRAPE, k)
        if self.cfg.peer_interval_s and len(self.routers) > 1:
            for k, router in enumerate(self.routers):
                if callable(getattr(router.policy, "take_report", None)):
                    self._push(self.now + phase_rng.uniform(0.0, self.cfg.peer_interval_s), _PEER_PUBLISH, k)
        self._published_key: tuple | None = None
        self._rr = self.cfg.router_offset
        self.inflight: dict[str, int] = {rid: 0 for rid in ids}   # all routers together
        self.records: dict[str, RequestRecord] = {}
        self._features: dict[str, RequestFeatures] = {}
        self._budget_tokens: dict[str, Tokens] = {}   # per request id, while it is in flight (_tokens)
        # Admitted requests' predicted TTFT at dispatch, until their first token (the TTFT margin).
        self._predicted_ttft: dict[str, float] = {}
        self._counts = {r.replica_id: 0 for r in self.replicas}
        self._by_id = {r.replica_id: (r, a) for r, a in zip(self.replicas, self.agents, strict=True)}
        self.deliveries: list[TableDelivery] = []
        self.samples: dict[str, list[tuple[float, int, int, float]]] = {r.replica_id: [] for r in self.replicas}
        self._outstanding = 0
        self._misses = 0

    def _push(self, t: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, payload))

    # ------------------------------------------------------------------ the loop

    def run(self) -> SimResult:
        reqs = self.requests
        n = len(reqs)
        ai = 0
        last_arrival = reqs[-1].arrival_s if reqs else self.now
        deadline = last_arrival + self.cfg.max_drain_s
        heap = self._heap
        budget = self.cfg.stop_after_misses
        stopped = False
        while True:
            if ai >= n and self._outstanding == 0 and self._held == 0:
                break
            if budget is not None and self._misses > budget:
                stopped = True
                break
            t_next = heap[0][0]
            if ai < n and reqs[ai].arrival_s < t_next:
                t = reqs[ai].arrival_s
                if t > self.now:
                    self._advance(t)
                self._arrive(reqs[ai])
                ai += 1
                continue
            if t_next > deadline:
                break
            t, kind, _, payload = heapq.heappop(heap)
            # Table deliveries and control-plane ticks read no engine state, and a report reads
            # only its own replica's, so only arrivals (whose pick reads the router's in-flight
            # counts, i.e. every engine's completions) advance every engine.
            self.now = t
            if kind == _DELIVER:
                self._deliver(payload)  # type: ignore[arg-type]
            elif kind == _SCRAPE:
                self._scrape(t, payload)  # type: ignore[arg-type]
            elif kind == _REPORT:
                self._report(payload)  # type: ignore[arg-type]
            elif kind == _WAKE:
                self._wake(payload)  # type: ignore[arg-type]
            elif kind == _BUDGET:
                self._deliver_budget(payload)  # type: ignore[arg-type]
            elif kind == _PEER_PUBLISH:
                self._peer_publish(payload)  # type: ignore[arg-type]
            elif kind == _PEER_DELIVER:
                self._peer_deliver(payload)  # type: ignore[arg-type]
            else:
                self._tick()
        end = self.now
        for rec in self.records.values():
            if rec.finish_s is None and not rec.rejected:
                rec.rejected = "unfinished"
        return SimResult(
            records=[self.records[r.req_id] for r in reqs if r.req_id in self.records],
            replicas=[ReplicaSummary(r.replica_id, r.profile.name, r.busy_s, r.peak_kv, self._counts[r.replica_id],
                                     r.engine.stats().preemptions_total) for r in self.replicas],
            end_s=end,
            deliveries=self.deliveries,
            samples=self.samples,
            engine_fast_path=all(r.native_advance for r in self.replicas),
            stopped_early=stopped,
            margins=[self._margins(r) for r in self.routers] if self.admission else [],
        )

    @staticmethod
    def _margins(router: SimRouter) -> dict[str, float]:
        out: dict[str, float] = {}
        plan = getattr(router.policy, "tpot_plan", None)
        if plan is not None:
            out["tpot_plan"], out["tpot_plan_critical"] = plan.margin, plan.critical_margin
        if router.queue is not None:
            out["ttft"] = router.queue.ttft_margin
        return out

    def _advance(self, t: float) -> None:
        self.now = t
        for rep in self.replicas:
            if rep.idle_until(t):
                continue
            for ev in rep.advance(t):
                self._on_event(rep, ev.kind, ev.req_id, ev.t_s)

    def _advance_one(self, rep: SimReplica, t: float) -> None:
        for ev in rep.advance(t):
            self._on_event(rep, ev.kind, ev.req_id, ev.t_s)

    def _on_event(self, rep: SimReplica, kind: str, req_id: str, t_s: float) -> None:
        rec = self.records.get(req_id)
        if rec is None:
            return
        # the engine measures from its own arrival
        engine_arrival = (rec.req.arrival_s if rec.dispatch_s is None else rec.dispatch_s) + self.cfg.hop_s
        engine_t = t_s
        t_s += self.cfg.hop_s  # when the client sees it
        if kind == "first_token":
            if rec.first_token_s is None:
                rec.first_token_s = t_s
                if t_s - rec.req.arrival_s > self.cfg.stop_slo[0]:
                    self._misses += 1
                self._by_id[rep.replica_id][1].observe_ttft(engine_t - engine_arrival)
                predicted = self._predicted_ttft.pop(req_id, None)
                queue = self.routers[rec.router].queue
                if predicted is not None and queue is not None and rec.dispatch_s is not None:
                    queue.observe_ttft(predicted, t_s - rec.dispatch_s)
                hold = self._holds.get(req_id)
                if hold is not None:  # its prompt is prefilled: out of the budget's prefill tokens
                    hold.first_token()
                notify(self.routers[rec.router].policy, "on_first_token", self._features[req_id], rep.replica_id)
        elif kind == "finished":
            if rec.finish_s is not None:
                return
            rec.finish_s = t_s
            self._predicted_ttft.pop(req_id, None)
            if rec.first_token_s is None:
                rec.first_token_s = t_s
                if t_s - rec.req.arrival_s > self.cfg.stop_slo[0]:
                    self._misses += 1
            elif rec.first_token_s - rec.req.arrival_s <= self.cfg.stop_slo[0]:
                tpot = rec.tpot_s
                if tpot is not None and tpot > self.cfg.stop_slo[1]:
                    self._misses += 1
            res = rep.engine.pop_result(req_id)
            early = None
            if res is not None:
                rec.cached_tokens = res.cached_tokens
                if res.stamp_s is not None and res.first_token_s is not None:  # as the live router times it
                    early = (res.stamp_s - res.first_token_s) / EARLY_TOKENS
            own = rep.solo_prefill_s(rec.req.prompt_tokens - rec.cached_tokens)
            rec.queue_s = max(0.0, rec.first_token_s - rec.req.arrival_s - own - 2 * self.cfg.hop_s)
            self._by_id[rep.replica_id][1].observe_finished(rec.first_token_s, t_s, rec.req.output_tokens)
            self.inflight[rep.replica_id] -= 1
            router = self.routers[rec.router]
            router.inflight[rep.replica_id] -= 1
            self._outstanding -= 1
            hold = self._holds.pop(req_id, None)
            if hold is not None:
                hold.release()
            self._budget_tokens.pop(req_id, None)
            features = self._features.pop(req_id)
            tpot = rec.tpot_s
            if tpot is not None and self.admission:  # admission enforces the pick's TPOT plan
                notify_tpot(router.policy, features, rep.replica_id, tpot, early)
            notify(router.policy, "on_complete", features, rep.replica_id)
            notify_output(router.policy, features, rep.replica_id, rec.req.output_tokens)
        elif kind == "preempted":
            rec.preemptions += 1

    def _hides_max_tokens(self, req: SimRequest) -> bool:
        share = 1.0 if self.cfg.hide_max_tokens else self.cfg.hide_max_tokens_share
        if share <= 0.0 or share >= 1.0:
            return share >= 1.0
        return zlib.crc32(f"hide/{self._seed}/{req.req_id}".encode()) < share * 2**32

    def _arrive(self, req: SimRequest) -> None:
        cap = self.cfg.max_tokens_cap
        features = RequestFeatures(prompt_tokens=req.prompt_tokens,
                                   max_tokens=None if self._hides_max_tokens(req)
                                   else req.output_tokens if cap is None else max(cap, req.output_tokens),
                                   prefix_hashes=req.prefix_hashes, priority=req.priority, req_id=req.req_id,
                                   true_output_tokens=req.output_tokens)
        rec = RequestRecord(req)
        self.records[req.req_id] = rec
        if not servable(self._profiles, req.prompt_tokens, req.output_tokens):
            rec.rejected = CLIENT_ERROR
            return
        k = self._route_to(req)
        rec.router = k
        router = self.routers[k]
        if router.queue is None:
            self._send(router, rec, features, frozenset())
            return
        self._features[req.req_id] = features
        place = self._placement(router, features)
        if not place.open and math.isinf(place.ttft_s):
            self._features.pop(req.req_id)
            rec.rejected = "no_replica"
            rec.reject_s = self.now
            self._misses += 1
            return
        d = router.queue.arrive(req.req_id, class_of(req.priority), self.now, req.arrival_s + self._slo.ttft_s, place)
        if d.action == adm.DISPATCH:
            self._dispatch_held(router, rec, d)
        elif d.action == adm.HOLD:
            self._held += 1
            if router.budgets is not None:  # held requests count in the router's demand
                router.budgets.get(self.cfg.pool).enqueue(self._tokens(router, features))
        else:
            if router.budgets is not None:  # it wanted in: the next demand says so
                router.budgets.get(self.cfg.pool).refused_tokens(self._tokens(router, features))
            self._reject(rec, d)
        if len(router.queue):
            self._pump(k)

    def _placement(self, router: SimRouter, features: RequestFeatures) -> adm.Placement:
        preds = router.policy.predictions(PoolSnapshot(router.view, router.inflight, frozenset(),  # type: ignore[attr-defined]
                                                       slo=self.cfg.slo), features)
        room = router.budgets is None or router.budgets.get(self.cfg.pool).allows_tokens(
            class_of(features.priority), self._tokens(router, features, preds))
        return adm.placement(preds, self.cfg.admission.tpot_guard, self._slo.tpot_s, room)  # type: ignore[union-attr]

    def _tokens(self, router: SimRouter, features: RequestFeatures,
                preds: list[Prediction] | None = None) -> Tokens:
        """A request's tokens in its router's budget, counted once (at its first use: its arrival's
        placement, `preds`) with the prefill and output the policy expects then, as the live gate
        does: what it enqueues, acquires and releases is the same whatever the policy learns
        meanwhile."""
        t = self._budget_tokens.get(features.req_id)
        if t is None:
            prefill = adm.own_prefill(preds, features.prompt_tokens) if preds is not None else features.prompt_tokens
            t = self._budget_tokens[features.req_id] = Tokens.request(prefill, expected_output(router.policy, features))
        return t

    def _reject(self, rec: RequestRecord, d: adm.Decision) -> None:
        rec.rejected = d.reason
        rec.reject_s = self.now
        self._features.pop(rec.req.req_id, None)
        self._budget_tokens.pop(rec.req.req_id, None)
        self._misses += 1

    def _dispatch_held(self, router: SimRouter, rec: RequestRecord, d: adm.Decision) -> None:
        closed = frozenset(e.replica_id for e in router.view if e.replica_id not in d.open)
        self._send(router, rec, self._features.pop(rec.req.req_id), closed)
        if rec.dispatch_s is not None:
            self._predicted_ttft[rec.req.req_id] = d.ttft_s

    def _pump(self, k: int) -> None:
        router = self.routers[k]
        queue = router.queue
        assert queue is not None

        def left(h: adm.Held) -> None:
            self._held -= 1
            if router.budgets is not None:
                router.budgets.get(self.cfg.pool).dequeue(self._tokens(router, self._features[h.key]))  # type: ignore[index]

        def dispatch(h: adm.Held, d: adm.Decision) -> None:
            left(h)
            self._dispatch_held(router, self.records[h.key], d)  # type: ignore[index]

        def reject(h: adm.Held, d: adm.Decision) -> None:
            if router.budgets is not None:  # it wanted in, as one rejected at arrival
                router.budgets.get(self.cfg.pool).refused_tokens(self._tokens(router, self._features[h.key]))  # type: ignore[index]
            left(h)
            self._reject(self.records[h.key], d)  # type: ignore[index]

        adm.pump(queue, self.now, lambda h: self._placement(router, self._features[h.key]), dispatch, reject)  # type: ignore[index]
        if len(queue) and not router.waking:
            router.waking = True
            self._push(self.now + self.cfg.wake_s, _WAKE, k)

    def _wake(self, k: int) -> None:
        self.routers[k].waking = False
        self._advance(self.now)
        self._pump(k)

    def _send(self, router: SimRouter, rec: RequestRecord, features: RequestFeatures,
              exclude: frozenset[str]) -> None:
        req = rec.req
        live = None
        if router.wants_live:
            live = {}
            for r in self.replicas:
                s = r.engine.stats()
                live[r.replica_id] = LiveLoad(s.running, s.waiting, s.kv_free_tokens,
                                              s.num_gpu_blocks * s.block_size)
        snap = PoolSnapshot(router.view, router.inflight, exclude, live, slo=self.cfg.slo)
        choice = router.policy.pick(snap, features, router.rng)
        if choice is None:
            rec.rejected = "no_replica"
            rec.reject_s = self.now
            self._misses += 1
            return
        rep = self._by_id[choice.replica_id][0]
        rec.dispatch_s = self.now
        try:
            rep.submit(req.req_id, req.prompt_tokens, req.output_tokens, self.now + self.cfg.hop_s,
                       req.prefix_hashes, req.hash_block_tokens)
        except RequestError as exc:
            rec.rejected = "too_large" if "larger" in str(exc) or "context length" in str(exc) else "invalid"
            self._misses += 1
            return
        rec.replica = rep.replica_id
        self.inflight[rep.replica_id] += 1
        router.inflight[rep.replica_id] += 1
        self._counts[rep.replica_id] += 1
        self._outstanding += 1
        self._features[req.req_id] = features
        if router.budgets is not None:
            self._holds[req.req_id] = router.budgets.get(self.cfg.pool).acquire_tokens(self._tokens(router, features))
        notify(router.policy, "on_dispatch", features, rep.replica_id)

    def _route_to(self, req: SimRequest) -> int:
        n = len(self.routers)
        if n == 1:
            return 0
        if self.cfg.router_spread == "hash":
            k = session_router(req, n)
            if k is not None:
                return k
        k = self._rr % n
        self._rr += 1
        return k

    def _report(self, i: int) -> None:
        rep, agent = self.replicas[i], self.agents[i]
        self._advance_one(rep, self.now)
        report = agent.report(rep.engine, self.now)
        kv = report.engine.kv_cache_usage
        if kv > rep.peak_kv:
            rep.peak_kv = kv
        if self.cfg.record_samples:
            self.samples[rep.replica_id].append((self.now, report.engine.num_requests_running,
                                                 report.engine.num_requests_waiting, kv))
        self.fleet.on_report(agent.hello, report)
        self._push(self.now + self.cfg.report_interval_s, _REPORT, i)

    def _tick(self) -> None:
        # What routers publish about themselves (their in-flight per replica: drains wait for it).
        set_inflight = getattr(self.fleet, "set_router_inflight", None)
        if set_inflight is not None:
            set_inflight(self.inflight)
        self.fleet.prune(self.now)
        tables = compute_pool_tables(self.fleet.views(self.now), self.cfg.weights)
        take_events = getattr(self.fleet, "take_events", None)
        if take_events is not None:
            take_events()  # the audit trail the real control plane writes to etcd; not modelled
        pool_entries = tables.get(self.cfg.pool, ())
        key = routing_key(pool_entries)
        if key != self._published_key:  # the publisher's change rule: informational fields alone never write
            self._published_key = key
            entries = tuple(_route_info(e) for e in pool_entries)
            self._push(self.now + self.cfg.propagation_s, _DELIVER, (self.now, entries))
        if self._budget_pub is not None:
            self._budget_tick(tables)
        self._push(self.now + self.cfg.tick_s, _TICK, None)

    def _budget_tick(self, tables) -> None:  # noqa: ANN001
        """The leader's budget step: the pool's total and each router's share from their demand
        (what their presence records carry), delivered when the publisher would write it."""
        assert self._budget_pub is not None
        pool = self.cfg.pool
        demand = {r.router_id: r.budgets.demand().get(pool, Tokens()) for r in self.routers}  # type: ignore[union-attr]
        slo = records_pb2.PoolSlo(pool=pool, ttft_s=self._slo.ttft_s, tpot_s=self._slo.tpot_s)
        rec = self._budget_pub.compute({pool: tables.get(pool, ())}, self.fleet, {pool: slo},
                                       [r.router_id for r in self.routers], {pool: demand})[pool]
        last = self._budget_written
        if last is None or moved(last[0], rec) or self.now - last[1] >= self.cfg.budget_refresh_s:
            self._budget_written = (rec, self.now)
            self._push(self.now + self.cfg.propagation_s, _BUDGET, rec)

    def _deliver_budget(self, rec: records_pb2.AdmissionBudget) -> None:
        kv = KeyValue(keys.admission(rec.pool), codec.encode(rec), 0)
        for router in self.routers:
            router.budgets.apply(kv.key, kv)  # type: ignore[union-attr]

    def _peer_publish(self, k: int) -> None:
        """Router k's load record: what its hooks counted up to now (every engine advanced to now,
        so first tokens and completions that happened are in it)."""
        self._advance(self.now)
        report = self.routers[k].policy.take_report()  # type: ignore[attr-defined]
        queue = self.routers[k].queue  # admission: the tokens it holds per class ride along
        held = None if queue is None else queue.held_report(self.now)
        self._push(self.now + self.cfg.propagation_s, _PEER_DELIVER, (k, report, held))
        self._push(self.now + self.cfg.peer_interval_s, _PEER_PUBLISH, k)  # type: ignore[operator]

    def _peer_deliver(self, payload: tuple[int, dict, HeldReport | None]) -> None:
        k, report, held = payload
        for j, router in enumerate(self.routers):
            if j != k:
                router.policy.on_peer_load(f"router-{k}", report)  # type: ignore[attr-defined]
                if held is not None and router.queue is not None:
                    router.queue.on_peer_held(f"router-{k}", held, self.now)

    def _deliver(self, payload: tuple[float, tuple[RouteInfo, ...]]) -> None:
        computed, entries = payload
        for router in self.routers:
            router.table = entries
            router.refresh_view()
        self.deliveries.append(TableDelivery(computed, self.now, entries))

    def _scrape(self, t: float, k: int) -> None:
        self._advance(t)
        router = self.routers[k]
        for r in self.replicas:
            st = r.engine.stats()
            router.scraped[r.replica_id] = (st.running, st.waiting, st.kv_free_tokens,
                                            st.num_gpu_blocks * st.block_size)
        router.refresh_view()
        self._push(t + router.scrape_s, _SCRAPE, k)  # type: ignore[operator]

    @property
    def table(self) -> tuple[RouteInfo, ...]:
        """Router 0's delivered table."""
        return self.routers[0].table

    @property
    def view(self) -> tuple[RouteInfo, ...]:
        return self.routers[0].view




def makespan(result: SimResult) -> float:
    arrivals = [r.req.arrival_s for r in result.records]
    start = min(arrivals) if arrivals else 0.0
    return max(result.end_s - start, 1e-9) if math.isfinite(result.end_s) else 0.0
