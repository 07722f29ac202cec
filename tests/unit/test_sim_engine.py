"""Engine scheduler: batching, chunked prefill, KV exhaustion, preemption, exact max_tokens, abort."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidegate.errors import PromptTooLargeError, RequestError
from tidegate.simulator.engine import Engine, Status
from tidegate.simulator.profiles import get_profile


def make(**overrides) -> Engine:
    return Engine(get_profile("llama3-8b-h100").with_overrides(**overrides), random.Random(0))


def run_to_end(engine: Engine, max_steps: int = 100_000) -> dict[str, int]:
    produced: dict[str, int] = {}
    t = 0.0
    for _ in range(max_steps):
        if not engine.has_work():
            return produced
        res = engine.step(t)
        assert res.num_scheduled_tokens > 0
        t = res.end_s
        for o in res.outputs:
            produced[o.req_id] = produced.get(o.req_id, 0) + o.new_tokens
    raise AssertionError("engine did not drain")


@pytest.mark.parametrize(
    ("prompts", "budget", "expected_first_step_tokens"),
    [
        pytest.param([100], 8192, 100, id="one-prompt-fits"),
        pytest.param([5000, 5000], 8192, 8192, id="second-prompt-chunked"),
        pytest.param([10000], 8192, 8192, id="long-prompt-chunked"),
        pytest.param([10, 20, 30], 8192, 60, id="three-small-prompts-batched"),
        pytest.param([100, 100], 150, 150, id="small-budget"),
    ],
)
def test_chunked_prefill_budget(prompts, budget, expected_first_step_tokens):
    e = make(max_num_batched_tokens=budget)
    for i, p in enumerate(prompts):
        e.add_request(f"r{i}", p, 4, 0.0)
    res = e.step(0.0)
    assert res.num_scheduled_tokens == expected_first_step_tokens
    assert res.duration_s > 0


def test_decodes_scheduled_first_one_token_each_then_prefill():
    e = make(max_num_batched_tokens=1000)
    for i in range(3):
        e.add_request(f"d{i}", 10, 50, 0.0)
    first = e.step(0.0)
    assert [o.first_token for o in first.outputs] == [True, True, True]
    e.add_request("big", 5000, 5, 0.0)
    res = e.step(1.0)
    # three decodes (1 token each) plus a 997-token chunk of the new prompt
    assert res.num_decode_tokens == 3
    assert res.num_prefill_tokens == 997
    by_id = {o.req_id: o for o in res.outputs}
    assert by_id["big"].new_tokens == 0
    assert all(by_id[f"d{i}"].new_tokens == 1 for i in range(3))


def test_max_num_seqs_limits_running():
    e = make(max_num_seqs=4)
    for i in range(10):
        e.add_request(f"r{i}", 10, 3, 0.0)
    e.step(0.0)
    s = e.stats()
    assert (s.running, s.waiting) == (4, 6)


@pytest.mark.parametrize("max_tokens", [1, 2, 17, 256])
def test_exact_max_tokens_and_first_token_at_prefill_end(max_tokens):
    e = make()
    e.add_request("a", 33, max_tokens, 0.0)
    first = e.step(0.0)
    assert first.outputs[0].first_token and first.outputs[0].new_tokens == 1
    assert first.outputs[0].ttft_s == pytest.approx(first.duration_s)
    produced = {"a": 1}
    produced["a"] += run_to_end(e).get("a", 0)
    assert produced["a"] == max_tokens
    s = e.stats()
    assert s.generation_tokens_total == max_tokens
    assert s.prompt_tokens_total == 33
    assert s.used_blocks == 0 and s.requests_finished_total == 1


def test_blocks_allocated_per_computed_tokens():
    e = make()
    e.add_request("a", 17, 50, 0.0)  # 17 tokens -> 2 blocks of 16
    e.step(0.0)
    assert e.stats().used_blocks == 2
    for _ in range(15):  # computed 17 + 15 = 32 tokens -> still 2 blocks
        e.step(0.0)
    assert e.stats().used_blocks == 2
    e.step(0.0)  # 33rd token -> third block
    assert e.stats().used_blocks == 3


def test_kv_exhaustion_queues_new_requests():
    e = make(num_gpu_blocks=10, max_model_len=160)  # 160 tokens of KV
    e.add_request("a", 100, 10, 0.0)  # 7 blocks
    e.add_request("b", 60, 10, 0.0)  # 4 blocks: does not fit next to a
    e.step(0.0)
    s = e.stats()
    assert (s.running, s.waiting, s.used_blocks) == (1, 1, 7)
    assert e.request_status("b") is Status.WAITING
    assert run_to_end(e) == {"a": 9, "b": 10}  # a got its first token in the step above


def test_decode_without_a_block_preempts_the_latest_admitted():
    e = make(num_gpu_blocks=4, max_model_len=64)  # 64 tokens of KV
    e.add_request("old", 16, 20, 0.0)  # needs a 2nd block at its 2nd decode
    e.add_request("new", 32, 20, 0.0)
    e.step(0.0)  # both prefilled: 1 + 2 blocks
    assert e.stats().used_blocks == 3
    preempted = []
    produced = {"old": 1, "new": 1}
    t = 0.0
    while e.has_work():
        res = e.step(t)
        t = res.end_s
        preempted += list(res.preempted)
        for o in res.outputs:
            produced[o.req_id] += o.new_tokens
    assert preempted and preempted[0] == "new"
    assert e.stats().preemptions_total == len(preempted)
    assert produced == {"old": 20, "new": 20}
    assert e.stats().used_blocks == 0


def test_abort_frees_blocks_and_forgets_request():
    e = make()
    e.add_request("a", 1000, 100, 0.0)
    e.add_request("b", 1000, 100, 0.0)
    e.step(0.0)
    assert e.stats().used_blocks == 2 * 63
    assert e.abort("a") is True
    assert e.stats().used_blocks == 63
    assert e.abort("a") is False
    assert e.abort("b") is True
    e.add_request("c", 10, 10, 0.0)
    assert e.abort("c") is True  # waiting request
    s = e.stats()
    assert (s.running, s.waiting, s.used_blocks, s.requests_aborted_total) == (0, 0, 0, 3)
    assert not e.has_work()


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "error"),
    [
        pytest.param(131000, 100, PromptTooLargeError, id="over-max-model-len"),
        pytest.param(0, 10, RequestError, id="empty-prompt"),
        pytest.param(10, 0, RequestError, id="zero-max-tokens"),
    ],
)
def test_rejects_bad_requests(prompt, max_tokens, error):
    with pytest.raises(error):
        make().add_request("x", prompt, max_tokens, 0.0)


def test_prompt_larger_than_kv_cache_rejected():
    e = Engine(get_profile("tiny-h100"))
    with pytest.raises(PromptTooLargeError, match="KV cache|context length"):
        e.add_request("x", 40_000, 1, 0.0)


def test_default_max_tokens_capped_by_max_model_len():
    e = make(max_model_len=1000)
    assert e.default_max_tokens(10) == 256
    assert e.default_max_tokens(900) == 100
    e.add_request("a", 900, None, 0.0)
    assert run_to_end(e) == {"a": 100}


def test_duplicate_request_id_rejected():
    e = make()
    e.add_request("a", 10, 1, 0.0)
    with pytest.raises(RequestError):
        e.add_request("a", 10, 1, 0.0)


def test_instant_profile_costs_nothing():
    e = Engine(get_profile("instant"))
    e.add_request("a", 100, 5, 0.0)
    res = e.step(0.0)
    assert res.duration_s == 0.0 and res.num_scheduled_tokens == 100


requests_strategy = st.lists(
    st.tuples(st.integers(1, 300), st.integers(1, 40), st.integers(0, 30)),  # prompt, max_tokens, arrival step
    min_size=1, max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(reqs=requests_strategy, blocks=st.integers(22, 80), budget=st.integers(16, 512),
       seqs=st.integers(1, 8), aborts=st.sets(st.integers(0, 24), max_size=5))
def test_invariants(reqs, blocks, budget, seqs, aborts):
    e = make(num_gpu_blocks=blocks, max_model_len=blocks * 16, max_num_batched_tokens=budget, max_num_seqs=seqs)
    pending = sorted(((arr, i, p, m) for i, (p, m, arr) in enumerate(reqs)), key=lambda x: (x[0], x[1]))
    produced: dict[str, int] = {}
    wanted: dict[str, int] = {}
    finished: set[str] = set()
    aborted: set[str] = set()
    t = 0.0
    step_no = 0
    while pending or e.has_work():
        while pending and pending[0][0] <= step_no:
            _, i, p, m = pending.pop(0)
            rid = f"r{i}"
            e.add_request(rid, p, m, t)
            wanted[rid] = m
            produced[rid] = 0
        if step_no == 5:
            for i in aborts:
                if e.abort(f"r{i}"):
                    aborted.add(f"r{i}")
        res = e.step(t)
        t = res.end_s
        step_no += 1
        s = e.stats()
        assert 0 <= s.used_blocks <= s.num_gpu_blocks
        assert s.running <= seqs
        assert res.num_scheduled_tokens <= budget
        for o in res.outputs:
            assert o.req_id not in finished
            produced[o.req_id] += o.new_tokens
            if o.finished:
                finished.add(o.req_id)
        assert step_no < 50_000, "engine made no progress"
    assert finished | aborted == set(wanted)
    assert not (finished & aborted)
    for rid in finished:
        assert produced[rid] == wanted[rid]
    s = e.stats()
    assert s.used_blocks == 0 and s.running == 0 and s.waiting == 0
    assert s.generation_tokens_total == sum(produced.values())
