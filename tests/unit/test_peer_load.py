"""Routers' load reports to their peers (tidegate/policy/peer_load.py) and how the `tidegate`
pick uses them: pure logic, no processes."""

from __future__ import annotations

import math
import random

import pytest

from tidegate.policy import slo_pick
from tidegate.policy.affinity import PrefixBlocks
from tidegate.policy.peer_load import (
    LearnedBlocks,
    PeerReport,
    PeerSum,
    ReleasedBlocks,
    ReplicaLoadReport,
    owned_replicas,
    placed_since,
    sum_peers,
)
from tidegate.policy.registry import PoolSnapshot, RequestFeatures, RouteInfo
from tidegate.policy.slo_pick import TidegatePolicy

CAP = 400_000
FAST = dict(prefill_tokens_per_s=45_000.0, decode_step_base_ms=8.0, decode_step_per_seq_ms=0.15)


def e(rid: str, *, waiting: int = 0, cap: int = CAP) -> RouteInfo:
    return RouteInfo(replica_id=rid, weight=50.0, waiting=waiting, kv_free_tokens=cap, kv_capacity_tokens=cap,
                     endpoint=f"http://{rid}", **FAST)


def req(prompt: int = 500, out: int | None = 100, rid: str = "") -> RequestFeatures:
    return RequestFeatures(prompt_tokens=prompt, max_tokens=out, req_id=rid)


def R(queued=0.0, waiting=0, decoding=0, kv=0.0, placed=0.0) -> ReplicaLoadReport:  # noqa: N802
    return ReplicaLoadReport(queued, waiting, decoding, kv, placed)


# ---------------------------------------------------------------------------- the record


@pytest.mark.parametrize("bad", [dict(queued_prefill=-1.0), dict(kv=math.nan), dict(placed_s=math.inf),
                                 dict(waiting=-1), dict(decoding=-2)],
                         ids=["negative-queue", "nan-kv", "inf-placed", "negative-waiting", "negative-decoding"])
def test_a_report_with_garbage_is_refused(bad):
    with pytest.raises(ValueError):
        ReplicaLoadReport(**bad)


def test_peers_sum_per_replica():
    got = sum_peers([{"a": R(100.0, 1, 2, 900.0)}, {"a": R(50.0, 0, 1, 100.0), "b": R(10.0, 1, 0, 5.0)}])
    assert got == {"a": PeerSum(150.0, 4, 3, 1000.0), "b": PeerSum(10.0, 1, 0, 5.0)}
    assert sum_peers([]) == {}


@pytest.mark.parametrize(("old", "new", "want"), [
    (None, {"a": R(placed=5.0)}, {}),                                   # first report: nothing known to overlap
    ({"a": R(placed=1.0)}, {"a": R(placed=1.5)}, {"a": 0.5}),
    ({"a": R(placed=1.0)}, {"a": R(placed=1.0)}, {}),                   # nothing new
    ({"a": R(placed=3.0)}, {"a": R(placed=1.0)}, {}),                   # the peer restarted
    ({"a": R(placed=1.0)}, {"a": R(placed=2.0), "b": R(placed=9.0)}, {"a": 1.0}),   # b: new in the report
], ids=["first", "grew", "same", "went-back", "new-replica"])
def test_prefill_placed_between_two_reports(old, new, want):
    got = placed_since(old, new)
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k] == pytest.approx(v)


# ---------------------------------------------------------------------------- the pick with peers


def test_a_peers_queued_prefill_counts_on_its_replica():
    pol = TidegatePolicy()
    snap = PoolSnapshot((e("a"), e("b")))
    alone = {p.replica_id: p.ttft_s for p in pol.predictions(snap, req(1000, rid="n"))}
    assert alone["a"] == pytest.approx(alone["b"])
    pol.on_peer_load("router-1", PeerReport({"a": R(queued=30_000.0, waiting=3, kv=33_000.0, placed=0.7)}))
    got = {p.replica_id: p.ttft_s for p in pol.predictions(snap, req(1000, rid="n"))}
    assert got["a"] - got["b"] == pytest.approx(30_000 / FAST["prefill_tokens_per_s"], rel=0.1)
    assert pol.pick(snap, req(1000, rid="n"), random.Random(0)).replica_id == "b"
    pol.forget_peer("router-1")
    back = {p.replica_id: p.ttft_s for p in pol.predictions(snap, req(1000, rid="n"))}
    assert back == pytest.approx(alone)


def test_with_peers_own_load_is_not_scaled_by_the_share():
    pol = TidegatePolicy()
    pol.on_dispatch(req(10_000, rid="mine"), "a")
    # The table says 4 in flight (our share 1/4): without peers' reports ours counts 4 times.
    snap = PoolSnapshot((e("a", waiting=4, cap=0), e("b", cap=0)))
    rate = FAST["prefill_tokens_per_s"]
    scaled = {p.replica_id: p.ttft_s for p in pol.predictions(snap, req(1000, rid="n"))}
    assert scaled["a"] - scaled["b"] == pytest.approx(4 * 10_000 / rate, rel=0.1)
    pol.on_peer_load("router-1", PeerReport({"b": R(queued=2_000.0, waiting=1, placed=0.1)}))
    got = {p.replica_id: p.ttft_s for p in pol.predictions(snap, req(1000, rid="n"))}
    assert got["a"] - got["b"] == pytest.approx((10_000 - 2_000) / rate, rel=0.1)


def test_a_report_fed_to_a_router_without_load_gives_it_the_senders_view():
    sender, receiver = TidegatePolicy(), TidegatePolicy()
    snap = PoolSnapshot((e("a"), e("b"), e("c")))
    for i, (prompt, rid, started) in enumerate([(20_000, "a", False), (3_000, "b", True), (8_000, "b", False),
                                                (500, "c", True)]):
        r = req(prompt, out=300, rid=f"r{i}")
        sender.on_dispatch(r, rid)
        if started:
            sender.on_first_token(r, rid)
    sender.on_peer_load("router-x", PeerReport({}))          # both count loads the same way: exactly, unscaled
    receiver.on_peer_load("router-0", sender.take_report())
    probe = req(2_000, rid="probe")
    want = [(p.replica_id, p.ttft_s, p.tpot_s) for p in sender.predictions(snap, probe)]
    got = [(p.replica_id, p.ttft_s, p.tpot_s) for p in receiver.predictions(snap, probe)]
    assert [g[0] for g in got] == [w[0] for w in want]
    assert [g[1:] for g in got] == [pytest.approx(w[1:]) for w in want]
    assert len({round(w[1], 6) for w in want}) == 3                # the loads differ: the check means something


def test_a_peers_prefill_uses_up_our_decoders_stall_budgets():
    pol = TidegatePolicy()
    snap = PoolSnapshot((e("a"),))
    pol.on_peer_load("router-1", PeerReport({"a": R(placed=1.0)}))
    for i in range(4):                                             # short answers decoding on a
        r = req(200, out=4, rid=f"short{i}")
        pol.on_dispatch(r, "a")
        pol.on_first_token(r, "a")
    before = pol.predictions(snap, req(20_000, rid="doc"))[0].pushed_out
    assert before >= 4
    pol.on_peer_load("router-1", PeerReport({"a": R(placed=2.0)}))   # a second of its prefill there since
    after = pol.predictions(snap, req(20_000, rid="doc"))[0].pushed_out
    assert after == 0                                              # they missed already: not this one's doing


def test_blocks_a_peer_placed_count_as_cached_there_and_are_sent_again_when_reused():
    sender, receiver = TidegatePolicy(), TidegatePolicy()
    snap = PoolSnapshot((e("a"), e("b"), e("c")))
    doc = tuple(range(40))
    first = RequestFeatures(prompt_tokens=2_560, max_tokens=50, prefix_hashes=doc, req_id="d0",
                            prefix_block_tokens=64)
    placed = sender.pick(snap, first, random.Random(0)).replica_id
    sender.on_dispatch(first, placed)
    follow = RequestFeatures(prompt_tokens=2_700, max_tokens=50, prefix_hashes=doc + (7,), req_id="d1",
                             prefix_block_tokens=64)
    before = {p.replica_id: p.cached_tokens for p in receiver.predictions(snap, follow)}
    assert set(before.values()) == {0}
    report = sender.take_report()
    assert [b.replica_id for b in report.learned] == [placed]
    receiver.on_peer_load("router-0", report)
    after = {p.replica_id: p.cached_tokens for p in receiver.predictions(snap, follow)}
    assert after[placed] == 40 * 64 and all(v == 0 for r, v in after.items() if r != placed)
    sender.on_dispatch(RequestFeatures(prompt_tokens=2_560, max_tokens=50, prefix_hashes=doc, req_id="d2",
                                       prefix_block_tokens=64), placed)
    again = sender.take_report().learned                          # reused: recent in the engine's cache again
    assert [(b.replica_id, len(b.keys)) for b in again] == [(placed, 40)]
    assert sender.take_report().learned == ()                     # nothing used since


@pytest.mark.parametrize(("reused", "kept", "evicted"), [
    (None, ("B", "C", "D"), "A"),      # the oldest goes
    ("A", ("A", "C", "D"), "B"),       # a peer reused A: B is the oldest now, in the engine and here
    ("B", ("B", "C", "D"), "A"),
], ids=["none", "reuse-A", "reuse-B"])
def test_a_peers_reuse_keeps_a_prefix_recent_in_our_index(reused, kept, evicted):
    # Replica a holds 3 documents of 1,000 tokens; the peer places A, B, C, maybe reuses one, then D.
    snap = PoolSnapshot((e("a", cap=3_000),))
    docs = {name: tuple(range(100 * i, 100 * i + 10)) for i, name in enumerate("ABCD")}
    sender, receiver = TidegatePolicy(), TidegatePolicy()
    receiver.predictions(snap, req(10))                           # the table: a's KV capacity

    def place(name: str, n: int) -> None:
        r = RequestFeatures(prompt_tokens=1_000, max_tokens=10, prefix_hashes=docs[name], req_id=f"{name}{n}",
                            prefix_block_tokens=100)
        sender.on_dispatch(r, "a")
        sender.on_complete(r, "a")       # done within the interval: pinned, then released, in one report
        receiver.on_peer_load("router-0", sender.take_report())

    for name in "ABC":
        place(name, 0)
    if reused is not None:
        place(reused, 1)
    place("D", 0)
    cached = {name: receiver._index.cached_tokens("a", PrefixBlocks(doc, 1_000, 100)) for name, doc in docs.items()}
    assert cached == {**dict.fromkeys(kept, 1_000), evicted: 0}


# A peer's running requests pin their blocks in our index, as the engine pins them. Replica a holds
# 3 documents of 1,000 tokens. Steps: ("start", doc, n) a peer request n of doc starts, ("end", doc, n)
# it finishes, ("lose",) the peer's next report is lost, ("forget",) the peer's record goes; every
# step but "lose" is followed by the peer's report (requests that start and end in one step: "done").
@pytest.mark.parametrize(("steps", "kept", "evicted"), [
    # the oldest finished document goes; A, running, stays whatever comes after (B goes instead)
    ([("done", "A"), ("done", "B"), ("done", "C"), ("done", "D")], "BCD", "A"),
    ([("start", "A", 0), ("done", "B"), ("done", "C"), ("done", "D")], "ACD", "B"),
    # under pressure: A pinned through two evictions
    ([("start", "A", 0), ("done", "B"), ("done", "C"), ("done", "D"), ("done", "E")], "ADE", "BC"),
    # released after B and C: evictable from then on, recent as of its release (B, then A, go)
    ([("start", "A", 0), ("done", "B"), ("end", "A", 0), ("done", "C"), ("done", "D"), ("done", "E")],
     "CDE", "AB"),
    # two requests use A, one finishes: still pinned by the other
    ([("start", "A", 0), ("start", "A", 1), ("end", "A", 0), ("done", "B"), ("done", "C"), ("done", "D")],
     "ACD", "B"),
    # a forgotten peer's pins go: A is the oldest evictable then
    ([("start", "A", 0), ("forget",), ("done", "B"), ("done", "C"), ("done", "D")], "BCD", "A"),
    # its release lost: the next report shows nothing in flight on a, so A's pin goes with it
    ([("start", "A", 0), ("lose",), ("end", "A", 0), ("idle",), ("done", "B"), ("done", "C"), ("done", "D")],
     "BCD", "A"),
], ids=["none-running", "running-survives", "running-survives-twice", "released-evictable", "shared-pin",
        "forgotten-peer", "lost-release"])
def test_a_peers_running_requests_pin_their_blocks_in_our_index(steps, kept, evicted):
    snap = PoolSnapshot((e("a", cap=3_000),))
    docs = {name: tuple(range(100 * i, 100 * i + 10)) for i, name in enumerate("ABCDE")}
    sender, receiver = TidegatePolicy(), TidegatePolicy()
    receiver.predictions(snap, req(10))                           # the table: a's KV capacity
    running: dict[tuple[str, int], RequestFeatures] = {}
    lose = False
    for step in steps:
        kind = step[0]
        if kind == "lose":
            lose = True
            continue
        if kind == "forget":
            receiver.forget_peer("router-0")
            continue
        if kind in ("start", "done"):
            r = RequestFeatures(prompt_tokens=1_000, max_tokens=10, prefix_hashes=docs[step[1]],
                                req_id=f"{step[1]}{step[2] if kind == 'start' else 'd'}", prefix_block_tokens=100)
            sender.on_dispatch(r, "a")
            if kind == "start":
                running[(step[1], step[2])] = r
            else:
                sender.on_complete(r, "a")
        elif kind == "end":
            sender.on_complete(running.pop((step[1], step[2])), "a")
        report = sender.take_report()
        if lose:
            lose = False
        else:
            receiver.on_peer_load("router-0", report)
    cached = {name: receiver._index.cached_tokens("a", PrefixBlocks(docs[name], 1_000, 100)) for name in docs}
    assert {n for n, c in cached.items() if c == 1_000} == set(kept)
    assert all(cached[n] == 0 for n in evicted)
    assert receiver._peer_pins.count() == 10 * len(running) * (("forget",) not in steps)


def test_a_release_applies_only_to_what_the_peer_pinned():
    receiver = TidegatePolicy()
    receiver.predictions(PoolSnapshot((e("a", cap=3_000),)), req(10))
    busy = {"a": R(waiting=1)}
    receiver.on_peer_load("router-0", PeerReport(busy, (LearnedBlocks("a", (1, 2, 3), 100.0),)))
    receiver.on_peer_load("router-1", PeerReport(busy, (), (ReleasedBlocks("a", (1, 2, 3, 9)),)))   # not its pins
    receiver.on_peer_load("router-0", PeerReport(busy, (), (ReleasedBlocks("a", (3, 9)),)))
    assert receiver._peer_pins.count("router-0") == 2 and receiver._peer_pins.count() == 2
    assert receiver._index._lru["a"].refs == {1: 1, 2: 1}


@pytest.mark.parametrize(("requests", "keys_each", "cap"), [(3, 10, 25), (1, 40, 25), (2, 10, 100)])
def test_a_reports_released_blocks_are_bounded_per_replica(monkeypatch, requests, keys_each, cap):
    monkeypatch.setattr(slo_pick, "MAX_LEARNED_KEYS", cap)
    pol = TidegatePolicy()
    for i in range(requests):
        r = RequestFeatures(prompt_tokens=1_000, max_tokens=10, prefix_hashes=tuple(range(keys_each)),
                            req_id=f"q{i}", prefix_block_tokens=100)
        pol.on_dispatch(r, "a")
        pol.on_complete(r, "a")
    report = pol.take_report()
    # whole requests until the cap is reached (then none): at most cap + one request's keys
    want = min(requests, -(-cap // keys_each)) * keys_each
    assert [(b.replica_id, len(b.keys)) for b in report.released] == [("a", want)]
    assert pol.take_report().released == ()                       # a delta: taken once


@pytest.mark.parametrize("tpb", [0.0, -1.0, math.inf, math.nan], ids=["zero", "negative", "inf", "nan"])
def test_learned_blocks_with_garbage_sizes_are_refused(tpb):
    with pytest.raises(ValueError):
        LearnedBlocks("a", (1, 2), tpb)


def test_a_peers_decoders_at_risk_count_once_each_in_our_placement():
    sender, receiver = TidegatePolicy(), TidegatePolicy()
    snap = PoolSnapshot((e("a"),))
    for i in range(5):                                             # 5 short answers decoding on a (the peer's)
        r = req(200, out=4, rid=f"short{i}")
        sender.on_dispatch(r, "a")
        sender.on_first_token(r, "a")
    doc = req(20_000, rid="doc")
    assert receiver.predictions(snap, doc)[0].pushed_out == 0      # it knows nothing of them yet
    report = sender.take_report()
    assert len(report.loads["a"].budgets) == 5
    receiver.on_peer_load("router-0", report)
    assert receiver.predictions(snap, doc)[0].pushed_out == 5
    receiver.forget_peer("router-0")
    assert receiver.predictions(snap, doc)[0].pushed_out == 0


@pytest.mark.parametrize("budgets", [(-1.0,), (0.0,), (math.inf,), (2.0, 1.0)],
                         ids=["negative", "zero", "inf", "descending"])
def test_garbage_budgets_are_refused(budgets):
    with pytest.raises(ValueError):
        ReplicaLoadReport(budgets=budgets)


# ---------------------------------------------------------------------------- replicas owned among routers

REPLICAS = [f"replica-{i:02d}" for i in range(16)]


@pytest.mark.parametrize(("routers", "sizes"), [
    (["r0"], [16]),
    (["r0", "r1"], [8, 8]),
    (["router-0", "router-1", "router-2", "router-3"], [4, 4, 4, 4]),
    ([f"router-{k}" for k in range(7)], [3, 3, 2, 2, 2, 2, 2]),
    ([f"router-{k:02d}" for k in range(20)], [1] * 16 + [0] * 4),     # more routers than replicas
], ids=["one", "two", "four", "seven", "twenty"])
def test_every_replica_has_one_owner_and_every_router_computes_the_same_split(routers, sizes):
    owned = {r: owned_replicas(r, [p for p in routers if p != r], REPLICAS) for r in routers}
    assert sorted(rid for mine in owned.values() for rid in mine) == REPLICAS      # each exactly once
    assert [len(owned[r]) for r in sorted(routers)] == sizes
    first = routers[0]
    assert owned_replicas(first, reversed(routers), reversed(REPLICAS)) == owned[first]   # any order, itself too


def test_with_peers_a_prompt_goes_to_the_cheapest_own_replica_in_the_band():
    # a is idle; b and c carry a little more (within BAND_C of a's cost, not ties), d much more.
    snap = PoolSnapshot(tuple(e(rid) for rid in "abcd"))
    pol = TidegatePolicy()
    for rid, prompt in (("b", 850), ("c", 1_800), ("d", 60_000)):
        pol.on_dispatch(req(prompt, rid=f"load-{rid}"), rid)
    costs = {p.replica_id: p.cost for p in pol.predictions(snap, req(2_000, rid="x"))}
    assert costs["a"] + 0.01 < costs["b"] < costs["c"] - 0.01 < 1.25 * costs["a"] - 0.01 < costs["d"]   # no ties
    assert pol.pick(snap, req(2_000, rid="x"), random.Random(0)).replica_id == "a"     # alone: the cheapest
    pol.bind_router("router-0")
    assert pol.pick(snap, req(2_000, rid="x"), random.Random(0)).replica_id == "a"     # no peer heard from yet
    # The split of a-d among the routers is fixed by their ids: router-0 owns b and c of two
    # routers, c and d of three.
    assert owned_replicas("router-0", ["router-1"], "abcd") == {"b", "c"}
    assert owned_replicas("router-0", ["router-1", "router-2"], "abcd") == {"c", "d"}
    pol.on_peer_load("router-1", PeerReport({}))
    assert pol.pick(snap, req(2_000, rid="x"), random.Random(0)).replica_id == "b"     # its cheapest in the band
    pol.on_peer_load("router-2", PeerReport({}))
    assert pol.pick(snap, req(2_000, rid="x"), random.Random(0)).replica_id == "c"     # d: out of the band
    pol.on_dispatch(req(30_000, rid="more-c"), "c")                                  # c leaves the band too
    assert pol.pick(snap, req(2_000, rid="x"), random.Random(0)).replica_id == "a"     # none of its own: the cheapest
    pol.forget_peer("router-2")                                                      # two routers again: b and c
    assert pol.pick(snap, req(2_000, rid="x"), random.Random(0)).replica_id == "b"
    pol.forget_peer("router-1")
    pol.on_complete(req(30_000, rid="more-c"), "c")
    assert pol.pick(snap, req(2_000, rid="x"), random.Random(0)).replica_id == "a"     # alone again
