"""Profiles load and validate; the cost model reproduces the calibration table."""

from __future__ import annotations

import csv
import io
from importlib import resources

import pytest

from tidegate.simulator.profiles import ProfileError, get_profile, load_profiles, parse_profiles


def test_required_profiles_exist_with_expected_capacity():
    ps = load_profiles()
    assert {"llama3-8b-h100", "llama3-8b-h200", "llama3-70b-tp4-h100", "instant", "tiny-h100"} <= set(ps)
    assert ps["llama3-8b-h100"].kv_capacity_tokens == 448_000
    assert 833_000 <= ps["llama3-8b-h200"].kv_capacity_tokens <= 896_000
    assert ps["tiny-h100"].num_gpu_blocks == 2048
    assert ps["tiny-h100"].cost == ps["llama3-8b-h100"].cost
    for p in ps.values():
        assert p.max_num_seqs == 256 and p.max_num_batched_tokens == 8192 and p.block_size == 16
        assert p.max_model_len <= p.kv_capacity_tokens
    assert ps["instant"].cost.step_ms(8192, 10**6) == 0.0


def test_unknown_profile_lists_valid_ones():
    with pytest.raises(ProfileError, match="llama3-8b-h100"):
        get_profile("no-such-gpu")


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        pytest.param({}, "profiles", id="no-profiles-key"),
        pytest.param({"profiles": {"x": {"model": "m"}}}, "lacks", id="missing-fields"),
        pytest.param({"profiles": {"x": {"model": "m", "block_size": 16, "num_gpu_blocks": 1, "max_num_seqs": 1,
                                         "max_num_batched_tokens": 1, "max_model_len": 100, "cost": {}}}},
                     "cost", id="empty-cost"),
    ],
)
def test_invalid_profile_documents(doc, match):
    with pytest.raises(ProfileError, match=match):
        parse_profiles(doc)


def test_override_shrinks_max_model_len_to_cache():
    p = get_profile("llama3-8b-h100").with_overrides(num_gpu_blocks=100, max_num_seqs=None)
    assert p.num_gpu_blocks == 100 and p.max_model_len == 1600 and p.max_num_seqs == 256
    with pytest.raises(ProfileError, match="does not fit"):
        get_profile("llama3-8b-h100").with_overrides(num_gpu_blocks=100, max_model_len=5000)


def _table():
    text = resources.files("simulator").joinpath("calibration/derived_decode_step_llama3_8b_bf16.csv").read_text()
    return [(r["gpu"], int(r["batch"]), int(r["context_per_seq"]), float(r["estimated_step_ms"]))
            for r in csv.DictReader(io.StringIO(text))]


@pytest.mark.parametrize("row", _table(), ids=lambda r: f"{r[0]}-b{r[1]}-ctx{r[2]}")
def test_decode_step_within_10_percent_of_calibration(row):
    gpu, batch, ctx, expected = row
    model = get_profile(f"llama3-8b-{gpu.lower()}").cost
    assert model.decode_step_ms(batch, ctx) == pytest.approx(expected, rel=0.10)


def test_prefill_of_1k_chunk_near_26ms():
    assert get_profile("llama3-8b-h100").cost.step_ms(1024, 1024) == pytest.approx(26.0, rel=0.10)
    assert get_profile("llama3-8b-h200").cost.step_ms(1024, 1024) == pytest.approx(25.5, rel=0.10)
    assert get_profile("llama3-8b-h100").cost.step_ms(0, 0) == 0.0


def test_70b_tp4_anchors():
    # splitwise, Llama2-70B TP4 H100: 1k-token prompt 106.3 ms; decode step at batch 8 31.4 ms
    cost = get_profile("llama3-70b-tp4-h100").cost
    assert cost.step_ms(1024, 1024) == pytest.approx(106.3, rel=0.15)
    assert cost.decode_step_ms(8, 576) == pytest.approx(31.4, rel=0.15)
