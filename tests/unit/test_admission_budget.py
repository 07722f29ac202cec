"""Admission budgets shared by routers (tidegate.policy.admission_budget): pool total, split by
demand, and the router-local ledger."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidegate.policy.admission_budget import (
    BudgetConfig,
    ReplicaCapacity,
    RouterBudget,
    Tokens,
    pool_total,
    split,
)

CFG = BudgetConfig(floor_fraction=0.1)


def rep(rid: str = "a", routable: bool = True, tps: float = 10000, base: float = 20, per: float = 0.5,
        kv: float = 100000, m: float = 1.0, seats: float = 0.0, done: float = 0.0) -> ReplicaCapacity:
    return ReplicaCapacity(rid, routable, tps, base, per, kv, m, seats=seats, completions_per_s=done)


TOTALS = [
    # id, replicas, ttft_s, tpot_s, expected (prefill, kv, sequences) or None
    ("one", [rep()], 2.0, 0.1, (20000, 100000, 160)),
    ("two-add", [rep("a"), rep("b")], 2.0, 0.1, (40000, 200000, 320)),
    ("feedback-scales", [rep(m=0.5)], 2.0, 0.1, (10000, 50000, 80)),
    ("unroutable-skipped", [rep("a"), rep("b", routable=False, tps=0)], 2.0, 0.1, (20000, 100000, 160)),
    ("tpot-below-base", [rep(base=200)], 2.0, 0.1, (20000, 100000, 0)),
    ("unknown-rates", [rep("a"), rep("b", tps=0)], 2.0, 0.1, None),
    ("no-slo", [rep()], 0.0, 0.1, None),
    ("no-routable", [rep(routable=False)], 2.0, 0.1, None),
    # Seats: the engine's max_num_seqs plus the completions of one TTFT target (its own queue's
    # drain); the decode step's bound where that is lower; unknown or garbage seats, no bound.
    ("seats-and-their-queue", [rep(per=0.1, seats=256, done=30)], 2.0, 0.1, (20000, 100000, 316)),
    ("seats-no-completions-yet", [rep(per=0.1, seats=256)], 2.0, 0.1, (20000, 100000, 256)),
    ("seats-over-the-tpot-bound", [rep(seats=256, done=30)], 2.0, 0.1, (20000, 100000, 160)),
    ("seats-unknown", [rep(per=0.1)], 2.0, 0.1, (20000, 100000, 800)),
    ("seats-garbage", [rep(per=0.1, seats=math.nan, done=math.inf)], 2.0, 0.1, (20000, 100000, 800)),
    ("completions-garbage", [rep(per=0.1, seats=256, done=-5)], 2.0, 0.1, (20000, 100000, 256)),
    ("seats-scaled-by-feedback", [rep(per=0.1, seats=256, done=30, m=0.5)], 2.0, 0.1, (10000, 50000, 158)),
]


@pytest.mark.parametrize("replicas,ttft,tpot,expected", [c[1:] for c in TOTALS], ids=[c[0] for c in TOTALS])
def test_pool_total(replicas: list[ReplicaCapacity], ttft: float, tpot: float, expected: tuple | None) -> None:
    total, reason = pool_total(replicas, ttft, tpot)
    if expected is None:
        assert total is None and reason
    else:
        assert total is not None
        assert total.values() == pytest.approx(expected)


SPLITS = [
    # id, total (one unit), demands, expected shares
    ("idle-even", 100, [0, 0], [50, 50]),
    ("one-busy", 100, [200, 0], [95, 5]),
    ("both-busy-equal", 100, [200, 200], [50, 50]),
    ("small-demand-satisfied", 100, [20, 200], [20, 80]),
    ("demand-below-total-leftover-even", 100, [30, 10], [60, 40]),
    ("single-router-gets-all", 100, [5], [100]),
]


@pytest.mark.parametrize("total,wants,expected", [c[1:] for c in SPLITS], ids=[c[0] for c in SPLITS])
def test_split_table(total: float, wants: list[float], expected: list[float]) -> None:
    demand = {f"r{i}": Tokens(w, w, w) for i, w in enumerate(wants)}
    got = split(Tokens(total, total, total), demand, CFG)
    assert [got[f"r{i}"].prefill_tokens for i in range(len(wants))] == pytest.approx(expected)


def test_a_router_gone_gives_its_share_back() -> None:
    total = Tokens(100, 1000, 10)
    both = split(total, {"a": Tokens(80, 800, 8), "b": Tokens(80, 800, 8)}, CFG)
    assert both["a"].prefill_tokens == pytest.approx(50)
    alone = split(total, {"a": Tokens(80, 800, 8)}, CFG)
    assert alone["a"] == total


amount = st.floats(allow_nan=True, allow_infinity=True)


@settings(max_examples=300, deadline=None)
@given(st.floats(0, 1e9), st.dictionaries(st.text(min_size=1, max_size=3), amount, max_size=6),
       st.floats(0, 1))
def test_split_properties(total: float, wants: dict[str, float], floor: float) -> None:
    cfg = BudgetConfig(floor_fraction=floor)
    got = split(Tokens(total, total, total), {r: Tokens(w, w, w) for r, w in wants.items()}, cfg)
    assert set(got) == set(wants)
    if not got:
        return
    shares = [t.prefill_tokens for t in got.values()]
    assert all(math.isfinite(s) and s >= 0 for s in shares)
    assert sum(shares) == pytest.approx(total, rel=1e-9, abs=1e-6)
    n = len(wants)
    for r, w in wants.items():   # max-min fair: at least its demand or the even share
        clean = w if math.isfinite(w) and w > 0 else 0.0
        assert got[r].prefill_tokens >= min(clean, total / n) - 1e-6 * max(1.0, total)


def test_router_budget_enforces_class_fractions() -> None:
    # An operator's fractions (--admission-class-fraction), each class stopping at its own.
    b = RouterBudget({"critical": 1.0, "standard": 0.9, "sheddable": 0.5})
    b.set_share(Tokens(1000, 10000, 10))
    q = Tokens.request(100, 100)                           # (100, 150, 1)
    holds = [b.acquire_tokens(q) for _ in range(4)]        # 400 prefill, 600 kv, 4 seqs
    assert b.allows_tokens("sheddable", q)                 # 500 <= 0.5 * 1000
    holds.append(b.acquire_tokens(q))
    assert not b.allows_tokens("sheddable", q)             # 600 > 500
    assert b.allows_tokens("standard", q)                  # 600 <= 900
    holds += [b.acquire_tokens(q) for _ in range(4)]
    assert not b.allows_tokens("standard", q) and b.allows_tokens("critical", q)
    for h in holds:
        h.first_token()                                    # prefill done: only sequences bind now
    assert b.held.prefill_tokens == 0 and b.held.sequences == 9
    assert b.allows_tokens("critical", q) and not b.allows_tokens("standard", q)
    for h in holds:
        h.release()
        h.release()                                        # idempotent
    assert b.held == Tokens()


def test_router_budget_admits_one_whatever_its_size_and_without_share() -> None:
    b = RouterBudget()
    assert b.allows_tokens("sheddable", Tokens.request(10**9))
    b.set_share(Tokens(10, 10, 1))
    assert b.allows_tokens("sheddable", Tokens.request(10**6))
    h = b.acquire_tokens(Tokens.request(10**6))
    assert not b.allows_tokens("critical", Tokens.request(1))
    h.release()
    b.set_share(None)
    assert b.allows_tokens("sheddable", Tokens.request(10**9))


def test_demand_counts_held_and_refused_then_resets() -> None:
    b = RouterBudget()
    b.acquire_tokens(Tokens.request(100, 50))
    b.refused_tokens(Tokens.request(200, 0))
    # KV: each prompt and half its max_tokens (predict.held_kv)
    assert b.demand() == Tokens(300, 325, 2)
    assert b.demand() == Tokens(100, 125, 1)


Q = Tokens.request(100, 50)      # (100, 125, 1)
R = Tokens.request(300, 0)       # (300, 300, 1)
QUEUED = [
    # (id, steps, queued after, demand after)
    ("nothing", [], Tokens(), Tokens()),
    ("one waits", [("enqueue", Q)], Q, Q),
    ("two wait", [("enqueue", Q), ("enqueue", R)], Q + R, Q + R),
    ("waits then leaves", [("enqueue", Q), ("dequeue", Q)], Tokens(), Tokens()),
    ("waits then is refused", [("enqueue", Q), ("dequeue", Q), ("refused", Q)], Tokens(), Q),
    ("waits then is dispatched", [("enqueue", R), ("dequeue", R), ("acquire", R)], Tokens(), R),
    ("leaving twice never goes below zero", [("enqueue", Q), ("dequeue", Q), ("dequeue", Q)], Tokens(), Tokens()),
]


@pytest.mark.parametrize("steps,queued,demand", [c[1:] for c in QUEUED], ids=[c[0] for c in QUEUED])
def test_the_ledger_owns_what_waits_in_the_queue(steps: list, queued: Tokens, demand: Tokens) -> None:
    b = RouterBudget()
    for op, t in steps:
        {"enqueue": b.enqueue, "dequeue": b.dequeue, "refused": b.refused_tokens, "acquire": b.acquire_tokens}[op](t)
    assert b.queued == queued
    assert b.demand() == demand
    assert b.demand() == queued + b.held       # refused counts once


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["critical", "standard", "sheddable"]), st.integers(0, 5000),
                          st.integers(0, 5000), st.sampled_from(["first", "release", "none"])), max_size=80))
def test_ledger_never_exceeds_share_except_the_first_and_returns_to_zero(ops: list) -> None:
    share = Tokens(20000, 60000, 16)
    b = RouterBudget()
    b.set_share(share)
    holds = []
    for cls, p, m, then in ops:
        if b.allows_tokens(cls, Tokens.request(p, m)):
            alone = b.held.sequences == 0
            holds.append(b.acquire_tokens(Tokens.request(p, m)))
            if not alone:
                assert all(h <= s + 1e-6 for h, s in zip(b.held.values(), share.values(), strict=True))
        if then == "first" and holds:
            holds[-1].first_token()
        elif then == "release" and holds:
            holds.pop(0).release()
    for h in holds:
        h.release()
    assert b.held.values() == pytest.approx((0, 0, 0))


def test_default_fractions_stop_only_sheddable_early() -> None:
    # Standard fills the share as critical does: room for critical is its waiting over the share
    # (admission rule 4), not a part of the share held back.
    b = RouterBudget()
    b.set_share(Tokens(1000, 10000, 10))
    q = Tokens.request(100, 100)
    holds = [b.acquire_tokens(q) for _ in range(9)]
    assert b.allows_tokens("standard", q) and b.allows_tokens("critical", q)
    assert not b.allows_tokens("sheddable", q)
    holds.append(b.acquire_tokens(q))
    assert not b.allows_tokens("standard", q) and not b.allows_tokens("critical", q)
    for h in holds:
        h.release()
