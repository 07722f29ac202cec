"""Admission at the live router: one queue per pool around the pure `tidegate.policy.admission`.

Per request (the proxy calls `Gate.admit` before its pick), with the pool's policy predictions:
dispatch now, hold in the pool's queue until capacity frees, or reject. A rejection is answered
at once with 429, `Retry-After` (seconds), `x-tidegate-reject-reason` and an OpenAI error body
whose `code` is the reason (`rejection_response`).

Held requests wait on a future. The pool's queue is pumped (`Gate.wake`) on every first token
and completion of the pool's requests (the proxy's hooks), and by a timer while anything is held
(at the next max-wait expiry, at most `POLL_S` later: table changes and deadlines are seen then).
A pump hands out one dispatch at a time: the next prediction must see the last one dispatched,
which happens when its handler has called the policy's `on_dispatch` (`Gate.sent`). A client
that disconnects while held cancels its handler, which takes it out of the queue at once:
nothing reaches an engine.

This router's share of the pool's admission budget (router/admission_budgets.py) is part of the
dispatch decision: a request the share has no room for waits in its class queue (its deadline
and max wait still apply) and takes its part of the share only when it is dispatched
(`Admitted.hold`, released by the proxy when the request ends). Held requests count in the
demand this router reports for the pool.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tidegate.policy import admission as adm
from tidegate.policy.admission_budget import Hold, RouterBudget, Tokens
from tidegate.policy.peer_queues import HeldReport
from tidegate.policy.predict import Prediction
from tidegate.policy.registry import PoolSnapshot, RequestFeatures, SloTargets, enforce_tpot_plan, expected_output
from tidegate.router.http1 import Response
from tidegate.router.parse import error_body

REASON_HEADER = "x-tidegate-reject-reason"
# Longest a pool with held requests goes without a pump (table changes, deadlines).
POLL_S = 0.1
_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
_MESSAGES = {
    adm.QUEUE_FULL: "the queue for this priority class is full",
    adm.DEADLINE_UNMEETABLE: "no replica can return a first token within the request's deadline",
    adm.SHED: "shed to serve higher-priority requests within their deadlines",
    adm.QUEUE_TIMEOUT: "waited in the queue for longer than this priority class may",
}


class AdmissionMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.held = Counter("tidegate_router_admission_held", "Requests held in the router's queue, by class.",
                            ["model", "priority"], registry=registry)
        self.queued = Gauge("tidegate_router_admission_queued", "Requests held in the router's queue now.",
                            ["model", "priority"], registry=registry)
        self.rejected = Counter("tidegate_router_admission_rejected",
                                "Requests rejected by admission (429), by class and reason.",
                                ["model", "priority", "reason"], registry=registry)
        self.wait = Histogram("tidegate_router_admission_queue_wait_seconds",
                              "Time held in the router's queue, by class and outcome "
                              "(dispatched, rejected, disconnected).", ["model", "priority", "outcome"],
                              buckets=_WAIT_BUCKETS, registry=registry)
        self.ttft_margin = Gauge("tidegate_router_admission_ttft_margin_seconds",
                                 "What admission adds to every predicted TTFT before testing a deadline: the "
                                 "error of this router's latest predictions at a quantile (0 until measured).",
                                 ["model"], registry=registry)


@dataclass(frozen=True, slots=True)
class Admitted:
    closed: frozenset[str]          # replicas the pick must not choose (over their prefill budget)
    held: bool = False              # it was held: call Gate.sent once it is sent (or abandoned)
    hold: Hold | None = None        # its part of this router's budget share: release() when it ends
    ttft_s: float | None = None     # the TTFT its dispatch counted on (Gate.observe_ttft); None: no prediction


@dataclass(frozen=True, slots=True)
class Rejected:
    reason: str
    retry_after_s: int


def rejection_response(pool: str, r: Rejected) -> Response:
    body = error_body(f"{_MESSAGES.get(r.reason, 'rejected')} (model {pool!r}); retry after {r.retry_after_s} s",
                      "rate_limit_exceeded", None, r.reason)
    return Response(429, json.dumps(body).encode(), {"Retry-After": str(r.retry_after_s), REASON_HEADER: r.reason},
                    "application/json")


@dataclass(slots=True)
class _Waiter:
    future: asyncio.Future[adm.Decision]
    request: RequestFeatures
    slo: SloTargets | None
    snapshot: Callable[[SloTargets | None], PoolSnapshot]
    cls: str
    since: float
    budget: RouterBudget | None
    tokens: Tokens


class _Pool:
    __slots__ = ("busy", "name", "policy", "queue", "timer", "waiters")

    def __init__(self, name: str, cfg: adm.AdmissionConfig, policy: object) -> None:
        self.name = name
        self.queue = adm.AdmissionQueue(cfg)
        self.waiters: dict[int, _Waiter] = {}
        self.busy = False       # a dispatch handed to a handler that has not sent it yet
        self.timer: asyncio.TimerHandle | None = None
        self.policy = policy


class Gate:
    """Every pool's admission queue at this router (one event loop)."""

    def __init__(self, cfg: adm.AdmissionConfig, clock: Callable[[], float], metrics: AdmissionMetrics) -> None:
        self.cfg = cfg
        self._clock = clock
        self._metrics = metrics
        self._pools: dict[str, _Pool] = {}
        self._keys = itertools.count()
        # Per pool, per peer router: its latest held report and when it came (our clock), kept
        # for a pool whose queue is created (or replaced) after the report.
        self._peer_held: dict[str, dict[str, tuple[HeldReport, float]]] = {}

    @staticmethod
    def applies(policy: object) -> bool:
        """Admission needs the policy's predictions (the `tidegate` pick has them)."""
        return callable(getattr(policy, "predictions", None))

    def _pool(self, name: str, policy: object) -> _Pool:
        p = self._pools.get(name)
        if p is None or p.policy is not policy:
            p = self._pools[name] = _Pool(name, self.cfg, policy)
            enforce_tpot_plan(policy)
            for peer, (report, at) in self._peer_held.get(name, {}).items():
                p.queue.on_peer_held(peer, report, at)
        return p

    def held_reports(self) -> dict[str, HeldReport]:
        """Per pool whose queue holds something: what this router tells its peers."""
        now = self._clock()
        return {name: p.queue.held_report(now) for name, p in self._pools.items() if len(p.queue)}

    def on_peer_held(self, peer: str, pool: str, report: HeldReport | None) -> None:
        """A peer router's latest held report for `pool` (None: it holds nothing there): a held
        request here may now go, or must let the peer's higher class go first."""
        now = self._clock()
        per = self._peer_held.setdefault(pool, {})
        if report is None:
            per.pop(peer, None)
        else:
            per[peer] = (report, now)
        p = self._pools.get(pool)
        if p is None:
            return
        if report is None:
            p.queue.forget_peer(peer)
        else:
            p.queue.on_peer_held(peer, report, now)
        self.wake(pool)

    def held(self, pool: str) -> dict[str, int]:
        p = self._pools.get(pool)
        return p.queue.lengths() if p is not None else {}

    def _placement(self, p: _Pool, snapshot: PoolSnapshot, request: RequestFeatures, cls: str,
                   budget: RouterBudget | None, tokens: Tokens,
                   preds: list[Prediction] | None = None) -> adm.Placement:
        if preds is None:
            preds = p.policy.predictions(snapshot, request)  # type: ignore[attr-defined]
        room = budget is None or budget.allows_tokens(cls, tokens)
        return adm.placement(preds, self.cfg.tpot_guard, snapshot.slo.tpot_s if snapshot.slo else None, room)

    async def admit(self, pool: str, policy: object, request: RequestFeatures, cls: str, slo: SloTargets,
                    arrival_s: float, snapshot: Callable[[SloTargets | None], PoolSnapshot],
                    budget: RouterBudget | None = None) -> Admitted | Rejected:
        """`snapshot(slo)` builds the pool's current snapshot (fresh each call: table, in-flight);
        `budget`: this router's share of the pool's admission budget (None: no budget).
        Returns at once unless the request is held; cancelled (client gone) -> out of the queue."""
        p = self._pool(pool, policy)
        snap = snapshot(slo)
        if not snap.candidates():
            return Admitted(frozenset())  # the pick answers 503: no routable replica
        # Counted once, with the prefill and output the policy expects now: what it acquires is
        # what it releases.
        preds = p.policy.predictions(snap, request)  # type: ignore[attr-defined]
        tokens = Tokens.request(adm.own_prefill(preds, request.prompt_tokens), expected_output(policy, request))
        place = self._placement(p, snap, request, cls, budget, tokens, preds)
        if p.busy:  # a held request is being sent right now: this one may only go after it
            place = dataclasses.replace(place, open=frozenset())
        key = next(self._keys)
        d = p.queue.arrive(key, cls, self._clock(), arrival_s + slo.ttft_s, place)
        if d.action == adm.DISPATCH:
            return self._admitted(snap, d, budget, tokens)
        if d.action == adm.REJECT:
            return self._rejected(pool, cls, d, budget, tokens)
        fut: asyncio.Future[adm.Decision] = asyncio.get_running_loop().create_future()
        p.waiters[key] = _Waiter(fut, request, slo, snapshot, cls, self._clock(), budget, tokens)
        if budget is not None:
            budget.enqueue(tokens)
        self._metrics.held.labels(pool, cls).inc()
        self._metrics.queued.labels(pool, cls).inc()
        self._arm(p)
        try:
            d = await fut
        except asyncio.CancelledError:
            w = p.waiters.pop(key, None)
            if w is not None:  # still held: gone from the queue, nothing was sent
                p.queue.remove(key)
                self._left(p, w, "disconnected")
            elif fut.done() and not fut.cancelled():
                if fut.result().action == adm.DISPATCH:
                    self.sent(pool)  # handed a dispatch it will never make
                else:  # rejected from the queue as it went: counted like any rejection
                    self._rejected(pool, cls, fut.result(), budget, tokens)
            raise
        if d.action == adm.REJECT:  # rejected from the queue: counted like one at arrival
            return self._rejected(pool, cls, d, budget, tokens)
        return self._admitted(snapshot(slo), d, budget, tokens, held=True)

    def _rejected(self, pool: str, cls: str, d: adm.Decision, budget: RouterBudget | None,
                  tokens: Tokens) -> Rejected:
        """Every rejection, at arrival or from the queue: metrics and the demand report."""
        self._metrics.rejected.labels(pool, cls, d.reason).inc()
        if budget is not None:  # it wanted in: the next demand report says so
            budget.refused_tokens(tokens)
        return Rejected(d.reason, d.retry_after_s)

    @staticmethod
    def _admitted(snap: PoolSnapshot, d: adm.Decision, budget: RouterBudget | None, tokens: Tokens,
                  held: bool = False) -> Admitted:
        return Admitted(frozenset(e.replica_id for e in snap.entries if e.replica_id not in d.open), held,
                        budget.acquire_tokens(tokens) if budget is not None else None, d.ttft_s)

    def observe_ttft(self, pool: str, predicted_s: float, realized_s: float) -> None:
        """An admitted request's first token came `realized_s` after it was sent, where its dispatch
        counted on `predicted_s` (Admitted.ttft_s): the pool's TTFT margin learns from it."""
        p = self._pools.get(pool)
        if p is None:
            return
        before = p.queue.ttft_margin
        p.queue.observe_ttft(predicted_s, realized_s)
        if p.queue.ttft_margin != before:
            self._metrics.ttft_margin.labels(pool).set(p.queue.ttft_margin)

    def _left(self, p: _Pool, w: _Waiter, outcome: str) -> None:
        if w.budget is not None:
            w.budget.dequeue(w.tokens)
        self._metrics.queued.labels(p.name, w.cls).dec()
        self._metrics.wait.labels(p.name, w.cls, outcome).observe(max(0.0, self._clock() - w.since))

    def sent(self, pool: str) -> None:
        """The handler of a dispatched held request has sent it (or given up): next one."""
        p = self._pools.get(pool)
        if p is not None and p.busy:
            p.busy = False
            self.wake(pool)

    def wake(self, pool: str) -> None:
        """Capacity may have freed (first token, completion, timer): pump the pool's queue."""
        p = self._pools.get(pool)
        if p is None or p.busy or not len(p.queue):
            return

        def predict(h: adm.Held) -> adm.Placement:
            w = p.waiters[h.key]  # type: ignore[index]
            return self._placement(p, w.snapshot(w.slo), w.request, w.cls, w.budget, w.tokens)

        def dispatch(h: adm.Held, d: adm.Decision) -> None:
            w = p.waiters.pop(h.key)  # type: ignore[call-overload]
            p.busy = True
            self._left(p, w, "dispatched")
            w.future.set_result(d)

        def reject(h: adm.Held, d: adm.Decision) -> None:
            w = p.waiters.pop(h.key)  # type: ignore[call-overload]
            self._left(p, w, "rejected")  # its handler counts it (Gate._rejected)
            w.future.set_result(d)

        adm.pump(p.queue, self._clock(), predict, dispatch, reject, max_dispatch=1)
        self._arm(p)

    def _arm(self, p: _Pool) -> None:
        if p.timer is not None:
            p.timer.cancel()
            p.timer = None
        if not len(p.queue):
            return
        now = self._clock()
        expiry = p.queue.next_expiry()
        delay = POLL_S if expiry is None else min(POLL_S, max(0.0, expiry - now))
        p.timer = asyncio.get_running_loop().call_later(delay, self._tick, p.name)

    def _tick(self, pool: str) -> None:
        p = self._pools.get(pool)
        if p is None:
            return
        p.timer = None
        if p.busy:
            self._arm(p)
        else:
            self.wake(pool)

    def close(self) -> None:
        for p in self._pools.values():
            if p.timer is not None:
                p.timer.cancel()
                p.timer = None
