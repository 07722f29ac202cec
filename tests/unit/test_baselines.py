"""Table-driven and property tests of the policy registry and every registered policy."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidegate.policy import registry
from tidegate.policy.baselines.sglang_cache_aware import SglangCacheAware
from tidegate.policy.registry import LiveLoad, PoolSnapshot, RequestFeatures, RouteInfo

ALL = registry.names()


def e(rid: str, w: float = 50.0, *, free: int = 1000, cap: int = 1000, running: int = 0, waiting: int = 0) -> RouteInfo:
    return RouteInfo(replica_id=rid, weight=w, kv_free_tokens=free, kv_capacity_tokens=cap, running=running,
                     waiting=waiting, endpoint=f"http://{rid}")


def req(prompt: int = 100, hashes: tuple = (), out: int = 10, rid: str = "q", priority: int = 0) -> RequestFeatures:
    return RequestFeatures(prompt_tokens=prompt, max_tokens=out, prefix_hashes=hashes, priority=priority, req_id=rid,
                           true_output_tokens=out)


def test_registry_lists_every_policy():
    assert set(ALL) == {"tidegate", "round_robin", "random", "least_request", "least_kv", "llmd",
                        "sglang_cache_aware", "clairvoyant", "llmd_table"}


def test_unknown_policy_lists_valid_names():
    with pytest.raises(registry.UnknownPolicyError) as exc:
        registry.create("fastest")
    assert "fastest" in str(exc.value)
    for name in ALL:
        assert name in str(exc.value)


def test_create_gives_independent_state():
    a, b = registry.create("round_robin"), registry.create("round_robin")
    snap = PoolSnapshot((e("a"), e("b")))
    first = a.pick(snap, req(), random.Random(0)).replica_id
    assert a.pick(snap, req(), random.Random(0)).replica_id != first   # a's cursor moved
    assert b.pick(snap, req(), random.Random(0)).replica_id == first   # b's did not


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize(
    ("entries", "exclude"),
    [
        pytest.param((), frozenset(), id="empty"),
        pytest.param((e("a", 0), e("b", 0)), frozenset(), id="all-zero-weight"),
        pytest.param((e("a", math.nan), e("b", -1)), frozenset(), id="nan-negative"),
        pytest.param((e("a"), e("b")), frozenset({"a", "b"}), id="all-excluded"),
    ],
)
def test_no_candidate_gives_none(name, entries, exclude):
    assert registry.create(name).pick(PoolSnapshot(entries, {}, exclude), req(), random.Random(0)) is None


@pytest.mark.parametrize("name", ALL)
def test_single_candidate_is_chosen(name):
    snap = PoolSnapshot((e("a", 0), e("b"), e("c")), {"b": 500}, frozenset({"c"}))
    p = registry.create(name).pick(snap, req(), random.Random(0))
    assert p is not None and p.replica_id == "b" and p.candidates == 1


# (policy, entries, inflight, live, request, expected) -- deterministic cases, whatever the rng
CASES = [
    ("least_request", (e("a"), e("b"), e("c")), {"a": 3, "b": 1, "c": 2}, None, req(), "b"),
    ("least_kv", (e("a", free=100), e("b", free=900), e("c", free=500)), {}, None, req(), "b"),
    ("least_kv", (e("a", free=500), e("b", free=500)), {"a": 2}, None, req(), "b"),
    ("llmd", (e("a", waiting=9), e("b", waiting=0), e("c", waiting=3)), {}, None, req(), "b"),
    ("llmd", (e("a", free=200), e("b", free=900)), {}, None, req(), "b"),
    ("clairvoyant", (e("a"), e("b")), {},
     {"a": LiveLoad(30, 0, 1000, 1000), "b": LiveLoad(2, 0, 1000, 1000)}, req(), "b"),
    ("tidegate", (e("a", 0), e("b", 10)), {}, None, req(), "b"),
    ("sglang_cache_aware", (e("a"), e("b")), {"a": 100, "b": 10}, None, req(), "b"),  # imbalanced -> shortest
]


@pytest.mark.parametrize(("name", "entries", "inflight", "live", "features", "expected"), CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_table(name, entries, inflight, live, features, expected):
    p = registry.create(name).pick(PoolSnapshot(entries, inflight, frozenset(), live), features, random.Random(3))
    assert p is not None and p.replica_id == expected


def test_round_robin_cycles_in_id_order_from_a_random_phase():
    snap = PoolSnapshot((e("c"), e("a"), e("b")))
    starts = set()
    for seed in range(20):
        rr = registry.create("round_robin")
        rng = random.Random(seed)
        seq = "".join(rr.pick(snap, req(), rng).replica_id for _ in range(6))
        assert seq in ("abcabc", "bcabca", "cabcab")
        starts.add(seq[0])
    # Routers do not start in lockstep (every N-th request of N routers on one replica).
    assert starts == {"a", "b", "c"}


def test_llmd_prefers_the_replica_that_holds_the_prefix():
    pol = registry.create("llmd")
    snap = PoolSnapshot((e("a"), e("b"), e("c")))
    first = pol.pick(snap, req(hashes=(1, 2, 3, 4)), random.Random(0)).replica_id
    # Equal load: the prefix scorer (weight 3) decides for every later request with that prefix.
    for seed in range(10):
        assert pol.pick(snap, req(hashes=(1, 2, 3, 9)), random.Random(seed)).replica_id == first


def test_llmd_prefix_loses_to_a_much_shorter_queue():
    pol = registry.create("llmd")
    first = pol.pick(PoolSnapshot((e("a"), e("b", waiting=1))), req(hashes=(7, 8)), random.Random(0)).replica_id
    assert first == "a"
    # a now holds the prefix, but with the longest queue and a full KV cache it scores 3 (prefix
    # only) against b's 2 * 1 (queue) + 2 * 1 (KV) = 4.
    snap = PoolSnapshot((e("a", waiting=20, free=0), e("b", waiting=0)))
    assert pol.pick(snap, req(hashes=(7, 8)), random.Random(0)).replica_id == "b"


def test_llmd_sheds_sheddable_requests_when_all_saturated():
    pol = registry.create("llmd")
    snap = PoolSnapshot((e("a", waiting=5), e("b", free=100)))  # queue >= 5 / kv 90% >= 80%
    assert pol.pick(snap, req(priority=-1), random.Random(0)) is None
    assert pol.pick(snap, req(priority=0), random.Random(0)) is not None


def test_sglang_cache_hit_over_threshold_and_smallest_tree_below():
    pol = SglangCacheAware()
    snap = PoolSnapshot((e("a"), e("b")))
    # Empty trees: smallest tree (tie -> id order) = a; a now holds blocks 1..4.
    assert pol.pick(snap, req(400, (1, 2, 3, 4)), random.Random(0)).replica_id == "a"
    # 2 of 4 blocks match a (0.5 > 0.3): cache hit on a.
    hit = pol.pick(snap, req(400, (1, 2, 8, 9)), random.Random(0))
    assert hit.replica_id == "a" and hit.reason == "cache_hit"
    # 1 of 4 (0.25 <= 0.3): the smallest tree, b.
    miss = pol.pick(snap, req(400, (1, 5, 6, 7)), random.Random(0))
    assert miss.replica_id == "b" and miss.reason == "smallest_tree"


def test_sglang_balance_needs_both_thresholds():
    pol = SglangCacheAware()
    snap_abs_only = PoolSnapshot((e("a"), e("b")), {"a": 200, "b": 150})  # diff 50 <= 64
    pol.pick(PoolSnapshot((e("a"), e("b"))), req(400, (1, 2)), random.Random(0))  # a holds (1, 2)
    assert pol.pick(snap_abs_only, req(400, (1, 2)), random.Random(0)).reason == "cache_hit"
    snap_both = PoolSnapshot((e("a"), e("b")), {"a": 200, "b": 100})  # diff 100 > 64 and 200 > 150
    assert pol.pick(snap_both, req(400, (1, 2)), random.Random(0)).reason == "imbalanced_shortest_queue"


def test_clairvoyant_avoids_kv_overflow_with_true_lengths():
    pol = registry.create("clairvoyant")
    snap = PoolSnapshot((e("a", cap=1000), e("b", cap=1000)))
    big = req(100, out=800, rid="big")
    pol.on_dispatch(big, "a")  # a has 900 tokens committed
    p = pol.pick(snap, req(100, out=200, rid="next"), random.Random(0))
    assert p.replica_id == "b"
    pol.on_first_token(big, "a")
    pol.on_complete(big, "a")
    p = pol.pick(snap, req(100, out=200, rid="next2"), random.Random(0))
    assert p.replica_id == "a"  # tie -> id order once a is empty again


def test_tidegate_is_the_slo_pick():
    # Its own table and property tests: tests/unit/test_slo_pick.py.
    from tidegate.policy.slo_pick import TidegatePolicy

    assert isinstance(registry.create("tidegate"), TidegatePolicy)


entry_st = st.builds(
    RouteInfo,
    replica_id=st.sampled_from(["r0", "r1", "r2", "r3", "r4"]),
    weight=st.one_of(st.floats(0, 100), st.just(0.0), st.just(math.nan), st.just(-1.0)),
    kv_free_tokens=st.integers(0, 2000),
    kv_capacity_tokens=st.integers(0, 2000),
    running=st.integers(0, 300),
    waiting=st.integers(0, 300),
)


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(ALL),
    entries=st.lists(entry_st, max_size=6, unique_by=lambda x: x.replica_id),
    inflight=st.dictionaries(st.sampled_from(["r0", "r1", "r2", "r3", "r4"]), st.integers(-2, 300)),
    exclude=st.frozensets(st.sampled_from(["r0", "r1", "r2", "r3", "r4"])),
    hashes=st.lists(st.integers(0, 5), max_size=6),
    priority=st.integers(-1, 1),
    seed=st.integers(0, 2**32 - 1),
    history=st.lists(st.tuples(st.lists(st.integers(0, 5), max_size=6), st.integers(1, 4000)), max_size=5),
)
def test_property_pick_is_a_routable_candidate_and_deterministic(name, entries, inflight, exclude, hashes,
                                                                  priority, seed, history):
    snap = PoolSnapshot(tuple(entries), inflight, exclude)
    routable = {x.replica_id for x in entries
                if math.isfinite(x.weight) and x.weight > 0 and x.replica_id not in exclude}
    picks = []
    for _ in range(2):
        pol = registry.create(name)
        for i, (h, p) in enumerate(history):  # the same router-local history for both instances
            r = req(p, tuple(h), rid=f"h{i}")
            got = pol.pick(snap, r, random.Random(i))
            if got is not None:
                registry.notify(pol, "on_dispatch", r, got.replica_id)
        picks.append(pol.pick(snap, req(500, tuple(hashes), priority=priority), random.Random(seed)))
    a, b = picks
    assert a == b
    if a is None:
        assert not routable or (name in ("llmd", "llmd_table") and priority < 0)
    else:
        assert a.replica_id in routable
