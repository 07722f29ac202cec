"""tidegate.engine_metrics on real engines' /metrics pages (tests/fixtures/metrics, sources in its README)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from tidegate.agent.histograms import summarize
from tidegate.agent.rates import work_deltas
from tidegate.engine_metrics import DIALECTS, TelemetryParseError, parse_metrics

PAGES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"


def page(name: str) -> str:
    return (PAGES / name).read_text()


@dataclass(frozen=True)
class Want:
    engine: str
    running: int
    waiting: int
    kv_usage: float | None
    kv_capacity_tokens: int
    prompt_tokens: float
    generation_tokens: float
    preemptions: float | None
    prefix_cache_hits: float | None
    ttft_count: float
    ttft_p50_ms: float
    itl_count: float
    itl_p50_ms: float
    e2e_count: float
    steps: float | None


CASES = {
    # Real capture: SGLang under overload (2826 queued); most TTFTs beyond the last finite bucket.
    "sglang-docs-00b08c4.txt": Want(
        "sglang", 162, 2826, 0.28, 0, 8128902.0, 7557572.0, None, None,
        11008.0, 30000.0, 7400757.0, 93.0823731364498, 11228.0, None),
    # V0: gpu_cache_usage_perc, time_per_output_token_seconds, cache_config_info from an Info metric.
    "vllm-v0-00c33e8.txt": Want(
        "vllm", 12, 3, 0.8125, 27910 * 16, 51200.0, 20480.0, 4.0, None,
        20.0, 40.0, 100.0, 22.5, 10.0, None),
    # V1 with two data-parallel engines: counts summed, KV usage averaged, capacity summed.
    "vllm-v1-005a810.txt": Want(
        "vllm", 30, 5, 0.375, 2 * 30000 * 16, 160000.0, 64000.0, 4.0, 40000.0,
        200.0, 60.0, 2000.0, 19.375, 320.0, 2000.0),
    # TGI: queue and batch gauges; token totals from the per-request histograms' sums; no KV, no TTFT.
    "tgi-router-003eaec.txt": Want(
        "tgi", 16, 7, None, 0, 30 * 500 + 12 * 2000, 30 * 100 + 10 * 400, None, None,
        0.0, 0.0, 40.0, 25.949267578124996, 40.0, None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_page_parses_to_engine_sample(name: str) -> None:
    want = CASES[name]
    s = parse_metrics(page(name))
    ttft, itl, e2e = summarize(s.ttft), summarize(s.itl), summarize(s.e2e)
    got = Want(
        s.engine, s.running, s.waiting, s.kv_usage, s.kv_capacity_tokens, s.prompt_tokens_total or 0.0,
        s.generation_tokens_total or 0.0, s.preemptions_total, s.prefix_cache_hits_total,
        ttft.count, ttft.p50_ms, itl.count, itl.p50_ms, e2e.count, s.steps_total)
    assert asdict(got) == pytest.approx(asdict(want))
    assert s.has_kv_capacity == (want.kv_capacity_tokens > 0)


@pytest.mark.parametrize(("name", "prefill"), [
    ("vllm-v1-005a810.txt", (2 * (120 * 0.15 + 30 * 0.6 + 10 * 2.0), 320.0)),  # both engines summed
    ("vllm-v0-00c33e8.txt", (None, None)),    # not in that V0 release
    ("sglang-docs-00b08c4.txt", (None, None)),
    ("tgi-router-003eaec.txt", (None, None)),
])
def test_prefill_time_histogram_read_where_the_engine_exports_it(name: str, prefill: tuple) -> None:
    """vllm:request_prefill_time_seconds sizes the rate fit's merge (tidegate/policy/rates.py)."""
    s = parse_metrics(page(name))
    assert (s.prefill_time_sum_s, s.prefill_time_count) == pytest.approx(prefill)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_page_names_its_source(name: str) -> None:
    head = page(name).split("\n# HELP", 1)[0]
    assert "SOURCE: CAPTURED" in head or "SOURCE: RECONSTRUCTED" in head
    assert "commit " in head and "Licence" in head
    assert name in (PAGES / "README.md").read_text()


@pytest.mark.parametrize("name", sorted(CASES))
def test_model_filter_keeps_or_drops_the_page(name: str) -> None:
    text = page(name)
    if CASES[name].engine == "tgi":
        # TGI serves one model and labels nothing with it: a model filter cannot drop anything.
        assert parse_metrics(text, "any-model").running == CASES[name].running
    else:
        with pytest.raises(TelemetryParseError, match="for model 'not-this-model'"):
            parse_metrics(text, "not-this-model")


@pytest.mark.parametrize("name", sorted(CASES))
def test_forced_dialect_matches_auto_and_others_refuse(name: str) -> None:
    text = page(name)
    engine = CASES[name].engine
    assert parse_metrics(text, dialect=engine) == parse_metrics(text)
    for other in set(DIALECTS) - {engine}:
        with pytest.raises(TelemetryParseError, match=f"no {other} metrics"):
            parse_metrics(text, dialect=other)


def test_unknown_dialect_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown metrics dialect 'trt'"):
        parse_metrics(page("tgi-router-003eaec.txt"), dialect="trt")


def test_tgi_work_has_token_counters_but_no_step_or_decode_time() -> None:
    """TGI's ITL buckets are per-request means: not fed to the rate estimator as decode time."""
    text = page("tgi-router-003eaec.txt")
    prev = parse_metrics(text)
    now = parse_metrics(text.replace("tgi_request_input_length_sum 39000", "tgi_request_input_length_sum 41000"))
    work = work_deltas(prev, now, 2.0)
    assert work == {"interval_s": 2.0, "prompt_tokens": 2000.0, "generation_tokens": 0.0, "finished_requests": 0.0}


@pytest.mark.parametrize("name", sorted(CASES))
def test_truncated_page_is_a_parse_error_or_a_partial_sample(name: str) -> None:
    """A page cut anywhere (a scrape dropped mid-body) never raises anything but TelemetryParseError."""
    text = page(name)
    errors = 0
    for cut in range(0, len(text), max(1, len(text) // 150)):
        try:
            parse_metrics(text[:cut])
        except TelemetryParseError:
            errors += 1
    assert errors > 0  # cuts inside a sample line must be reported, not read as a smaller number


@pytest.mark.parametrize(
    "text",
    [
        "<html><body><h1>502 Bad Gateway</h1></body></html>\n",
        '{"detail": "Not Found"}',
        "\x00\x01\x02\xff garbage",
        'vllm:num_requests_running{engine="0",model_name="m',
        "tgi_queue_size seven\n",
    ],
    ids=["html", "json", "binary", "cut-label", "bad-value"],
)
def test_garbage_is_a_clear_parse_error(text: str) -> None:
    with pytest.raises(TelemetryParseError, match="engine /metrics"):
        parse_metrics(text)
