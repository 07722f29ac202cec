"""Table-driven and property tests of the `tidegate` pick: its predictions (predict.py), its
affinity pieces (affinity.py) and its decisions (slo_pick.py)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidegate.policy.affinity import PrefixBlocks, PrefixIndex, home_order
from tidegate.policy.predict import DEFAULT_RATES, Rates, ReplicaLoad, pool_rates, predict, pushed_out
from tidegate.policy.registry import PoolSnapshot, RequestFeatures, RouteInfo, SloTargets, expected_output
from tidegate.policy.slo_pick import TidegatePolicy

CAP = 400_000
# An 8B model on one H100, roughly: 45k prefill tokens/s, 8 ms + 0.15 ms per sequence per step.
FAST = dict(prefill_tokens_per_s=45_000.0, decode_step_base_ms=8.0, decode_step_per_seq_ms=0.15)


def e(rid: str, w: float = 50.0, *, running: int = 0, waiting: int = 0, free: int = CAP, cap: int = CAP,
      rates: dict | None = None) -> RouteInfo:
    return RouteInfo(replica_id=rid, weight=w, running=running, waiting=waiting, kv_free_tokens=free,
                     kv_capacity_tokens=cap, endpoint=f"http://{rid}", **(rates if rates is not None else FAST))


def req(prompt: int = 500, out: int | None = 100, hashes: tuple = (), rid: str = "") -> RequestFeatures:
    return RequestFeatures(prompt_tokens=prompt, max_tokens=out, prefix_hashes=hashes, req_id=rid)


def load(queued=0.0, decoding=0.0, kv_used=0.0, cap=float(CAP), fragility=0.0) -> ReplicaLoad:
    return ReplicaLoad(queued, decoding, kv_used, cap, fragility)


RATES = Rates(prefill_tps=40_000.0, step_base_s=0.010, step_per_seq_s=0.0005)


# ---------------------------------------------------------------------------- predictions


@pytest.mark.parametrize(
    ("ld", "prompt", "cached", "ttft"),
    [
        pytest.param(load(), 4000, 0, 4000 / 40_000 + 0.010, id="idle: own prefill + one step"),
        pytest.param(load(queued=36_000), 4000, 0, 1.0 + 5 * 0.010, id="queued prefill ahead, 5 chunks"),
        pytest.param(load(decoding=20), 4000, 0, 0.1 + 0.020, id="decode batch slows the step"),
        pytest.param(load(), 4000, 3000, 1000 / 40_000 + 0.010, id="cached prefix is not computed"),
        pytest.param(load(), 4000, 4000, 1 / 40_000 + 0.010, id="a full hit still computes one token"),
    ],
)
def test_predicted_ttft(ld, prompt, cached, ttft):
    p = predict("r", ld, RATES, prompt, cached, 100, 50, 2.0, 0.1)
    assert p.ttft_s == pytest.approx(ttft)
    assert p.kv_wait_s == 0


def test_kv_shortfall_adds_a_wait_and_unknown_capacity_does_not():
    full = predict("r", load(kv_used=CAP - 1000, decoding=10), RATES, 4000, 0, 100, 50, 2.0, 0.1)
    assert full.kv_wait_s > 0 and full.ttft_s > full.kv_wait_s
    unknown = predict("r", load(kv_used=CAP - 1000, cap=0.0, decoding=10), RATES, 4000, 0, 100, 50, 2.0, 0.1)
    assert unknown.kv_wait_s == 0


def test_tpot_grows_with_batch_and_queued_prefill():
    base = predict("r", load(), RATES, 500, 0, 100, 50, 2.0, 0.1).tpot_s
    assert base == pytest.approx(RATES.step_s(1) + 500 / 40_000 / 50)
    assert predict("r", load(decoding=100), RATES, 500, 0, 100, 50, 2.0, 0.1).tpot_s > base
    assert predict("r", load(queued=80_000), RATES, 500, 0, 100, 50, 2.0, 0.1).tpot_s > base


def test_cost_counts_own_ttft_and_tpot_when_nobody_is_pushed_out():
    alone = predict("r", load(), RATES, 8000, 0, 100, 50, 2.0, 0.1)
    assert alone.pushed_out == 0 and alone.cost == pytest.approx(alone.ttft_s / 2.0 + alone.tpot_s / 0.1)


# A stall key is what a sequence can absorb (slack x (output - 1) seconds) plus the replica's stall
# counter when it arrived. An 8,000-token prefill at 40k tokens/s stalls everyone there 0.2 s.
@pytest.mark.parametrize(
    ("keys", "stalled", "per_key", "pushed"),
    [
        pytest.param((), 0.0, 1.0, 0, id="nobody there"),
        pytest.param((0.09 * 2, 0.09 * 2), 0.0, 1.0, 2, id="two 3-token answers: 0.18 s each, both pushed"),
        pytest.param((0.09 * 4,), 0.0, 1.0, 0, id="a 5-token answer absorbs it (0.36 s)"),
        pytest.param((0.09 * 144,), 0.0, 1.0, 0, id="a 145-token answer absorbs it"),
        pytest.param((0.09 * 4 + 1.0,), 1.0, 1.0, 0, id="missed already: not this placement's doing"),
        pytest.param((1.1, 1.15), 1.0, 1.0, 2, id="earlier stalls used up most of their budgets"),
        pytest.param((1.15, 1.3), 1.0, 1.0, 1, id="one budget within the stall, one beyond"),
        pytest.param((1.15,), 1.0, 4.0, 4, id="four routers: each key stands for four sequences"),
    ],
)
def test_pushed_out_counts_the_sequences_whose_stall_budget_this_prefill_crosses(keys, stalled, per_key, pushed):
    ld = ReplicaLoad(0.0, 0.0, 0.0, float(CAP), tuple(sorted(keys)), stalled, per_key)
    p = predict("r", ld, RATES, 8000, 0, 100, 50, 2.0, 0.1)
    assert p.pushed_out == pushed
    assert p.cost == pytest.approx(p.ttft_s / 2.0 + p.tpot_s / 0.1 + pushed)


@settings(max_examples=200, deadline=None)
# Multiples of 1/8: sums are exact, so the equality below tests the counting, not the rounding.
@given(st.lists(st.integers(0, 800).map(lambda x: x / 8), max_size=30), st.integers(0, 800).map(lambda x: x / 8),
       st.integers(0, 80).map(lambda x: x / 8), st.integers(0, 80).map(lambda x: x / 8))
def test_pushed_out_is_bounded_and_grows_with_the_stall(keys, stalled, a, b):
    keys = sorted(keys)
    small, large = sorted((a, b))
    p_small, p_large = pushed_out(keys, stalled, small), pushed_out(keys, stalled, large)
    assert 0 <= p_small <= p_large <= sum(1 for k in keys if k > stalled)
    # Two stalls in a row push out as many as one stall of their sum: nobody is counted twice.
    assert pushed_out(keys, stalled, small) + pushed_out(keys, stalled + small, large) == pushed_out(
        keys, stalled, small + large)


def test_placements_use_up_the_stall_budgets_of_a_replicas_short_answers():
    """One router, one replica kept busy with short answers: each 4,000-token prefill placed there
    takes 0.09 s (at 45k tokens/s) from every short answer's budget until they would miss."""
    pol = TidegatePolicy(SloTargets(ttft_s=2.0, tpot_s=0.1))
    snap = PoolSnapshot((e("a"),))
    short = [req(500, 6, rid=f"s{i}") for i in range(3)]
    for r in short:
        dispatch(pol, snap, r, first_token=True)
    pushes = []
    for i in range(6):
        big = req(4000, 200, rid=f"b{i}")
        (p,) = pol.predictions(snap, big)
        pushes.append(p.pushed_out)
        pol.on_dispatch(big, "a")
    # Each 6-token answer absorbs about (0.1 - step) x 5 = 0.46 s of prefill: five 0.09 s stalls
    # leave them within their target, the next ones push them out, each one once.
    assert pushes[:4] == [0, 0, 0, 0] and sum(pushes) == 3 and pushes == sorted(pushes), pushes
    for r in short:
        pol.on_complete(r, "a")
    (p,) = pol.predictions(snap, req(4000, 200, rid="after"))
    assert p.pushed_out == 0  # finished sequences leave the stall keys


@pytest.mark.parametrize("out", [6, None])
def test_answers_of_unknown_length_count_for_admission_not_in_the_picks_cost(out: int | None):
    """The replica of short answers above. When they came without max_tokens, their length is the
    mean output (about 6 here, learned from finished answers): admission's open rule still counts
    the prefills that push them out (Prediction.pushed_out), but the pick's cost does not (a guess
    wrong for most sequences where outputs spread, and it did worse than none)."""
    slo = SloTargets(ttft_s=2.0, tpot_s=0.1)
    pol = TidegatePolicy(slo)
    for i in range(1000):  # finished answers were 6 tokens long
        pol.on_output(req(500, None, rid=f"done{i}"), "a", 6)
    snap = PoolSnapshot((e("a"),))
    short = [req(500, out, rid=f"s{i}") for i in range(3)]
    for r in short:
        dispatch(pol, snap, r, first_token=True)
    pushed, costed = 0.0, 0.0
    for i in range(6):
        big = req(4000, 200, rid=f"b{i}")
        (p,) = pol.predictions(snap, big)
        pick = pol.pick(snap, big, random.Random(0))
        assert pick is not None and pick.effective_weight == p.cost   # make_pick carries the cost
        pushed += p.pushed_out
        costed += p.cost - (p.ttft_s / slo.ttft_s + p.tpot_s / slo.tpot_s)
        pol.on_dispatch(big, "a")
    assert pushed == 3
    assert costed == pytest.approx(3 if out is not None else 0)
    for r in short:
        pol.on_complete(r, "a")
    (after,) = pol.predictions(snap, req(4000, 200, rid="after"))
    assert after.pushed_out == 0   # finished: their keys are gone, guessed or not


def only(prefill: float = 0.0, base: float = 0.0, per_seq: float = 0.0) -> dict:
    return dict(prefill_tokens_per_s=prefill, decode_step_base_ms=base, decode_step_per_seq_ms=per_seq)


def test_rates_are_the_pool_median_unless_a_replica_is_another_kind_of_gpu():
    # Fits of identical replicas differ by noise: every one gets the pool's median.
    noisy = pool_rates([e("a", rates=only(42_000, 7.4, 0.0001)), e("b", rates=only(46_000, 9.4, 0.7)),
                        e("c", rates=only(50_000, 8.6, 0.3)), e("d", rates={})])
    assert {r.prefill_tps for r in noisy.values()} == {46_000}
    assert all(r.step_base_s == pytest.approx(0.0086) and r.step_per_seq_s == pytest.approx(0.0003)
               for r in noisy.values())
    # A replica 3x slower at prefill (another GPU) keeps its own figure; the others take the median.
    mixed = pool_rates([e("a", rates=only(15_000, 8.0, 0.2)), e("b", rates=only(45_000, 8.0, 0.2)),
                        e("c", rates=only(46_000, 8.0, 0.2))])
    assert mixed["a"].prefill_tps == 15_000 and mixed["b"].prefill_tps == mixed["c"].prefill_tps == 45_000
    # Nothing fitted anywhere (0, NaN, inf, negative): the defaults.
    nothing = pool_rates([e("x", rates=only(math.nan, -1.0, math.inf)), e("y", rates={})])
    assert nothing["x"] == nothing["y"] == DEFAULT_RATES


# ---------------------------------------------------------------------------- affinity pieces


def test_home_is_the_same_for_every_router_and_any_entry_order():
    blocks = PrefixBlocks((11, 12, 13, 14), 2048)
    ids = [f"replica-{i:02d}" for i in range(16)]
    order = home_order(ids, blocks)
    assert home_order(list(reversed(ids)), blocks) == order
    assert PrefixIndex().rank(order[0], blocks.home_key) > PrefixIndex().rank(order[1], blocks.home_key)
    # Different prefixes spread over the replicas.
    homes = {home_order(ids, PrefixBlocks((k, k + 1), 1024))[0] for k in range(0, 400, 2)}
    assert len(homes) >= 12


def test_index_counts_leading_blocks_and_forgets_beyond_capacity():
    idx = PrefixIndex()
    a = PrefixBlocks((1, 2, 3, 4), 2048)          # 512 tokens per block
    idx.learn("r", a, capacity_tokens=4096)
    assert idx.cached_tokens("r", PrefixBlocks((1, 2, 9, 9), 2048)) == 1024
    assert idx.cached_tokens("r", PrefixBlocks((9, 2, 3, 4), 2048)) == 0   # chained: a different start
    assert idx.cached_tokens("other", a) == 0
    # Room for 8 blocks: 6 more evict two of a's, its tail first (as the engine frees a request's
    # blocks), so its head still matches; two more evict the rest of it.
    idx.learn("r", PrefixBlocks((5, 6, 7, 8, 10, 11), 3072), capacity_tokens=4096)
    assert idx.cached_tokens("r", a) == 1024
    idx.learn("r", PrefixBlocks((12, 13), 1024), capacity_tokens=4096)
    assert idx.cached_tokens("r", a) == 0


def test_blocks_of_a_known_size_count_only_the_head_the_router_hashed():
    """The router hashes at most 256 blocks of a long prompt: its cached tokens are the matching
    blocks times the block size, not the whole prompt spread over the hashed blocks."""
    idx = PrefixIndex()
    hashes = tuple(range(1, 257))
    idx.learn("r", PrefixBlocks(hashes, 60_000, 64), capacity_tokens=400_000)
    assert idx.cached_tokens("r", PrefixBlocks(hashes[:100] + (999,) * 156, 60_000, 64)) == 100 * 64
    # Without the size (a trace's ids over its whole prompt): each id stands for prompt / ids.
    assert PrefixBlocks(hashes, 60_000).tokens_per_block == pytest.approx(60_000 / 256)


# ---------------------------------------------------------------------------- decisions


def dispatch(pol: TidegatePolicy, snap: PoolSnapshot, r: RequestFeatures, first_token: bool = False) -> str:
    p = pol.pick(snap, r, random.Random(0))
    assert p is not None
    pol.on_dispatch(r, p.replica_id)
    if first_token:
        pol.on_first_token(r, p.replica_id)
    return p.replica_id


def test_long_prefill_queued_on_a_sends_a_short_chat_to_b():
    pol = TidegatePolicy()
    snap = PoolSnapshot((e("a"), e("b")))
    pol.on_dispatch(req(50_000, rid="doc"), "a")                  # still prefilling on a
    pol.on_dispatch(req(300, rid="chat0"), "b")
    pol.on_first_token(req(300, rid="chat0"), "b")                # decoding on b
    assert pol.pick(snap, req(200, rid="chat"), random.Random(0)).replica_id == "b"


def test_first_token_moves_work_from_the_prefill_queue():
    pol = TidegatePolicy()
    snap = PoolSnapshot((e("a"), e("b")))
    doc = req(50_000, out=2000, rid="doc")
    pol.on_dispatch(doc, "a")
    before = {p.replica_id: p for p in pol.predictions(snap, req(200))}
    pol.on_first_token(doc, "a")
    after = {p.replica_id: p for p in pol.predictions(snap, req(200))}
    assert after["a"].ttft_s < before["a"].ttft_s
    pol.on_complete(doc, "a")
    done = {p.replica_id: p for p in pol.predictions(snap, req(200))}
    assert done["a"].ttft_s == pytest.approx(done["b"].ttft_s)


def test_cached_prefix_on_an_idle_replica_beats_a_cold_one():
    pol = TidegatePolicy()
    snap = PoolSnapshot((e("a"), e("b"), e("c")))
    doc = tuple(range(40))                                         # 40 blocks of 512 tokens
    first = dispatch(pol, snap, req(20_480, hashes=doc, rid="d0"), first_token=True)
    pol.on_complete(req(20_480, hashes=doc, rid="d0"), first)
    for i in range(5):
        follow = req(21_000, hashes=doc + (1000 + i,), rid=f"d{i + 1}")
        assert pol.pick(snap, follow, random.Random(i)).replica_id == first


def test_the_same_prefix_loses_on_an_overloaded_replica():
    pol = TidegatePolicy()
    snap = PoolSnapshot((e("a"), e("b")))
    doc = tuple(range(8))                                          # 8 blocks of 512 tokens
    home = dispatch(pol, snap, req(4096, hashes=doc, rid="d0"))
    other = "b" if home == "a" else "a"
    for i in range(12):                                            # 12 long prefills queue there
        pol.on_dispatch(req(30_000, rid=f"big{i}"), home)
    p = pol.pick(snap, req(4200, hashes=doc + (99,), rid="d1"), random.Random(0))
    assert p.replica_id == other


def test_bounded_load_spreads_a_hot_prefix():
    pol = TidegatePolicy()
    ids = [f"r{i}" for i in range(8)]
    snap = PoolSnapshot(tuple(e(r) for r in ids))
    system = tuple(range(4))                                       # a shared system prompt
    chosen = [dispatch(pol, snap, req(2048 + 512, hashes=system + (100 + i,), rid=f"q{i}")) for i in range(64)]
    counts = {r: chosen.count(r) for r in ids}
    assert max(counts.values()) < 64 / 2                           # no replica melts
    assert sum(1 for c in counts.values() if c) >= 4


def test_without_rates_the_least_loaded_in_tokens_wins():
    pol = TidegatePolicy()
    zero = dict(prefill_tokens_per_s=0.0, decode_step_base_ms=0.0, decode_step_per_seq_ms=0.0)
    snap = PoolSnapshot((e("a", rates=zero), e("b", rates=zero), e("c", rates=zero)))
    pol.on_dispatch(req(10_000, rid="x"), "a")
    pol.on_dispatch(req(3_000, rid="y"), "b")
    pol.on_dispatch(req(1_000, rid="z"), "c")
    assert pol.pick(snap, req(500, rid="n"), random.Random(0)).replica_id == "c"


def test_fragile_decoders_are_spared_a_long_prefill():
    pol = TidegatePolicy()
    snap = PoolSnapshot((e("a"), e("b")))
    for i in range(6):                                             # 3-token answers decoding on a
        r = req(200, out=3, rid=f"short{i}")
        pol.on_dispatch(r, "a")
        pol.on_first_token(r, "a")
    for i in range(6):                                             # long answers decoding on b
        r = req(200, out=1000, rid=f"long{i}")
        pol.on_dispatch(r, "b")
        pol.on_first_token(r, "b")
    assert pol.pick(snap, req(16_000, out=500, rid="doc"), random.Random(0)).replica_id == "b"


@pytest.mark.parametrize(("table_inflight", "scale"), [(1, 1.0), (4, 4.0), (0, 1.0), (10_000, 64.0)],
                         ids=["one-router", "four-routers", "empty-table", "share-floor"])
def test_own_load_is_scaled_to_the_pool_by_this_routers_share(table_inflight, scale):
    pol = TidegatePolicy()
    pol.on_dispatch(req(10_000, rid="mine"), "a")
    # KV capacity unknown (0): no KV wait, so the TTFT gap is the scaled queue (and its steps).
    snap = PoolSnapshot((e("a", waiting=table_inflight, cap=0, free=0), e("b", cap=0, free=0)))
    got = {p.replica_id: p for p in pol.predictions(snap, req(1000, rid="n"))}
    rate = FAST["prefill_tokens_per_s"]
    assert got["a"].ttft_s - got["b"].ttft_s == pytest.approx(10_000 * scale / rate, rel=0.1)


def test_a_replica_without_kv_room_is_used_only_when_none_has_room():
    pol = TidegatePolicy()
    pol.on_dispatch(req(20_000, rid="queued"), "b")               # b: 20k tokens of prefill queued
    full = e("a", free=10_000)                                     # a: idle, but its KV is nearly full
    assert pol.pick(PoolSnapshot((full, e("b"))), req(30_000, rid="doc"), random.Random(0)).replica_id == "b"
    both = PoolSnapshot((full, e("b", free=10_000)))
    assert pol.pick(both, req(30_000, rid="doc2"), random.Random(0)) is not None


@pytest.mark.parametrize(("follow_hashes", "expected"), [
    (tuple(range(40)) + (99,), "a"),    # holds its prefix: the short wait for KV beats a cold prefill
    (tuple(range(500, 541)), "b"),      # nothing cached on a: no waiver (the test above pins the KV filter)
])
def test_a_replica_short_of_kv_stays_fit_for_prompts_whose_prefix_it_holds(follow_hashes, expected):
    pol = TidegatePolicy()
    doc = tuple(range(40))                                         # 40 blocks of 512 tokens
    pol.on_dispatch(req(20_480, hashes=doc, rid="d0"), "a")
    pol.on_first_token(req(20_480, hashes=doc, rid="d0"), "a")
    pol.on_complete(req(20_480, hashes=doc, rid="d0"), "a")
    snap = PoolSnapshot((e("a", free=500), e("b")))                # a: its cache holds doc, its KV nearly full
    follow = req(20_992, hashes=follow_hashes, rid="d1")
    preds = {p.replica_id: p for p in pol.predictions(snap, follow)}
    assert preds["a"].kv_wait_s > 0 and preds["b"].kv_wait_s == 0
    assert pol.pick(snap, follow, random.Random(0)).replica_id == expected


def test_own_ttft_target_outranks_sparing_decoders():
    pol = TidegatePolicy(slo=SloTargets(ttft_s=1.0, tpot_s=0.1))
    for i in range(8):                                             # fragile decoders on a (idle prefill)
        r = req(200, out=3, rid=f"s{i}")
        pol.on_dispatch(r, "a")
        pol.on_first_token(r, "a")
    pol.on_dispatch(req(45_000, rid="q"), "b")                     # b: a second of prefill queued
    # A 30k-token document misses its 1 s TTFT on b; on a it meets it, at the decoders' expense.
    p = pol.pick(PoolSnapshot((e("a"), e("b"))), req(30_000, out=300, rid="doc"), random.Random(0))
    assert p.replica_id == "a"


def test_tpot_misfit_is_avoided_and_all_misfit_falls_back():
    pol = TidegatePolicy(slo=SloTargets(ttft_s=2.0, tpot_s=0.02))
    slow = dict(prefill_tokens_per_s=45_000.0, decode_step_base_ms=25.0, decode_step_per_seq_ms=0.1)
    p = pol.pick(PoolSnapshot((e("a", rates=slow), e("b"))), req(), random.Random(0))
    assert p.replica_id == "b" and p.reason == "slo_fit"
    p = pol.pick(PoolSnapshot((e("a", rates=slow), e("b", rates=slow))), req(), random.Random(0))
    assert p is not None and p.reason == "no_tpot_fit"


def test_snapshot_slo_overrides_the_policy_default():
    pol = TidegatePolicy(slo=SloTargets(ttft_s=2.0, tpot_s=0.02))
    slow = dict(prefill_tokens_per_s=45_000.0, decode_step_base_ms=25.0, decode_step_per_seq_ms=0.1)
    snap = PoolSnapshot((e("a", rates=slow), e("b", rates=slow)), slo=SloTargets(ttft_s=2.0, tpot_s=0.1))
    assert pol.pick(snap, req(), random.Random(0)).reason == "slo_fit"


@pytest.mark.parametrize(
    ("entries", "exclude", "expected"),
    [
        pytest.param((), frozenset(), None, id="empty"),
        pytest.param((e("a", 0), e("b", math.nan)), frozenset(), None, id="none-routable"),
        pytest.param((e("a"), e("b")), frozenset({"a", "b"}), None, id="all-excluded"),
        pytest.param((e("a"), e("b")), frozenset({"a"}), "b", id="one-left"),
        pytest.param((e("a", 0), e("b", -1), e("c")), frozenset(), "c", id="only-routable"),
    ],
)
def test_edge_cases(entries, exclude, expected):
    p = TidegatePolicy().pick(PoolSnapshot(entries, {}, exclude), req(hashes=(1, 2)), random.Random(0))
    assert (p.replica_id if p else None) == expected


def test_hooks_for_unknown_requests_are_ignored():
    pol = TidegatePolicy()
    pol.on_first_token(req(rid="ghost"), "a")
    pol.on_complete(req(rid="ghost"), "a")
    pol.on_dispatch(req(rid="x"), "a")
    pol.on_complete(req(rid="x"), "a")
    pol.on_complete(req(rid="x"), "a")     # twice: no negative counts
    assert pol.predictions(PoolSnapshot((e("a"),)), req())[0].ttft_s > 0


# ---------------------------------------------------------------------------- properties

IDS = ["r0", "r1", "r2", "r3", "r4"]
rates_st = st.fixed_dictionaries({
    "prefill_tokens_per_s": st.one_of(st.just(0.0), st.floats(1_000, 100_000)),
    "decode_step_base_ms": st.one_of(st.just(0.0), st.floats(1, 50)),
    "decode_step_per_seq_ms": st.one_of(st.just(0.0), st.floats(0.01, 2)),
})
entry_st = st.builds(
    lambda rid, w, running, waiting, free, cap, rates: e(rid, w, running=running, waiting=waiting, free=free,
                                                         cap=cap, rates=rates),
    st.sampled_from(IDS),
    st.one_of(st.floats(0, 100), st.just(math.nan), st.just(-1.0)),
    st.integers(0, 300), st.integers(0, 300), st.integers(0, CAP), st.integers(0, CAP), rates_st,
)
history_st = st.lists(st.tuples(st.integers(1, 60_000), st.lists(st.integers(0, 4), max_size=8),
                                st.booleans(), st.booleans()), max_size=12)


def replay(entries, history) -> TidegatePolicy:
    """A policy instance after a router-local history: dispatches, some first tokens, some completions."""
    pol = TidegatePolicy()
    snap = PoolSnapshot(tuple(entries))
    for i, (prompt, hashes, started, done) in enumerate(history):
        r = req(prompt, hashes=tuple(hashes), rid=f"h{i}")
        p = pol.pick(snap, r, random.Random(i))
        if p is None:
            continue
        pol.on_dispatch(r, p.replica_id)
        if started:
            pol.on_first_token(r, p.replica_id)
        if done:
            pol.on_complete(r, p.replica_id)
    return pol


@settings(max_examples=150, deadline=None)
@given(entries=st.lists(entry_st, max_size=5, unique_by=lambda x: x.replica_id),
       exclude=st.frozensets(st.sampled_from(IDS)), history=history_st,
       prompt=st.integers(1, 100_000), hashes=st.lists(st.integers(0, 4), max_size=8), seed=st.integers(0, 2**32 - 1))
def test_property_routable_deterministic_and_order_free(entries, exclude, history, prompt, hashes, seed):
    routable = {x.replica_id for x in entries if math.isfinite(x.weight) and x.weight > 0} - exclude
    r = req(prompt, hashes=tuple(hashes), rid="new")
    a = replay(entries, history).pick(PoolSnapshot(tuple(entries), {}, exclude), r, random.Random(seed))
    b = replay(entries, history).pick(PoolSnapshot(tuple(entries), {}, exclude), r, random.Random(seed))
    shuffled = list(entries)
    random.Random(seed).shuffle(shuffled)
    c = replay(shuffled, history).pick(PoolSnapshot(tuple(shuffled), {}, exclude), r, random.Random(seed))
    assert a == b
    assert (a.replica_id if a else None) == (c.replica_id if c else None)
    if a is None:
        assert not routable
    else:
        assert a.replica_id in routable and math.isfinite(a.effective_weight)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(2, 20), hashes=st.lists(st.integers(0, 10**9), min_size=1, max_size=64),
       prompt=st.integers(1, 60_000))
def test_property_every_router_picks_the_same_home(n, hashes, prompt):
    ids = [f"replica-{i}" for i in range(n)]
    entries = tuple(e(r) for r in ids)
    r = req(prompt, hashes=tuple(hashes))
    # Fresh routers (no history): the same prefix goes to the same replica, whatever the entry order.
    picks = {TidegatePolicy().pick(PoolSnapshot(tuple(entries[::step])), r, random.Random(k)).replica_id
             for k, step in enumerate((1, -1))}
    assert len(picks) == 1
    assert picks == {home_order(ids, PrefixBlocks(tuple(hashes), prompt))[0]}


# ---------------------------------------------------------------------------- output lengths


def _kv_wait(policy: TidegatePolicy, request: RequestFeatures) -> float:
    snap = PoolSnapshot(entries=(e("a", running=10, free=20_000),), slo=SloTargets())
    (p,) = policy.predictions(snap, request)
    return p.kv_wait_s


@pytest.mark.parametrize(
    ("max_tokens", "observed", "waits_before", "waits_after"),
    [
        pytest.param(30_000, 300, True, False, id="a generous cap, short answers: the cap stops counting"),
        pytest.param(30_000, 30_000, True, True, id="answers use the cap: still counted"),
        pytest.param(None, 40_000, False, True, id="no cap: the learned mean output counts"),
    ],
)
def test_output_length_is_learned_from_finished_requests(max_tokens, observed, waits_before, waits_after):
    policy = TidegatePolicy()
    probe = req(prompt=1000, out=max_tokens)
    assert (_kv_wait(policy, probe) > 0) is waits_before
    for i in range(600):
        done = req(prompt=1000, out=max_tokens, rid=f"r{i}")
        policy.on_dispatch(done, "a")
        policy.on_complete(done, "a")
        policy.on_output(done, "a", observed)
    assert (_kv_wait(policy, probe) > 0) is waits_after


def test_output_hook_counts_outputs_past_the_cap_as_the_cap():
    probe = req(prompt=1000, out=30_000)
    waits = {}
    for reported in (90_000, 30_000, 3_000):  # 90k: more than the cap, counts as the whole cap, no more
        policy = TidegatePolicy()
        for i in range(100):
            policy.on_output(req(prompt=1000, out=30_000, rid=f"r{i}"), "a", reported)
        waits[reported] = _kv_wait(policy, probe)
    assert waits[90_000] == pytest.approx(waits[30_000])
    assert waits[3_000] != pytest.approx(waits[30_000])


@pytest.mark.parametrize(
    ("base_a", "base_b", "same"),
    [
        pytest.param(0.05, 1.4, True, id="sub-ms bases: noise below the ITL buckets, both take the median"),
        pytest.param(8.0, 20.0, False, id="8 vs 20 ms: another kind of GPU keeps its own"),
    ],
)
def test_tiny_step_differences_are_not_another_kind_of_gpu(base_a, base_b, same):
    rates = pool_rates([e("a", rates=dict(FAST, decode_step_base_ms=base_a)),
                        e("b", rates=dict(FAST, decode_step_base_ms=base_b))])
    assert (rates["a"] == rates["b"]) is same


def test_an_uncordoned_replica_with_a_noisy_fit_gets_traffic_again():
    """Idle fleet, sequential tiny requests: the replica whose (noisy) fit reads slower still wins
    some picks, so its fit can be corrected; it is not starved."""
    policy = TidegatePolicy()
    snap = PoolSnapshot(entries=(e("a", rates=dict(FAST, decode_step_base_ms=1.4)),
                                 e("b", rates=dict(FAST, decode_step_base_ms=0.05))))
    rng = random.Random(3)
    picks = [policy.pick(snap, req(prompt=2, out=2), rng).replica_id for _ in range(200)]
    assert 40 <= picks.count("a") <= 160


def test_a_shared_prefix_counts_once_in_a_replicas_kv():
    # Turns of one conversation on one replica share their history's blocks there, as the
    # engine's prefix cache does: each adds only its new prompt and its output.
    pol = TidegatePolicy()
    history = tuple(range(40))                                     # 40 blocks of 512 tokens
    pol.on_dispatch(req(20_480, out=100, hashes=history, rid="t0"), "a")
    pol.on_dispatch(req(21_000, out=100, hashes=history + (1000,), rid="t1"), "a")
    kv = pol.take_report().loads["a"].kv
    # (the second's cached part is 40 of its 41 blocks of 21,000 / 41 tokens: 20,487; each
    # holds half its output over its life: predict.held_kv)
    assert kv == pytest.approx((20_480 + 50) + (21_000 - 20_487 + 50))


def test_long_answers_in_flight_leave_the_kv_room_they_have_not_written_yet():
    """250 answers of ~1,500 tokens in flight on a 448k-token replica hold about their prompts and
    half their outputs (262k, as the table says); counted at their whole outputs (450k) they would
    make it look full, and a new request would be predicted to wait for room that is there."""
    cap = 448_000
    pol = TidegatePolicy()
    for i in range(250):
        pol.on_dispatch(req(300, out=1500, rid=f"q{i}"), "a")
        pol.on_first_token(req(300, out=1500, rid=f"q{i}"), "a")
    held = 250 * (300 + 750)
    assert pol.take_report().loads["a"].kv == pytest.approx(held)
    snap = PoolSnapshot(entries=(e("a", running=250, free=cap - held, cap=cap), e("b", cap=cap)))
    preds = {p.replica_id: p for p in pol.predictions(snap, req(300, out=1500))}
    assert preds["a"].kv_wait_s == 0
    # Its own fit still asks room for its whole output: a replica with less free than that waits.
    tight = PoolSnapshot(entries=(e("a", running=250, free=1000, cap=cap), e("b", cap=cap)))
    assert {p.replica_id: p for p in pol.predictions(tight, req(300, out=1500))}["a"].kv_wait_s > 0


def test_the_expected_output_is_the_cap_scaled_by_the_share_answers_used():
    """What the admission budget counts (registry.expected_output): a 16,384 cap on answers that
    write ~128 tokens is expected to write about 128, not 16,384; without a cap, the mean answer."""
    pol = TidegatePolicy()
    assert expected_output(pol, req(500, out=16_384)) == pytest.approx(16_384)   # nothing learned yet
    for i in range(2000):
        done = req(500, out=16_384, rid=f"d{i}")
        pol.on_dispatch(done, "a")
        pol.on_complete(done, "a")
        pol.on_output(done, "a", 128)
    assert expected_output(pol, req(500, out=16_384)) == pytest.approx(128, rel=0.05)
    assert expected_output(pol, req(500, out=None)) == pytest.approx(128, rel=0.05)
    # A policy without an estimate: the request's max_tokens, 0 without.
    assert expected_output(object(), req(500, out=300)) == 300.0
    assert expected_output(object(), req(500, out=None)) == 0.0
