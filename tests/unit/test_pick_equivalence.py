"""The `tidegate` pick's fast path decides exactly as its plain formulation does.

The pick runs on every request, so its code is tuned (per-pick constants hoisted, no objects per
candidate that cannot matter). Here the plain version lives on: the formulas of predict.py,
slo_pick.py and affinity.py written straightforwardly, read against the policy's own state after
every hook. Random pools, SLOs, prompts and hook sequences (hypothesis) must give the same
predictions (every field, exactly), the same picks (replica, reason, score, candidate count, the
same draws from the RNG) and the same prefix block ids, with and without peers' load reports.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import math
import random

import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from tidegate.policy.affinity import PrefixBlocks, PrefixIndex
from tidegate.policy.peer_load import LearnedBlocks, PeerReport, ReleasedBlocks, ReplicaLoadReport
from tidegate.policy.predict import DEFAULT_RATES, Prediction, Rates, ReplicaLoad, pool_rates, predict
from tidegate.policy.registry import PoolSnapshot, RequestFeatures, RouteInfo, SloTargets
from tidegate.policy.slo_pick import BAND_C, COST_RESOLUTION, MIN_SHARE, TidegatePolicy
from tidegate.tokens import PREFIX_BLOCK_BYTES, prefix_block_hashes

# ---------------------------------------------------------------------------- the plain formulation

_MASK = (1 << 64) - 1


def ref_predict(rid, load, rates, prompt_tokens, cached_tokens, output_tokens, remaining_output, ttft_slo_s,
                tpot_slo_s, left_output=None) -> Prediction:
    """predict.predict as first written (README.md's formulas, one line each)."""
    def step_s(batch):
        return rates.step_base_s + rates.step_per_seq_s * max(0.0, batch)

    cached = max(0, min(int(cached_tokens), int(prompt_tokens) - 1))
    own = max(1, int(prompt_tokens) - cached)
    work = max(0.0, load.queued_prefill) + own
    batch = max(0.0, load.decoding)
    step = step_s(batch)
    prefill_s = work / rates.prefill_tps
    ttft = prefill_s + math.ceil(work / 8192) * step
    kv_wait = 0.0
    remaining = max(1.0, remaining_output)
    left = remaining if left_output is None else max(1.0, left_output)
    if load.kv_capacity > 0:
        shortfall = work + max(0.0, output_tokens) - (load.kv_capacity - max(0.0, load.kv_used))
        if shortfall > 0:
            kv_wait = shortfall / (max(load.kv_used, 1.0) / (left * step))
    ttft += kv_wait
    if rates.seats > 0 and batch > 0 and load.sequences + 1 - rates.seats > 0:
        ttft += (load.sequences + 1.0 - rates.seats) * 2.0 * left * step / min(batch, rates.seats)
    tpot = step_s(batch + 1) + prefill_s / remaining
    stall = own / rates.prefill_tps
    keys = load.stall_keys
    n_out = 0.0
    if keys and stall > 0:
        n_out = float(bisect.bisect_right(keys, load.stalled_s + stall) - bisect.bisect_right(keys, load.stalled_s))
    pushed = n_out * max(1.0, load.per_key)
    cost = ttft / ttft_slo_s + tpot / tpot_slo_s + pushed
    budget = max(0.0, (tpot_slo_s - step_s(max(0.0, batch + 1))) * rates.prefill_tps)
    return Prediction(rid, cached, own, ttft, tpot, kv_wait, pushed, cost, max(0.0, load.queued_prefill), budget,
                      rates.prefill_tps)


def ref_chained(hashes) -> list[int]:
    keys, prev = [], 0x5EED
    for h in hashes:
        prev = hash((prev, h))
        keys.append(prev)
    return keys


def ref_cached_tokens(pol: TidegatePolicy, rid: str, request: RequestFeatures) -> int:
    keys = ref_chained(request.prefix_hashes)
    lru = pol._index._lru.get(rid)
    if lru is None or not keys:
        return 0
    n = 0
    for k in keys:
        if k not in lru.blocks:
            break
        n += 1
    tpb = float(request.prefix_block_tokens) if request.prefix_block_tokens > 0 else \
        max(1.0, request.prompt_tokens / len(keys))
    return int(n * tpb)


def ref_home_key(request: RequestFeatures) -> int | None:
    keys = ref_chained(request.prefix_hashes)
    if not keys:
        return None
    tpb = float(request.prefix_block_tokens) if request.prefix_block_tokens > 0 else \
        max(1.0, request.prompt_tokens / len(keys))
    return keys[max(1, min(len(keys), round(1024 / tpb))) - 1] & _MASK


def ref_rank(rid: str, home_key: int) -> int:
    x = home_key ^ int.from_bytes(hashlib.blake2b(rid.encode(), digest_size=8).digest(), "big")
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def ref_predictions(pol: TidegatePolicy, snap: PoolSnapshot, request: RequestFeatures) -> tuple[list, float]:
    """(predictions, this router's share): slo_pick.TidegatePolicy.predictions, plainly."""
    cands = sorted((x for x in snap.entries if math.isfinite(x.weight) and x.weight > 0
                    and x.replica_id not in snap.exclude), key=lambda x: x.replica_id)
    if not cands:
        return [], pol._share
    slo = snap.slo or pol.slo
    rates = pool_rates(snap.entries)
    out = max(1.0, float(request.max_tokens) * pol._cap_use) if request.max_tokens else pol._mean_output
    remaining = max(1.0, pol._mean_output / 2)
    # What the seats and the KV free over: half the mean expected output of the requests sent
    # (run_scenario checks the policy's average against its own), the learned mean before any.
    left = max(1.0, (pol._mean_output if pol._sent_output is None else pol._sent_output) / 2)
    table = sum(max(0, x.running) + max(0, x.waiting) for x in cands)
    mine = sum(o.waiting + o.decoding for o in pol._own.values())
    share = 1.0 if table <= 0 or mine <= 0 else min(1.0, max(MIN_SHARE, mine / table))
    preds = []
    for x in cands:
        own = pol._own.get(x.replica_id)
        queued, decoding, kv, keys, stalled = (own.queued, own.decoding, own.kv, own.stall_keys, own.stalled_s) \
            if own is not None else (0.0, 0, 0.0, [], 0.0)
        seqs = own.waiting + own.decoding if own is not None else 0
        cap = float(max(0, x.kv_capacity_tokens))
        if pol._peers:
            # Peers' last reports, summed in the order they came, added to ours unscaled; every
            # router's stall keys there count once each.
            peer_queued, peer_decoding, peer_kv, peer_seqs = 0.0, 0, 0.0, 0
            for report in pol._peers.values():
                r = report.get(x.replica_id)
                if r is not None:
                    peer_queued += r.queued_prefill
                    peer_decoding += r.decoding
                    peer_kv += r.kv
                    peer_seqs += r.waiting + r.decoding
            theirs = [k for ks in own.peer_keys.values() for k in ks] if own is not None else []
            kv = kv + peer_kv
            kv_used = max(kv, cap - max(0, x.kv_free_tokens)) if cap > 0 else kv
            load = ReplicaLoad(queued + peer_queued, decoding + peer_decoding, kv_used, cap, sorted(keys + theirs),
                               stalled, 1.0, seqs + peer_seqs)
        else:
            scale = 1.0 / share
            kv_used = max(kv * scale, cap - max(0, x.kv_free_tokens)) if cap > 0 else kv * scale
            load = ReplicaLoad(queued * scale, decoding * scale, kv_used, cap, keys, stalled, scale, seqs * scale)
        pred = ref_predict(x.replica_id, load, rates[x.replica_id], request.prompt_tokens,
                           ref_cached_tokens(pol, x.replica_id, request), out, remaining, slo.ttft_s, slo.tpot_s,
                           left)
        guesses = own.guess_keys if own is not None else []
        if guesses:
            # Requests without max_tokens: their keys count in pushed_out (admission's open rule),
            # not in the cost.
            stall = pred.prefill_tokens / rates[x.replica_id].prefill_tps
            n = bisect.bisect_right(guesses, stalled + stall) - bisect.bisect_right(guesses, stalled)
            pred = dataclasses.replace(pred, pushed_out=pred.pushed_out + n * load.per_key)
        if pol._peers and pol._router_id is not None:
            # With peers, a prompt over the budget may go alone only to the replicas it owns.
            pred = dataclasses.replace(pred, sole=x.replica_id in ref_owned(pol, snap))
        preds.append(pred)
    return preds, share


def ref_owned(pol: TidegatePolicy, snap: PoolSnapshot) -> set[str]:
    """The replicas of the table this router owns among itself and its peers: none without an id
    or peers; else the replicas by id hash (blake2b, 8 bytes), dealt to the routers in id order."""
    if pol._router_id is None or not pol._peers:
        return set()
    routers = sorted({pol._router_id, *pol._peers})
    ordered = sorted((x.replica_id for x in snap.entries),
                     key=lambda r: (int.from_bytes(hashlib.blake2b(r.encode(), digest_size=8).digest(), "big"), r))
    return set(ordered[routers.index(pol._router_id)::len(routers)])


def ref_pick(pol: TidegatePolicy, snap: PoolSnapshot, request: RequestFeatures, rng: random.Random):
    """(replica id, reason, score, candidates) or None: slo_pick.TidegatePolicy.pick, plainly."""
    preds, _ = ref_predictions(pol, snap, request)
    if not preds:
        return None
    if len(preds) == 1:
        return preds[0].replica_id, "only_candidate", preds[0].cost, 1
    slo = snap.slo or pol.slo
    ttft_ok = [p for p in preds if p.ttft_s <= slo.ttft_s]
    fit = [p for p in ttft_ok if p.tpot_s <= slo.tpot_s and (p.kv_wait_s <= 0 or p.cached_tokens > 0)]
    if not fit:
        fit = [p for p in ttft_ok if p.tpot_s <= slo.tpot_s]
    reason = "slo_fit"
    if not fit:
        fit, reason = ttft_ok, "no_tpot_fit"
    if not fit:
        fit, reason = [p for p in preds if p.tpot_s <= slo.tpot_s], "no_ttft_fit"
    if not fit:
        fit, reason = preds, "no_fit"
    best = min(p.cost for p in fit)
    home = ref_home_key(request)
    if home is not None:
        band = [p for p in fit if p.cost <= BAND_C * best]
        most = max(p.cached_tokens for p in band)
        band = [p for p in band if p.cached_tokens == most]
        if most > 0:   # cached somewhere: the cheapest of those holding the most decide, the home breaks ties
            least = min(p.cost for p in band)
            band = [p for p in band if p.cost <= least + COST_RESOLUTION]
        # Cached nowhere, with peers: this router's own replicas first.
        mine = ref_owned(pol, snap) if most == 0 else set()
        chosen = min(band, key=lambda p: (p.replica_id not in mine, -ref_rank(p.replica_id, home), p.cost))
    else:
        ties = [p for p in fit if p.cost <= best + COST_RESOLUTION]
        # With peers: the cheapest of its own replicas within the bounded-load band, if any.
        own = [p for p in fit if p.cost <= BAND_C * best and p.replica_id in ref_owned(pol, snap)]
        if own:
            ties = [p for p in own if p.cost <= min(q.cost for q in own) + COST_RESOLUTION]
        chosen = ties[rng.randrange(len(ties))] if len(ties) > 1 else ties[0]
    return chosen.replica_id, reason, chosen.cost, len(preds)


def ref_block_hashes(text: str, max_blocks: int | None = None) -> tuple[int, ...]:
    """The spec, plainly: id i = top 63 bits of XXH3-64(block i, seed = the previous 64-bit value)."""
    data = text.encode("utf-8", errors="replace")
    blocks = [data[i:i + PREFIX_BLOCK_BYTES] for i in range(0, len(data), PREFIX_BLOCK_BYTES)]
    out, seed = [], 0
    for block in blocks[:max_blocks]:
        if len(block) < PREFIX_BLOCK_BYTES:
            break
        seed = xxhash.xxh3_64(block, seed=seed).intdigest()
        out.append(seed // 2)
    return tuple(out)


# ---------------------------------------------------------------------------- random scenarios

DOCS = (tuple(range(40)), tuple(range(0, 80, 2)), tuple(range(100, 140)))
FLOATS = (0.0, -1.0, math.nan)   # not fitted / nonsense: the pool's median or the default stands in
entry_st = st.builds(
    lambda i, w, p, b, s, cap, free, running, waiting, seats: RouteInfo(
        replica_id=f"r{i}", weight=w, kv_free_tokens=min(free, cap) if cap > 0 else free, kv_capacity_tokens=cap,
        running=running, waiting=waiting, endpoint=f"http://r{i}", prefill_tokens_per_s=p, decode_step_base_ms=b,
        decode_step_per_seq_ms=s, max_num_seqs=seats),
    st.integers(0, 9), st.sampled_from((50.0, 50.0, 50.0, 1.0, 0.0, math.inf, math.nan)),
    st.sampled_from((45_000.0, 45_000.0, 150_000.0, 2_000.0) + FLOATS), st.sampled_from((8.0, 8.0, 30.0, 0.5) + FLOATS),
    st.sampled_from((0.15, 0.15, 2.0) + FLOATS), st.sampled_from((400_000, 400_000, 3_000, 0, -5)),
    st.integers(-10, 400_000), st.integers(-2, 40), st.integers(-2, 40),
    st.sampled_from((0, 0, 1, 2, 4, 256, -3)))   # seats: unknown, full with a few requests, roomy, nonsense
pool_st = st.lists(entry_st, min_size=1, max_size=6, unique_by=lambda x: x.replica_id).map(tuple)
slo_st = st.one_of(st.none(), st.builds(SloTargets, st.sampled_from((0.05, 0.5, 2.0, 30.0)),
                                        st.sampled_from((0.005, 0.03, 0.1, 1.0))))
request_st = st.builds(
    lambda prompt, out, hashes, block: (prompt, out, tuple(hashes), block),
    st.one_of(st.integers(0, 3), st.integers(1, 40_000)), st.one_of(st.none(), st.integers(0, 3_000)),
    # Prompts that share prefixes of every length (a document's head, then a few own blocks),
    # so that the index finds them, on some replicas to different depths.
    st.builds(lambda doc, cut, tail: DOCS[doc][:cut] + tuple(tail), st.integers(0, len(DOCS) - 1),
              st.integers(0, 40), st.lists(st.integers(0, 2), max_size=6)),
    st.sampled_from((0, 64, 512)))
op_st = st.tuples(st.sampled_from(("pick", "pick", "pick", "first", "complete", "output")), request_st,
                  st.integers(0, 1_000), st.booleans(), slo_st, st.none())
# Peers' reports: load on some replicas (some of them in no pool), stall budgets at risk.
report_st = st.dictionaries(
    st.sampled_from([f"r{i}" for i in range(12)]),
    st.builds(ReplicaLoadReport, st.floats(0, 200_000), st.integers(0, 5), st.integers(0, 30), st.floats(0, 500_000),
              st.floats(0, 50), st.lists(st.floats(0.001, 30), max_size=6).map(lambda b: tuple(sorted(b)))),
    max_size=4)
peer_op_st = st.tuples(st.sampled_from(("pick", "pick", "pick", "first", "complete", "output", "peer", "peer",
                                        "forget")), request_st, st.integers(0, 1_000), st.booleans(), slo_st, report_st)


def check_pick(pol: TidegatePolicy, snap: PoolSnapshot, request: RequestFeatures, seed: int):
    want_preds, want_share = ref_predictions(pol, snap, request)
    want_rng, rng = random.Random(seed), random.Random(seed)
    want = ref_pick(pol, snap, request, want_rng)
    assert pol.predictions(snap, request) == want_preds
    got = pol.pick(snap, request, rng)
    assert ((got.replica_id, got.reason, got.effective_weight, got.candidates) if got else None) == want
    assert rng.getstate() == want_rng.getstate()  # the same draws, so every later tie breaks the same way
    if got is not None:  # what on_dispatch reads from the last pick
        assert pol._share == want_share
        assert pol._tpot_slo_s == (snap.slo or pol.slo).tpot_s
    return got


@settings(max_examples=300, deadline=None)
@given(pools=st.lists(pool_st, min_size=1, max_size=3), ops=st.lists(op_st, min_size=1, max_size=60),
       policy_slo=slo_st)
def test_pick_and_predictions_match_the_plain_formulation(pools, ops, policy_slo):
    run_scenario(pools, ops, policy_slo)


@settings(max_examples=200, deadline=None)
@given(pools=st.lists(pool_st, min_size=1, max_size=3), ops=st.lists(peer_op_st, min_size=8, max_size=60),
       policy_slo=slo_st)
def test_pick_and_predictions_with_peers_match_the_plain_formulation(pools, ops, policy_slo):
    run_scenario(pools, ops, policy_slo, router_id="p7")   # its peers are p0 and p1


def run_scenario(pools, ops, policy_slo, router_id: str | None = None) -> None:
    pol = TidegatePolicy(policy_slo)
    if router_id is not None:   # and a peer heard from from the start, so that most picks have peers
        pol.bind_router(router_id)
        pol.on_peer_load("p0", PeerReport({}))
    flights: list[tuple[RequestFeatures, str]] = []
    sent: float | None = None   # the EWMA of the expected outputs dispatched, kept plainly
    capacity: dict[str, float] = {}
    peer_pinned: dict[str, list[tuple[str, tuple[int, ...]]]] = {"p0": [], "p1": []}   # what each peer pinned

    def seen(entries: tuple[RouteInfo, ...], exclude: frozenset[str]) -> None:
        """What on_dispatch reads (rates, KV capacities) comes from the last table that had a candidate."""
        if any(math.isfinite(x.weight) and x.weight > 0 and x.replica_id not in exclude for x in entries):
            capacity.update((x.replica_id, float(x.kv_capacity_tokens)) for x in entries)
            assert pol._table[0] is entries
            assert pol._table[1] == pool_rates(entries)
        assert pol._capacity == capacity

    for k, (kind, (prompt, out, hashes, block), n, flag, slo, report) in enumerate(ops):
        # The in-flight count the share reads is kept by the hooks: it is the plain sum.
        assert pol._inflight == sum(o.waiting + o.decoding for o in pol._own.values())
        entries = pools[n % len(pools)]
        if kind == "peer":
            # Blocks a peer placed: the request's own, on one replica (cached there for every router).
            learned = (LearnedBlocks(f"r{n % 10}", tuple(ref_chained(hashes)), float(block or 64)),) if hashes else ()
            # Pinned for the peer's request, and released with a later report of that peer (flag):
            # the index's holders must stay those of its blocks through pins and releases.
            peer = f"p{n % 2}"
            done = (ReleasedBlocks(*peer_pinned[peer].pop(0)),) if flag and peer_pinned[peer] else ()
            peer_pinned[peer].extend((b.replica_id, b.keys) for b in learned)
            pol.on_peer_load(peer, PeerReport(report, learned, done))
            continue
        if kind == "forget":
            pol.forget_peer(f"p{n % 2}")
            peer_pinned[f"p{n % 2}"].clear()
            continue
        if kind == "pick":
            request = RequestFeatures(prompt_tokens=prompt, max_tokens=out, prefix_hashes=hashes, req_id=f"q{k}",
                                      prefix_block_tokens=block)
            exclude = frozenset(x.replica_id for x in entries[: n % 3]) if flag else frozenset()
            got = check_pick(pol, PoolSnapshot(entries, exclude=exclude, slo=slo), request, seed=n)
            seen(entries, exclude)
            if n % 3 == 0:  # the simulator's reports read predictions between a pick and its dispatch
                other = pools[(n + 1) % len(pools)]
                everyone = frozenset(x.replica_id for x in other) if n % 2 else frozenset()
                snap = PoolSnapshot(other, exclude=everyone, slo=slo)
                assert pol.predictions(snap, request) == ref_predictions(pol, snap, request)[0]
                seen(other, everyone)
            if got is not None:
                out = max(1.0, float(request.max_tokens) * pol._cap_use) if request.max_tokens else pol._mean_output
                sent = out if sent is None else sent + (out - sent) / 64
                pol.on_dispatch(request, got.replica_id)
                assert pol._sent_output == sent
                flights.append((request, got.replica_id))
        elif flights:
            request, rid = flights[n % len(flights)]
            if kind == "first":
                pol.on_first_token(request, rid)
            elif kind == "complete":
                pol.on_complete(request, rid)
                flights.remove((request, rid))
            else:
                pol.on_output(request, rid, n if flag else 0)


@settings(max_examples=200, deadline=None)
@given(queued=st.floats(-10, 1e6), decoding=st.floats(-2, 500), kv_used=st.floats(-10, 1e6),
       cap=st.sampled_from((0.0, -1.0, 5_000.0, 400_000.0)),
       keys=st.lists(st.floats(0, 50), max_size=8).map(sorted), stalled=st.floats(0, 50),
       per_key=st.floats(0, 20), rates=st.sampled_from((DEFAULT_RATES, Rates(45_000.0, 0.008, 0.00015),
                                                         Rates(1_000.0, 0.05, 0.0),
                                                         Rates(45_000.0, 0.008, 0.00015, 256.0),
                                                         Rates(45_000.0, 0.008, 0.00015, 2.0))),
       seqs=st.floats(-2, 600),
       prompt=st.integers(-5, 100_000), cached=st.integers(-5, 100_000), out=st.floats(-5, 4_000),
       remaining=st.floats(-5, 4_000), ttft=st.sampled_from((0.1, 2.0)), tpot=st.sampled_from((0.01, 0.1)),
       left=st.none() | st.floats(-5, 4_000))
def test_predict_matches_the_plain_formulation(queued, decoding, kv_used, cap, keys, stalled, per_key, rates, seqs,
                                               prompt, cached, out, remaining, ttft, tpot, left):
    load = ReplicaLoad(queued, decoding, kv_used, cap, keys, stalled, per_key, seqs)
    args = (rates, prompt, cached, out, remaining, ttft, tpot, left)
    assert predict("r", load, *args) == ref_predict("r", load, *args)


@settings(max_examples=200, deadline=None)
# Texts long enough to span blocks: hypothesis' own text sizes rarely reach one 256-byte block.
@given(text=st.tuples(st.text(max_size=300) | st.text("ab\u00e9\U0001f600", max_size=300), st.integers(1, 40))
       .map(lambda t: t[0] * t[1]),
       max_blocks=st.one_of(st.none(), st.integers(0, 12)))
def test_prefix_block_hashes_match_the_plain_formulation(text, max_blocks):
    assert prefix_block_hashes(text, max_blocks) == ref_block_hashes(text, max_blocks)


def test_the_harness_sees_a_different_decision():
    """The comparison can fail: a policy whose band is narrower decides differently somewhere."""
    entries = tuple(RouteInfo(replica_id=f"r{i}", weight=50.0, kv_capacity_tokens=400_000, kv_free_tokens=400_000,
                              endpoint="x", prefill_tokens_per_s=45_000.0, decode_step_base_ms=8.0,
                              decode_step_per_seq_ms=0.15) for i in range(4))
    snap = PoolSnapshot(entries)
    pol, differed = TidegatePolicy(band_c=1.0), False
    for k in range(40):
        request = RequestFeatures(prompt_tokens=3_000, max_tokens=200, prefix_hashes=(k % 3, 1, 2), req_id=f"q{k}")
        want = ref_pick(pol, snap, request, random.Random(k))
        got = pol.pick(snap, request, random.Random(k))
        differed |= want[0] != got.replica_id
        pol.on_dispatch(request, got.replica_id)
    assert differed


@settings(max_examples=300, deadline=None)
@given(learned=st.lists(st.tuples(st.integers(0, 5), st.integers(0, len(DOCS) - 1), st.integers(0, 40),
                                  st.lists(st.integers(0, 2), max_size=4), st.sampled_from((64.0, 512.0))),
                        max_size=30),
       capacity=st.sampled_from((0.0, 600.0, 2_000.0, 30_000.0)), probe=request_st)
def test_cached_tokens_of_the_whole_pool_match_one_replica_at_a_time(learned, capacity, probe):
    """PrefixIndex.cached_tokens_all (one walk for the pool) against cached_tokens per replica, with
    LRUs small enough to evict the heads of prefixes (a replica may hold key i but not key i - 1)."""
    index = PrefixIndex()
    for rid, doc, cut, tail, tpb in learned:
        index.learn_keys(f"r{rid}", ref_chained(DOCS[doc][:cut] + tuple(tail)), tpb, capacity)
    prompt, _, hashes, block = probe
    blocks = PrefixBlocks(hashes, prompt, block)
    want = {f"r{i}": index.cached_tokens(f"r{i}", blocks) for i in range(6)}
    assert index.cached_tokens_all(blocks) == {rid: n for rid, n in want.items() if n}
