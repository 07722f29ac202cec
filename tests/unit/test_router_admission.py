"""The live router's admission plumbing (router/admission.py) around the pure queue, with a fake
policy whose predictions the test sets: hold and wake, one dispatch at a time, disconnect."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from tidegate.policy.admission import AdmissionConfig, ClassLimits, HeldReport
from tidegate.policy.admission_budget import RouterBudget, Tokens
from tidegate.policy.predict import Prediction
from tidegate.policy.registry import PoolSnapshot, RouteInfo, SloTargets
from tidegate.router.admission import POLL_S, AdmissionMetrics, Admitted, Gate, Rejected, rejection_response

SLO = SloTargets(2.0, 0.1)
ENTRIES = (RouteInfo("r0", 100.0), RouteInfo("r1", 100.0))


class FakePolicy:
    """Predictions from a per-replica outstanding-prefill table the test edits."""

    def __init__(self) -> None:
        self.queued = {"r0": 0.0, "r1": 0.0}
        self.ttft = 0.2

    def predictions(self, snapshot: PoolSnapshot, request) -> list[Prediction]:  # noqa: ANN001
        return [Prediction(e.replica_id, 0, request.prompt_tokens, self.ttft, 0.05, 0.0, 0.0, 1.0,
                           self.queued[e.replica_id], 1000.0, 10_000.0) for e in snapshot.candidates()]


class FakeRequest:
    def __init__(self, prompt_tokens: int, max_tokens: int | None = None) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens


def gate(queue: int = 4, decide_s: float | None = None) -> tuple[Gate, CollectorRegistry, list[float]]:
    clock = [0.0]
    reg = CollectorRegistry()
    cfg = AdmissionConfig({c: ClassLimits(queue if c != "sheddable" else 0, 30.0)
                           for c in ("critical", "standard", "sheddable")}, decide_s=decide_s)
    return Gate(cfg, lambda: clock[0], AdmissionMetrics(reg)), reg, clock


def snapshot(slo: SloTargets | None) -> PoolSnapshot:
    return PoolSnapshot(ENTRIES, {}, frozenset(), slo=slo)


async def admit(g: Gate, policy: FakePolicy, cls: str, tokens: int = 500):  # noqa: ANN201
    return await g.admit("m", policy, FakeRequest(tokens), cls, SLO, 0.0, snapshot)  # type: ignore[arg-type]


async def held_one(cls: str = "critical") -> tuple[Gate, CollectorRegistry, list[float], FakePolicy, asyncio.Task]:
    """A gate holding one request: both replicas over their prefill budget."""
    g, reg, clock = gate()
    pol = FakePolicy()
    pol.queued = {"r0": 900.0, "r1": 900.0}
    t = asyncio.create_task(admit(g, pol, cls))
    await asyncio.sleep(0)
    return g, reg, clock, pol, t


async def test_dispatch_hold_reject_and_one_dispatch_at_a_time() -> None:
    g, reg, _ = gate()
    pol = FakePolicy()
    first = await admit(g, pol, "standard")
    assert first == Admitted(frozenset(), False, ttft_s=0.2)
    pol.queued = {"r0": 900.0, "r1": 900.0}         # both over budget for another 500 tokens
    assert await admit(g, pol, "sheddable") == Rejected("queue_full", 1)
    a = asyncio.create_task(admit(g, pol, "standard"))
    b = asyncio.create_task(admit(g, pol, "critical"))
    await asyncio.sleep(0)
    assert g.held("m") == {"critical": 1, "standard": 1, "sheddable": 0}
    pol.queued = {"r0": 0.0, "r1": 900.0}          # r0's prefill is done
    g.wake("m")
    out_b = await b                                 # critical first, with r1 closed
    assert out_b == Admitted(frozenset({"r1"}), True, ttft_s=0.2)
    assert not a.done()
    g.wake("m")                                     # busy until the critical one is sent
    await asyncio.sleep(0)
    assert not a.done()
    g.sent("m")
    assert await a == Admitted(frozenset({"r1"}), True, ttft_s=0.2)
    g.sent("m")
    assert reg.get_sample_value("tidegate_router_admission_rejected_total",
                                {"model": "m", "priority": "sheddable", "reason": "queue_full"}) == 1
    assert reg.get_sample_value("tidegate_router_admission_queued", {"model": "m", "priority": "critical"}) == 0
    g.close()


async def test_disconnect_while_held_leaves_the_queue() -> None:
    g, reg, _, _, t = await held_one()
    assert g.held("m")["critical"] == 1
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    assert g.held("m")["critical"] == 0
    assert reg.get_sample_value("tidegate_router_admission_queue_wait_seconds_count",
                                {"model": "m", "priority": "critical", "outcome": "disconnected"}) == 1
    g.close()


async def test_timer_rejects_a_request_whose_deadline_passed() -> None:
    g, reg, clock = gate()
    pol = FakePolicy()
    pol.queued = {"r0": 900.0, "r1": 900.0}
    t = asyncio.create_task(admit(g, pol, "standard"))
    await asyncio.sleep(0)
    clock[0] = 1.9                                   # 0.1 s left, TTFT 0.2 s: cannot make it
    await asyncio.sleep(POLL_S * 2)
    assert t.done()
    out = t.result()
    assert isinstance(out, Rejected) and out.reason == "deadline_unmeetable"
    resp = rejection_response("m", out)
    assert resp.status == 429 and resp.headers["x-tidegate-reject-reason"] == "deadline_unmeetable"
    assert int(resp.headers["Retry-After"]) >= 1
    g.close()


async def test_a_committed_request_whose_deadline_passed_is_served_late_not_rejected() -> None:
    g, reg, clock = gate(decide_s=0.05)
    pol = FakePolicy()
    pol.queued = {"r0": 900.0, "r1": 900.0}
    t = asyncio.create_task(admit(g, pol, "standard"))
    await asyncio.sleep(0)
    clock[0] = 1.9                                   # held past its decision time, and late
    await asyncio.sleep(POLL_S * 2)
    assert not t.done() and g.held("m")["standard"] == 1
    pol.queued = {"r0": 0.0, "r1": 900.0}            # r0's prefill is done
    g.wake("m")
    assert await t == Admitted(frozenset({"r1"}), True, ttft_s=0.2)  # sent, r1 closed to it
    g.sent("m")
    assert reg.get_sample_value("tidegate_router_admission_rejected_total",
                                {"model": "m", "priority": "standard", "reason": "deadline_unmeetable"}) is None
    g.close()


async def test_budget_share_is_part_of_the_dispatch_decision() -> None:
    """A request this router's share has no room for waits in its class queue (not refused, not
    past the queue), takes its part of the share only when dispatched, and goes when it frees."""
    g, reg, _ = gate()
    pol = FakePolicy()
    budget = RouterBudget()
    budget.set_share(Tokens(prefill_tokens=1000.0, kv_tokens=1e9, sequences=100.0))

    async def admit_b(cls: str, tokens: int = 600):  # noqa: ANN202
        return await g.admit("m", pol, FakeRequest(tokens), cls, SLO, 0.0, snapshot, budget)  # type: ignore[arg-type]

    first = await admit_b("standard")
    assert isinstance(first, Admitted) and first.hold is not None and not first.held
    assert budget.held.prefill_tokens == 600
    second = asyncio.create_task(admit_b("critical"))      # 600 + 600 > 1000: over the share
    await asyncio.sleep(0)
    assert not second.done() and g.held("m")["critical"] == 1
    assert budget.held.prefill_tokens == 600 and budget.queued.prefill_tokens == 600
    assert budget.demand().prefill_tokens == 1200           # held requests count in the demand
    # a lower class over its fraction of the share is shed at arrival (the rest is the higher classes')
    assert (await admit_b("standard")).reason == "shed"  # type: ignore[union-attr]
    g.wake("m")
    await asyncio.sleep(0)
    assert not second.done()                               # the share is still in use
    first.hold.release()
    g.wake("m")
    out = await second
    assert isinstance(out, Admitted) and out.held and out.hold is not None
    assert budget.held.prefill_tokens == 600 and budget.queued.prefill_tokens == 0
    g.sent("m")
    out.hold.release()
    assert budget.held == Tokens()
    assert reg.get_sample_value("tidegate_router_admission_rejected_total",
                                {"model": "m", "priority": "critical", "reason": "queue_full"}) is None
    g.close()


async def test_an_arrival_while_a_held_request_is_being_sent_goes_after_it() -> None:
    g, _, _, pol, first = await held_one()
    pol.queued = {"r0": 0.0, "r1": 0.0}
    g.wake("m")                                     # first is dispatched; its handler has not sent it yet
    assert (await first).held
    second = asyncio.create_task(admit(g, pol, "critical"))
    await asyncio.sleep(0)
    assert not second.done() and g.held("m")["critical"] == 1   # held, though a replica is open
    g.sent("m")                                     # the first is on its replica: the next may go
    out = await second
    assert isinstance(out, Admitted) and out.held
    g.sent("m")
    g.close()


async def queued_tokens(g: Gate, pol: FakePolicy, request: FakeRequest) -> tuple[Tokens, Tokens]:
    """Holds `request` (a standard one) against a fresh budget; the budget's queued tokens while it
    is held, and after its client left (the task cancelled). Closes the gate."""
    budget = RouterBudget()
    t = asyncio.create_task(g.admit("m", pol, request, "standard", SLO, 0.0, snapshot, budget))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    queued = budget.queued
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    g.close()
    return queued, budget.queued


async def test_the_budget_counts_the_answer_the_policy_expects_not_the_max_tokens_cap() -> None:
    """A client that sends max_tokens 16,384 on every request: the held request counts its prompt
    and half the output the policy expects (here 100 tokens), not half the cap."""
    g, _, _ = gate()

    class ExpectsShortAnswers(FakePolicy):
        def expected_output(self, request) -> float:  # noqa: ANN001
            return 100.0

    pol = ExpectsShortAnswers()
    pol.queued = {"r0": 900.0, "r1": 900.0}          # over both budgets: it is held
    queued, left = await queued_tokens(g, pol, FakeRequest(500, 16_384))
    assert queued == Tokens(500.0, 550.0, 1.0)
    assert left == Tokens()                           # it left the queue: its tokens too


async def test_the_budget_counts_the_prompt_less_the_prefix_cached_where_it_is_best_placed() -> None:
    """A prompt of 5,000 tokens whose 4,200-token prefix r1 holds (r1 predicted faster): the held
    request counts 800 prefill tokens and 800 + half its output of KV, as the pick counts a cached
    prefix as resident already, not its whole prompt."""
    g, _, _ = gate()

    class CachedOnR1(FakePolicy):
        def predictions(self, snapshot: PoolSnapshot, request) -> list[Prediction]:  # noqa: ANN001
            return [Prediction(e.replica_id, 4200 if e.replica_id == "r1" else 0,
                               800 if e.replica_id == "r1" else request.prompt_tokens,
                               0.1 if e.replica_id == "r1" else 0.6, 0.05, 0.0, 1.0, 1.0,
                               self.queued[e.replica_id], 100.0, 10_000.0) for e in snapshot.candidates()]

    pol = CachedOnR1()
    pol.queued = {"r0": 900.0, "r1": 900.0}          # over both budgets, pushing one out: it is held
    queued, _ = await queued_tokens(g, pol, FakeRequest(5000, 100))
    assert queued == Tokens(800.0, 850.0, 1.0)


async def test_a_request_rejected_from_the_queue_counts_once_in_metrics_and_in_the_demand() -> None:
    """Rejected after waiting (its deadline passed while held): out of the ledger's queued tokens,
    into its refused ones (the next demand report), and counted once in the metrics."""
    g, reg, clock = gate()
    pol = FakePolicy()
    pol.queued = {"r0": 900.0, "r1": 900.0}
    budget = RouterBudget()
    t = asyncio.create_task(g.admit("m", pol, FakeRequest(500, 100), "standard", SLO, 0.0,  # type: ignore[arg-type]
                                    snapshot, budget))
    await asyncio.sleep(0)
    assert budget.queued == Tokens(500.0, 550.0, 1.0)
    clock[0] = 1.9                                   # 0.1 s left, TTFT 0.2 s: cannot make it
    g.wake("m")
    out = await t
    assert isinstance(out, Rejected) and out.reason == "deadline_unmeetable"
    assert budget.queued == Tokens()
    assert budget.demand() == Tokens(500.0, 550.0, 1.0)   # refused: it still wanted in
    assert budget.demand() == Tokens()                    # reported once
    assert reg.get_sample_value("tidegate_router_admission_rejected_total",
                                {"model": "m", "priority": "standard", "reason": "deadline_unmeetable"}) == 1
    assert reg.get_sample_value("tidegate_router_admission_queue_wait_seconds_count",
                                {"model": "m", "priority": "standard", "outcome": "rejected"}) == 1
    g.close()


async def test_a_peer_holding_a_higher_class_holds_ours_back_until_it_holds_nothing() -> None:
    g, _, _ = gate()
    pol = FakePolicy()                                      # both replicas open
    # The peer's report comes before this router has a queue for the pool: kept, then applied.
    g.on_peer_held("router-9", "m", HeldReport({"critical": 2000.0}))
    t = asyncio.create_task(admit(g, pol, "standard"))
    await asyncio.sleep(0)
    assert not t.done() and g.held("m")["standard"] == 1    # the peer's critical goes first
    # what this router tells its peers: what it holds, and its head (held 0 s, 500 tokens)
    assert g.held_reports() == {"m": HeldReport({"standard": 500.0}, None, {"standard": (0.0, 500.0)})}
    g.on_peer_held("router-9", "m", None)                   # the peer's critical request went
    assert await asyncio.wait_for(t, 1) == Admitted(frozenset(), True, ttft_s=0.2)
    assert g.held_reports() == {}


async def test_a_peer_holding_the_same_class_does_not_hold_ours_back() -> None:
    g, _, _ = gate()
    g.on_peer_held("router-9", "m", HeldReport({"standard": 2000.0}))
    assert await admit(g, FakePolicy(), "standard") == Admitted(frozenset(), False, ttft_s=0.2)


async def test_a_peers_head_of_the_same_class_held_longer_goes_first() -> None:
    g, _, clock = gate()
    pol = FakePolicy()                                      # both replicas open
    # a peer's standard head of 400 tokens, held 0.5 s: past the gate (0.2 s at the 2 s target)
    g.on_peer_held("router-9", "m", HeldReport({"standard": 400.0}, None, {"standard": (0.5, 400.0)}))
    t = asyncio.create_task(admit(g, pol, "standard"))      # 500 tokens
    await asyncio.sleep(0)
    assert not t.done() and g.held("m")["standard"] == 1
    clock[0] = 0.05
    g.on_peer_held("router-9", "m", None)                   # the peer's request went, and nothing else is held
    assert await asyncio.wait_for(t, 1) == Admitted(frozenset(), True, ttft_s=0.2)
    g.close()


async def test_first_tokens_teach_the_pool_its_ttft_margin() -> None:
    g, reg, _ = gate()
    pol = FakePolicy()
    first = await admit(g, pol, "standard")
    assert isinstance(first, Admitted) and first.ttft_s == pytest.approx(0.2)
    # Every first token 0.5 s later than counted on: the margin becomes 0.5 s once measured ...
    for _ in range(64):
        g.observe_ttft("m", 0.2, 0.7)
    assert reg.get_sample_value("tidegate_router_admission_ttft_margin_seconds", {"model": "m"}) == pytest.approx(0.5)
    # ... and a request whose predicted TTFT fits its 2 s deadline alone, not with it, is refused.
    pol.ttft = 1.7
    assert await admit(g, pol, "standard") == Rejected("deadline_unmeetable", 1)
    g.observe_ttft("other-pool", 0.2, 0.7)  # a pool without a queue here: nothing to learn
    g.close()


async def test_the_gate_enforces_a_pools_tpot_plan_before_its_first_admission() -> None:
    g, _, _ = gate()
    pol = FakePolicy()
    calls: list[int] = []
    pol.enforce_tpot_plan = lambda: calls.append(1)  # type: ignore[attr-defined]
    await admit(g, pol, "standard")
    await admit(g, pol, "standard")
    assert calls == [1]                               # once per policy instance
    g.close()
