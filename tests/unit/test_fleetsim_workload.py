"""Workloads of the fleet simulator: synthetic generation, trace formats, scaling."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tidegate.fleet.traces import TraceError
from tidegate.fleetsim import workload
from tidegate.fleetsim.workload import SimRequest, SyntheticSpec

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces"


def test_synthetic_is_deterministic_per_seed():
    spec = SyntheticSpec(requests=200)
    assert workload.synthetic(spec, 1) == workload.synthetic(spec, 1)
    assert workload.synthetic(spec, 1) != workload.synthetic(spec, 2)


def test_lengths_do_not_depend_on_the_rate():
    a = workload.synthetic(SyntheticSpec(rate_rps=5, requests=100), 4)
    b = workload.synthetic(SyntheticSpec(rate_rps=50, requests=100), 4)
    assert [(r.prompt_tokens, r.output_tokens) for r in a] == [(r.prompt_tokens, r.output_tokens) for r in b]
    assert b[-1].arrival_s == pytest.approx(a[-1].arrival_s / 10)


@pytest.mark.parametrize("arrivals", ["poisson", "gamma"])
def test_arrival_rate(arrivals):
    reqs = workload.synthetic(SyntheticSpec(arrivals=arrivals, rate_rps=20, requests=20000), 0)
    assert reqs[0].arrival_s == 0.0
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:], strict=False))
    assert workload.native_rate(reqs) == pytest.approx(20, rel=0.06)


def test_gamma_is_burstier_than_poisson():
    def cv2(arrivals: str) -> float:
        gaps = workload.unit_gaps(SyntheticSpec(arrivals=arrivals, requests=20000, burstiness=4.0), 0)
        return statistics.pvariance(gaps) / statistics.fmean(gaps) ** 2

    assert cv2("poisson") == pytest.approx(1.0, rel=0.1)
    assert cv2("gamma") == pytest.approx(4.0, rel=0.15)


@pytest.mark.parametrize("lengths", ["lognormal", "pareto"])
def test_heavy_tailed_lengths(lengths):
    spec = SyntheticSpec(lengths=lengths, requests=20000, prompt_mean=1000, output_mean=200, max_prompt=10**7,
                         max_output=10**7)
    reqs = workload.synthetic(spec, 0)
    prompts = [r.prompt_tokens for r in reqs]
    assert statistics.fmean(prompts) == pytest.approx(1000, rel=0.15)
    assert statistics.median(prompts) < statistics.fmean(prompts)  # right-skewed
    assert max(prompts) > 8 * statistics.fmean(prompts)             # a heavy tail
    assert min(r.output_tokens for r in reqs) >= 1


def test_lengths_are_capped():
    reqs = workload.synthetic(SyntheticSpec(lengths="pareto", requests=5000, max_prompt=3000, max_output=50), 0)
    assert max(r.prompt_tokens for r in reqs) <= 3000 and max(r.output_tokens for r in reqs) <= 50


@pytest.mark.parametrize("bad", [dict(arrivals="uniform"), dict(lengths="normal"), dict(rate_rps=0),
                                 dict(requests=0), dict(alpha=1.0)])
def test_spec_validation(bad):
    with pytest.raises(ValueError):
        SyntheticSpec(**bad)


def test_generic_jsonl(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in [
        {"arrival_s": 10.5, "prompt_tokens": 100, "output_tokens": 5, "prefix_hashes": [1, 2],
         "priority": "interactive"},
        {"arrival_s": 10.0, "prompt_tokens": 50, "output_tokens": 0},
        {"arrival_s": 12.0, "prompt_tokens": 70, "output_tokens": 9, "priority": -1},
    ]) + "\n")
    reqs = workload.load(p)
    got = [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in reqs]
    assert got == [(0.0, 50, 1), (0.5, 100, 5), (2.0, 70, 9)]
    assert reqs[1].prefix_hashes == (1, 2) and reqs[1].klass == "interactive" and reqs[1].priority == 0
    assert reqs[2].klass == "-1" and reqs[2].priority == -1
    assert reqs[0].klass == "default"


def test_generic_csv(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens,prefix_hashes,priority\n1.0,10,2,7 8 9,batch\n0.5,20,3,,\n")
    reqs = workload.load(p)
    assert [(r.arrival_s, r.prompt_tokens, r.prefix_hashes, r.klass) for r in reqs] == [
        (0.0, 20, (), "default"), (0.5, 10, (7, 8, 9), "batch")]


@pytest.mark.parametrize("body", ["arrival_s,prompt_tokens,output_tokens\nx,1,1\n",
                                  "arrival_s,prompt_tokens,output_tokens\n1,0,1\n",
                                  "arrival_s,prompt_tokens\n1,5\n",
                                  "arrival_s,prompt_tokens,output_tokens\n"])
def test_generic_errors_name_the_file(tmp_path, body):
    p = tmp_path / "bad.csv"
    p.write_text(body)
    with pytest.raises(TraceError, match="bad.csv"):
        workload.load(p)


def test_azure_and_mooncake_formats(tmp_path):
    az = tmp_path / "az.csv"
    az.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                  "2023-11-16 18:15:47.1805900,396,109\n")
    reqs = workload.load(az)
    got = [(round(r.arrival_s, 3), r.prompt_tokens, r.output_tokens) for r in reqs]
    assert got == [(0.0, 374, 44), (0.5, 396, 109)]
    mc = tmp_path / "mc.jsonl"
    mc.write_text('{"timestamp": 1000, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]}\n'
                  '{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 2]}\n')
    reqs = workload.load(mc)
    assert [(r.arrival_s, r.prefix_hashes, r.hash_block_tokens) for r in reqs] == [(0.0, (0, 2), 512),
                                                                                  (1.0, (0, 1), 512)]


def test_scale_and_cut():
    reqs = [SimRequest(i, float(i), 10, 1) for i in range(10)]
    fast = workload.scale_arrivals(reqs, 2.0)
    assert [r.arrival_s for r in fast] == [i / 2 for i in range(10)]
    assert len(workload.cut(fast, 2.0)) == 4
    assert workload.cut(fast, None) == fast
    with pytest.raises(ValueError):
        workload.scale_arrivals(reqs, 0)


@pytest.mark.skipif(not (SHARED / "AzureLLMInferenceTrace_conv.csv").exists(), reason="shared traces absent")
def test_real_azure_trace_loads():
    reqs = workload.load(SHARED / "AzureLLMInferenceTrace_conv.csv")
    assert len(reqs) == 19366 and reqs[0].arrival_s == 0.0


@pytest.mark.parametrize(("text", "want"), [
    ("critical=0.2,standard=0.5,sheddable=0.3", {"critical": 0.2, "standard": 0.5, "sheddable": 0.3}),
    ("critical=1, sheddable=3", {"critical": 0.25, "sheddable": 0.75}),
    ("standard=2", {"standard": 1.0}),
])
def test_parse_class_mix(text, want):
    assert workload.parse_class_mix(text) == pytest.approx(want)


@pytest.mark.parametrize("text", ["", "gold=1", "critical", "critical=x", "critical=-1", "critical=0",
                                  "critical=1,critical=2"])
def test_parse_class_mix_rejects(text):
    with pytest.raises(ValueError):
        workload.parse_class_mix(text)


def test_assign_classes_is_seeded_and_follows_the_mix():
    reqs = [workload.SimRequest(i, float(i), 100, 10) for i in range(3000)]
    mix = workload.parse_class_mix("critical=0.2,standard=0.5,sheddable=0.3")
    a = workload.assign_classes(reqs, mix, seed=4)
    assert a == workload.assign_classes(reqs, mix, seed=4)
    assert a != workload.assign_classes(reqs, mix, seed=5)
    share = {k: sum(r.klass == k for r in a) / len(a) for k in mix}
    assert share == pytest.approx(mix, abs=0.03)
    assert all(r.priority == workload.CLASS_PRIORITY[r.klass] for r in a)
    # Classes do not depend on the arrival times: a compressed replay keeps them.
    assert [r.klass for r in workload.assign_classes(workload.scale_arrivals(reqs, 2.0), mix, 4)] == \
        [r.klass for r in a]


# The published formats, each as its release writes it (first rows of the files, shapes checked
# against the releases' READMEs; the token counts here are made up). Arrivals are relative to the
# earliest request; 0 tokens replay as 1.
@pytest.mark.parametrize("name, body, want", [
    ("azure_2023.csv",
     "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
     "2023-11-16 18:15:47.1805900,396,109",
     [(0.0, 374, 44), (0.5, 396, 109)]),
    ("azure_2024.csv",  # DynamoLLM's week-long release: a UTC offset, 6 digits, some none
     "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.009930+00:00,2162,5\n"
     "2024-05-10 00:00:01+00:00,0,0\n2024-05-10 00:00:00.509930+00:00,300,12\n",
     [(0.0, 2162, 5), (0.5, 300, 12), (0.99007, 1, 1)]),
    ("azure_offsets.csv",  # the same instant written in two zones is the same arrival
     "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 02:00:00+02:00,10,1\n2024-05-10T00:00:02Z,20,2\n",
     [(0.0, 10, 1), (2.0, 20, 2)]),
    ("BurstGPT_1.csv",  # seconds from the start; failed requests logged with 0 response tokens
     "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,472,18,490,Conversation log\n"
     "45,GPT-4,1087,0,1087,API log\n45,ChatGPT,417.0,276,693,Conversation log\n",
     [(0.0, 472, 18), (40.0, 1087, 1), (40.0, 417, 276)]),
])
def test_published_trace_formats(tmp_path, name, body, want):
    p = tmp_path / name
    p.write_text(body)
    reqs = workload.load(p)
    assert [(round(r.arrival_s, 5), r.prompt_tokens, r.output_tokens) for r in reqs] == want
    assert [r.index for r in reqs] == list(range(len(want)))


@pytest.mark.parametrize("body, match", [
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00+00:00,-3,5\n", r"t\.csv:2: token count '-3'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00+00:00,3,5\nyesterday,3,5\n", r"t\.csv:3:"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00+00:00,1.5,5\n", r"t\.csv:2: token count '1.5'"),
    ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\nnan,GPT-4,3,4,7,API log\n",
     r"t\.csv:2: timestamp 'nan'"),
    ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n", r"t\.csv: no requests"),
    ("time,prompt,answer\n1,2,3\n", r"expected columns \['TIMESTAMP', 'ContextTokens', 'GeneratedTokens'\]"),
])
def test_published_trace_format_errors_name_the_line(tmp_path, body, match):
    p = tmp_path / "t.csv"
    p.write_text(body)
    with pytest.raises(TraceError, match=match):
        workload.load(p)


@pytest.mark.parametrize("line, match", [
    ('{"timestamp": 0, "input_length": -1, "output_length": 5}', r"t\.jsonl:1: token count -1"),
    ('{"timestamp": 0, "input_length": true, "output_length": 5}', r"t\.jsonl:1: token count True"),
    ('{"timestamp": "later", "input_length": 10, "output_length": 5}', r"t\.jsonl:1:"),
    ('{"input_length": 10, "output_length": 5}', r"t\.jsonl:1: 'timestamp'"),
])
def test_mooncake_errors_name_the_line(tmp_path, line, match):
    p = tmp_path / "t.jsonl"
    p.write_text(line + "\n")
    with pytest.raises(TraceError, match=match):
        workload.load(p)


@pytest.mark.parametrize("name, head, row", [
    ("az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens", "2024-05-10 00:00:0{i}+00:00,1{i},2"),
    ("bg.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type", "{i},GPT-4,1{i},2,3,API log"),
    ("mc.jsonl", None, '{{"timestamp": {ms}, "input_length": 1{i}, "output_length": 2, "hash_ids": [{i}]}}'),
    ("gen.csv", "arrival_s,prompt_tokens,output_tokens", "{i},1{i},2"),
    ("gen.jsonl", None, '{{"arrival_s": {i}, "prompt_tokens": 1{i}, "output_tokens": 2}}'),
])
def test_a_limit_reads_only_the_first_rows(tmp_path, name, head, row):
    # A malformed row past the limit is never read: the week-long traces are not parsed whole to
    # replay their start (--max-requests).
    lines = ([head] if head else []) + [row.format(i=i, ms=1000 * i) for i in range(4)] + ["garbage"]
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    reqs = workload.load(p, 3)
    assert [(r.arrival_s, r.prompt_tokens) for r in reqs] == [(0.0, 10), (1.0, 11), (2.0, 12)]
    with pytest.raises(TraceError, match=rf"{name}:{len(lines)}:"):
        workload.load(p)
