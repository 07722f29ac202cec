"""Engine prefix caching, preemption/resume accounting and the virtual-time driver (advance)."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidegate.errors import RequestError
from tidegate.simulator.engine import Engine, RequestEvent, Status
from tidegate.simulator.profiles import get_profile


def make(**overrides) -> Engine:
    return Engine(get_profile("llama3-8b-h100").with_overrides(**overrides), random.Random(0))


def drain(e: Engine) -> list[RequestEvent]:
    return e.advance(math.inf)


# ------------------------------------------------------------------ prefix cache


def test_second_request_with_same_prefix_skips_cached_blocks():
    e = make()
    e.add_request("a", 100, 2, 0.0, prefix_hashes=tuple(range(6)))  # 6 full blocks of 16 cacheable
    first = e.step(0.0)
    assert first.num_scheduled_tokens == 100
    drain(e)
    assert e.stats().cached_blocks == 6 and e.stats().used_blocks == 0  # resident but free
    e.add_request("b", 100, 2, e.clock_s, prefix_hashes=tuple(range(6)))
    res = e.step(e.clock_s)
    assert res.num_scheduled_tokens == 100 - 96
    s = e.stats()
    assert (s.prefix_cache_queries_total, s.prefix_cache_hits_total) == (200, 96)
    drain(e)
    assert e.request_result("b").cached_tokens == 96 and e.request_result("a").cached_tokens == 0


def test_full_hit_still_computes_the_last_block():
    e = make()
    e.add_request("a", 64, 1, 0.0, prefix_hashes=(1, 2, 3, 4))
    drain(e)
    e.add_request("b", 64, 1, e.clock_s, prefix_hashes=(1, 2, 3, 4))
    res = e.step(e.clock_s)
    assert res.num_scheduled_tokens == 16  # 3 blocks hit; the last block is recomputed


@pytest.mark.parametrize(
    ("hashes_a", "hashes_b", "hit_blocks"),
    [
        pytest.param((1, 2, 3), (1, 2, 3), 3, id="same"),
        pytest.param((1, 2, 3), (1, 2, 9), 2, id="diverges-at-3"),
        pytest.param((1, 2, 3), (9, 2, 3), 0, id="chained-ids-first-differs"),
        pytest.param((1, 2, 3), (), 0, id="no-hashes"),
    ],
)
def test_hits_are_the_longest_resident_chained_prefix(hashes_a, hashes_b, hit_blocks):
    e = make()
    e.add_request("a", 100, 1, 0.0, prefix_hashes=hashes_a)
    drain(e)
    e.add_request("b", 100, 1, e.clock_s, prefix_hashes=hashes_b)
    res = e.step(e.clock_s)
    assert res.num_scheduled_tokens == 100 - 16 * hit_blocks


def test_hash_granularity_maps_one_hash_onto_several_engine_blocks():
    e = make()
    # one hash per 512 tokens (Mooncake): 1200 tokens = hashes for [0,512), [512,1024), [1024,1200)
    e.add_request("a", 1200, 1, 0.0, prefix_hashes=(7, 8, 9), hash_block_tokens=512)
    drain(e)
    assert e.stats().cached_blocks == 1200 // 16  # every full engine block is covered by some hash
    e.add_request("b", 1100, 1, e.clock_s, prefix_hashes=(7, 8), hash_block_tokens=512)
    res = e.step(e.clock_s)
    assert res.num_scheduled_tokens == 1100 - 1024  # the two shared 512-token hashes = 64 engine blocks
    with pytest.raises(RequestError, match="multiple"):
        e.add_request("c", 100, 1, 0.0, prefix_hashes=(1,), hash_block_tokens=20)


def test_shared_blocks_are_reference_counted_and_counted_once():
    e = make()
    e.add_request("a", 96, 50, 0.0, prefix_hashes=tuple(range(6)))
    e.step(0.0)
    e.add_request("b", 96, 50, 0.0, prefix_hashes=tuple(range(6)))
    e.step(0.0)
    # a: its 6 cached blocks + 1 for its first decode; b shares a's first 5 (a full hit still computes
    # the last block) and holds its own copy of block 6
    s = e.stats()
    assert s.running == 2 and s.prefix_cache_hits_total == 80
    assert s.used_blocks == 6 + 1 + 1  # the shared blocks are counted once
    e.abort("a")
    assert e.stats().used_blocks == 5 + 1  # b still holds the 5 shared blocks
    drain(e)
    s = e.stats()
    assert s.used_blocks == 0 and s.cached_blocks == 6


def test_cached_free_blocks_are_evicted_lru_when_space_runs_out():
    e = make(num_gpu_blocks=10, max_model_len=160)
    e.add_request("a", 64, 1, 0.0, prefix_hashes=(1, 2, 3, 4))
    drain(e)
    e.add_request("b", 64, 1, e.clock_s, prefix_hashes=(5, 6, 7, 8))
    drain(e)
    assert e.stats().cached_blocks == 8 and e.stats().used_blocks == 0
    e.add_request("c", 100, 1, e.clock_s)  # 7 blocks: needs 5 of the cached ones evicted
    drain(e)
    keys = e.cached_keys()
    assert len(keys) == 3
    # a's blocks went first (released earliest), and tail first: b's blocks are all still there
    e.add_request("d", 64, 1, e.clock_s, prefix_hashes=(5, 6, 7, 8))
    assert e.step(e.clock_s).num_scheduled_tokens == 16
    e.add_request("e", 64, 1, e.clock_s, prefix_hashes=(1, 2, 3, 4))
    assert e.step(e.clock_s).num_scheduled_tokens == 64


def test_prefix_caching_can_be_disabled():
    e = Engine(get_profile("llama3-8b-h100"), enable_prefix_caching=False)
    e.add_request("a", 100, 1, 0.0, prefix_hashes=tuple(range(6)))
    drain(e)
    e.add_request("b", 100, 1, e.clock_s, prefix_hashes=tuple(range(6)))
    assert e.step(e.clock_s).num_scheduled_tokens == 100
    assert e.stats().cached_blocks == 0


# ------------------------------------------------------------------ preemption and resume


def test_preempted_request_resumes_finishes_and_its_recompute_is_counted():
    e = make(num_gpu_blocks=4, max_model_len=64)
    e.add_request("old", 16, 20, 0.0)
    e.add_request("new", 32, 20, 0.0)
    events = drain(e)
    kinds = [(ev.req_id, ev.kind) for ev in events]
    assert ("new", "preempted") in kinds
    assert kinds.count(("new", "finished")) == 1 and kinds.count(("old", "finished")) == 1
    assert kinds.count(("new", "first_token")) == 1  # a resumed request has no second first token
    new = e.request_result("new")
    assert new.status is Status.FINISHED and new.output_tokens == 20 and new.preemptions >= 1
    assert new.computed_tokens > 32 + 19  # prompt + outputs, plus what was computed again
    s = e.stats()
    assert s.preemptions_total == sum(k == "preempted" for _, k in kinds)
    assert s.recomputed_tokens_total == new.computed_tokens - (32 + 19) + e.request_result("old").computed_tokens \
        - (16 + 19)
    assert s.used_blocks == 0 and s.generation_tokens_total == 40


# ------------------------------------------------------------------ advance


def test_advance_runs_steps_that_start_before_until_and_jumps_idle_clock():
    e = make()
    assert e.advance(10.0) == [] and e.clock_s == 0.0
    e.add_request("a", 100, 3, 5.0)
    events = e.advance(5.0)
    assert events == [] and e.clock_s == 0.0  # arrival not before until: nothing runs
    events = e.advance(5.0 + 1e-9)
    assert [ev.kind for ev in events] == ["first_token"]
    assert events[0].t_s == pytest.approx(5.0 + e.profile.cost.step_ms(100, 100) / 1000)
    assert e.clock_s > 5.0 + 1e-9  # the step started before until and ran to its end
    events = e.advance(math.inf)
    assert [ev.kind for ev in events] == ["finished"]
    r = e.request_result("a")
    assert r.finish_s == events[0].t_s and r.ttft_s == pytest.approx(r.first_token_s - 5.0)
    assert e.pop_result("a") == r and e.request_result("a") is None


def test_abort_event_is_returned_by_next_advance():
    e = make()
    e.add_request("a", 100, 50, 0.0)
    e.advance(0.01)
    assert e.abort("a", now_s=0.02)
    events = e.advance(1.0)
    assert events == [RequestEvent("a", "aborted", 0.02)]
    assert e.request_result("a").status is Status.ABORTED


def _random_workload(seed: int, n: int = 40):
    rng = random.Random(seed)
    t = 0.0
    reqs = []
    for i in range(n):
        t += rng.expovariate(30.0)
        prompt = rng.randint(1, 900)
        hashes = tuple(rng.choice((1, 2)) if j < 2 else rng.random() for j in range(prompt // 16))
        reqs.append((t, f"r{i}", prompt, rng.randint(1, 120), hashes))
    return reqs


def _replay(engine: Engine, reqs, fast: bool, chunk_s: float | None = None):
    events = []
    for t, rid, prompt, out, hashes in reqs:
        events += engine.advance(t, fast=fast)
        engine.add_request(rid, prompt, out, t, hashes)
    events += engine.advance(math.inf, fast=fast)
    return events


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("blocks", [80, 400, 28000], ids=["tight-kv", "small-kv", "big-kv"])
def test_advance_fast_forward_equals_step_by_step(seed, blocks):
    p = get_profile("llama3-8b-h100").with_overrides(num_gpu_blocks=blocks, max_num_seqs=8 if seed % 2 else 256)
    reqs = _random_workload(seed)
    # Stamping the 17th output token (the router's early TPOT): the closed form places it in its stretch.
    fast, slow = Engine(p, stamp_output=17), Engine(p, stamp_output=17)
    ev_fast = _replay(fast, reqs, True)
    ev_slow = _replay(slow, reqs, False)
    assert [(x.req_id, x.kind) for x in ev_fast] == [(x.req_id, x.kind) for x in ev_slow]
    for a, b in zip(ev_fast, ev_slow, strict=True):
        assert a.t_s == pytest.approx(b.t_s, rel=1e-9, abs=1e-9)
    for _, rid, *_ in reqs:
        a, b = fast.request_result(rid), slow.request_result(rid)
        assert a.ttft_s == pytest.approx(b.ttft_s, rel=1e-9, abs=1e-9)
        assert a.finish_s == pytest.approx(b.finish_s, rel=1e-9, abs=1e-9)
        assert (a.stamp_s is None) == (a.output_tokens < 17) == (b.stamp_s is None)
        if a.stamp_s is not None:
            assert a.first_token_s < a.stamp_s <= a.finish_s
            assert a.stamp_s == pytest.approx(b.stamp_s, rel=1e-9, abs=1e-9)
        assert (a.preemptions, a.cached_tokens, a.computed_tokens) == (b.preemptions, b.cached_tokens,
                                                                       b.computed_tokens)
    _assert_same_stats(fast, slow)


def _assert_same_stats(fast: Engine, slow: Engine) -> None:
    sa, sb = fast.stats(), slow.stats()
    # Summed times differ by float rounding (closed form vs step by step); everything else is exact.
    times = ("itl_sum_s", "busy_s", "prefill_time_sum_s")
    assert [getattr(sa, k) for k in times] == pytest.approx([getattr(sb, k) for k in times], rel=1e-9, abs=1e-12)
    zero = dict.fromkeys(times, 0.0)
    assert replace(sa, **zero) == replace(sb, **zero)


def test_step_and_advance_agree_with_a_step_driver():
    # advance(fast=False) is a step loop on the engine clock; a caller's own step loop must match it.
    p = get_profile("llama3-8b-h100")
    reqs = _random_workload(3, n=15)
    e1, e2 = Engine(p), Engine(p)
    _replay(e1, reqs, False)
    t = 0.0
    pending = list(reqs)
    while pending or e2.has_work():
        if not e2.has_work() and pending:
            t = max(t, pending[0][0])
        while pending and pending[0][0] <= t:
            at, rid, prompt, out, hashes = pending.pop(0)
            e2.add_request(rid, prompt, out, at, hashes)
        nxt = pending[0][0] if pending else math.inf
        while e2.has_work() and t < nxt:
            t = e2.step(t).end_s
    for _, rid, *_ in reqs:
        assert e1.request_result(rid).finish_s == pytest.approx(e2.request_result(rid).finish_s, abs=1e-9)


# ------------------------------------------------------------------ properties

workloads = st.lists(
    st.tuples(st.integers(1, 300), st.integers(1, 40), st.integers(0, 30),  # prompt, max_tokens, arrival step
              st.lists(st.integers(0, 3), max_size=20)),  # prefix hash ids (small alphabet: many hits)
    min_size=1, max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(reqs=workloads, blocks=st.integers(22, 80), budget=st.integers(16, 512), seqs=st.integers(1, 8),
       aborts=st.sets(st.integers(0, 24), max_size=4))
def test_invariants_with_prefix_cache(reqs, blocks, budget, seqs, aborts):
    e = make(num_gpu_blocks=blocks, max_model_len=blocks * 16, max_num_batched_tokens=budget, max_num_seqs=seqs)
    pending = sorted(((arr, i, p, m, h) for i, (p, m, arr, h) in enumerate(reqs)), key=lambda x: (x[0], x[1]))
    wanted: dict[str, int] = {}
    produced: dict[str, int] = {}
    finished: set[str] = set()
    aborted: set[str] = set()
    preempted: set[str] = set()
    t = 0.0
    step_no = 0
    while pending or e.has_work():
        while pending and pending[0][0] <= step_no:
            _, i, p, m, h = pending.pop(0)
            rid = f"r{i}"
            e.add_request(rid, p, m, t, prefix_hashes=tuple(h))
            wanted[rid], produced[rid] = m, 0
        if step_no == 5:
            for i in aborts:
                if e.abort(f"r{i}"):
                    aborted.add(f"r{i}")
        before = e.stats()
        resident = e.cached_keys()
        waiting = list(e._waiting)  # peeking: which requests this step admits
        res = e.step(t)
        t = res.end_s
        step_no += 1
        s = e.stats()
        # KV accounting: never negative, never over capacity, cached-free blocks count as free
        assert 0 <= s.used_blocks <= s.num_gpu_blocks
        assert s.used_blocks + (s.cached_blocks - _in_use_cached(e)) <= s.num_gpu_blocks
        assert s.running <= seqs and res.num_scheduled_tokens <= budget
        # hits only on blocks resident before the step
        new_hits = s.prefix_cache_hits_total - before.prefix_cache_hits_total
        admitted = [r for r in waiting if r.status is not Status.WAITING]
        assert new_hits <= sum(16 * _resident_prefix(r.keys, resident) for r in admitted)
        preempted.update(res.preempted)
        for o in res.outputs:
            assert o.req_id not in finished
            produced[o.req_id] += o.new_tokens
            if o.finished:
                finished.add(o.req_id)
        assert step_no < 50_000, "engine made no progress"
    assert finished | aborted == set(wanted) and not (finished & aborted)
    assert (preempted - aborted) <= finished  # every preempted request resumed and finished
    for rid in finished:
        assert produced[rid] == wanted[rid]
    s = e.stats()
    assert s.used_blocks == 0 and s.running == 0 and s.waiting == 0
    assert s.prefix_cache_hits_total <= s.prefix_cache_queries_total


def _resident_prefix(keys, resident) -> int:
    n = 0
    for k in keys:
        if k not in resident:
            break
        n += 1
    return n


def _in_use_cached(e: Engine) -> int:
    return sum(1 for r in e._ref.values() if r > 0)


@settings(max_examples=40, deadline=None)
@given(reqs=workloads, blocks=st.integers(22, 200), seqs=st.integers(1, 16), dt_ms=st.integers(1, 200))
def test_advance_is_step_by_step(reqs, blocks, seqs, dt_ms):
    p = get_profile("llama3-8b-h100").with_overrides(num_gpu_blocks=blocks, max_model_len=blocks * 16,
                                                     max_num_seqs=seqs)
    trace = sorted(((arr * dt_ms / 1000.0, f"r{i}", pr, m, tuple(h)) for i, (pr, m, arr, h) in enumerate(reqs)),
                   key=lambda x: x[0])
    fast, slow = Engine(p), Engine(p)
    ev_fast = _replay(fast, trace, True)
    ev_slow = _replay(slow, trace, False)
    assert [(x.req_id, x.kind) for x in ev_fast] == [(x.req_id, x.kind) for x in ev_slow]
    for _, rid, *_ in trace:
        a, b = fast.request_result(rid), slow.request_result(rid)
        assert a.finish_s == pytest.approx(b.finish_s, rel=1e-9, abs=1e-9)
        assert a.ttft_s == pytest.approx(b.ttft_s, rel=1e-9, abs=1e-9)
    _assert_same_stats(fast, slow)
