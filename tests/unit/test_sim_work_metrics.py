"""The simulator's per-step accounting (the rate estimator's inputs) and its /metrics series:
true to the engine's steps, and read back by the agent's normaliser."""

from __future__ import annotations

import pytest

from tidegate.engine_metrics import parse_metrics
from tidegate.simulator.engine import ITERATION_TOKENS_BUCKETS, Engine
from tidegate.simulator.metrics import SimMetrics
from tidegate.simulator.profiles import get_profile

H100 = get_profile("llama3-8b-h100")


def _stepped_engine() -> tuple[Engine, list]:
    engine = Engine(H100)
    for i, (prompt, out, arrival) in enumerate([(300, 20, 0.0), (1200, 8, 0.0), (50, 30, 0.05), (700, 5, 0.1)]):
        engine.add_request(f"r{i}", prompt, out, arrival)
    results, t = [], 0.0
    while engine.has_work():
        res = engine.step(t)
        results.append(res)
        t = res.end_s if res.num_scheduled_tokens else t + 0.01
    return engine, results


def test_counters_are_sums_over_the_steps() -> None:
    engine, results = _stepped_engine()
    s = engine.stats()
    ran = [r for r in results if r.num_scheduled_tokens]
    assert s.steps_total == len(ran)
    assert s.busy_s == pytest.approx(sum(r.duration_s for r in ran))
    itls = [o.itl_s for r in ran for o in r.outputs if o.itl_s is not None]
    assert s.itl_count == len(itls) == s.generation_tokens_total - 4  # every token but the 4 first ones
    assert s.itl_sum_s == pytest.approx(sum(itls))
    # vLLM's step tokens: whole prompts when their prefill completes, plus every sampled token.
    assert s.step_tokens_total == s.prompt_tokens_total + s.generation_tokens_total == 2250 + 63
    assert sum(s.iteration_tokens_counts) == s.steps_total
    assert len(s.iteration_tokens_counts) == len(ITERATION_TOKENS_BUCKETS) + 1


def test_fast_forward_keeps_the_same_accounting() -> None:
    fast, slow = Engine(H100), Engine(H100)
    for e in (fast, slow):
        for i in range(6):
            e.add_request(f"r{i}", 200 + 100 * i, 40 + 10 * i, 0.02 * i)
    fast.advance(1e9, fast=True)
    slow.advance(1e9, fast=False)
    a, b = fast.stats(), slow.stats()
    assert (a.steps_total, a.step_tokens_total, a.itl_count, a.iteration_tokens_counts) == (
        b.steps_total, b.step_tokens_total, b.itl_count, b.iteration_tokens_counts)
    assert (a.itl_sum_s, a.busy_s) == pytest.approx((b.itl_sum_s, b.busy_s), rel=1e-9)


@pytest.mark.parametrize("flavor", ["vllm", "vllm-v0"])
def test_vllm_flavors_export_the_iteration_histogram(flavor: str) -> None:
    engine, _ = _stepped_engine()
    s = engine.stats()
    sample = parse_metrics(SimMetrics(engine, "m", flavor).render().decode(), "m")
    assert (sample.steps_total, sample.step_tokens_total) == (s.steps_total, s.step_tokens_total)
    assert sample.prompt_tokens_total == s.prompt_tokens_total
    assert sample.busy_seconds_total is None  # vLLM exports no busy time
    if flavor == "vllm":
        assert sample.prefix_cache_hits_total == s.prefix_cache_hits_total


def test_sglang_flavor_exports_busy_time_in_server_seconds() -> None:
    engine, _ = _stepped_engine()
    s = engine.stats()
    sample = parse_metrics(SimMetrics(engine, "m", "sglang", time_scale=0.25).render().decode(), "m")
    assert sample.busy_seconds_total == pytest.approx(s.busy_s * 0.25)
    assert sample.steps_total is None  # SGLang has no step counter
    assert sample.prefix_cache_hits_total == s.prefix_cache_hits_total


def test_live_itl_histogram_feeds_the_itl_sum() -> None:
    engine = Engine(H100)
    metrics = SimMetrics(engine, "m")
    for v in (0.010, 0.012, 0.020):
        metrics.observe_inter_token(v)
    sample = parse_metrics(metrics.render().decode(), "m")
    assert (sample.itl_sum_s, sample.itl_count) == (pytest.approx(0.042), 3.0)


def test_prefill_time_spans_first_scheduled_to_first_token() -> None:
    """vllm:request_prefill_time_seconds: per finished request, its first token's end minus the
    start of the first step that scheduled it; a prompt over the step's token budget spans steps."""
    engine = Engine(H100)
    long_prompt = 3 * H100.max_num_batched_tokens  # three chunks at least
    engine.add_request("long", long_prompt, 2, 0.0)
    engine.add_request("short", 100, 2, 0.0)
    prefill, first_start, t = {}, {}, 0.0
    while engine.has_work():
        res = engine.step(t)
        for o in res.outputs:
            first_start.setdefault(o.req_id, res.start_s)
            if o.finished:
                prefill[o.req_id] = o.prefill_s
        t = res.end_s
    s = engine.stats()
    assert s.prefill_time_count == 2
    assert s.prefill_time_sum_s == pytest.approx(prefill["long"] + prefill["short"])
    assert prefill["long"] > prefill["short"] > 0
    assert prefill["long"] >= 2 * prefill["short"]  # its chunks span three steps or more


@pytest.mark.parametrize(("flavor", "exported"), [("vllm", True), ("vllm-v0", True), ("sglang", False)])
def test_prefill_time_histogram_in_server_seconds(flavor: str, exported: bool) -> None:
    metrics = SimMetrics(Engine(H100), "m", flavor, time_scale=0.5)
    metrics.observe_finished(1.0, prefill_s=0.4)
    metrics.observe_finished(2.0, prefill_s=0.2)
    metrics.observe_finished(3.0)  # aborted before its first token: no prefill time
    sample = parse_metrics(metrics.render().decode(), "m")
    if exported:
        assert (sample.prefill_time_sum_s, sample.prefill_time_count) == (pytest.approx(0.3), 2.0)
    else:
        assert (sample.prefill_time_sum_s, sample.prefill_time_count) == (None, None)
