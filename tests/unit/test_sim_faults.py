"""simulator.faults: fault parsing, fault state transitions and the simulated NVML readings."""

from __future__ import annotations

import pytest

from tidegate.simulator.engine import EngineStats
from tidegate.simulator.faults import (
    H100,
    H200,
    LOST_ERROR,
    MAX_PENDING_XIDS,
    RUNTIME_RESERVE_BYTES,
    BusyWindow,
    Fault,
    FaultError,
    FaultState,
    SimulatedGpus,
    layout_for,
    parse_fault,
)
from tidegate.simulator.profiles import get_profile


def stats(used_blocks: int = 0) -> EngineStats:
    return EngineStats(running=0, waiting=0, used_blocks=used_blocks, num_gpu_blocks=28000, block_size=16,
                       prompt_tokens_total=0, generation_tokens_total=0, preemptions_total=0,
                       requests_finished_total=0, requests_aborted_total=0)


def gpus(profile: str = "llama3-8b-h100", count: int | None = None) -> SimulatedGpus:
    lay = layout_for(get_profile(profile), count)
    return SimulatedGpus(lay, [f"GPU-{i}" for i in range(lay.gpu_count)])


# ------------------------------------------------------------------ parse_fault


@pytest.mark.parametrize(("body", "expected"), [
    ({"xid": 79}, Fault(xids=(79,))),
    ({"xid": [48, 94], "gpu": 1}, Fault(gpu=1, xids=(48, 94))),
    ({"ecc_uncorrected": 1}, Fault(ecc_uncorrected=1)),
    ({"ecc_corrected": 5}, Fault(ecc_corrected=5)),
    ({"gpu_lost": True}, Fault(gpu_lost=True)),
    ({"gpu_lost": False}, Fault(gpu_lost=False)),
    ({"row_remap_failed": True, "gpu": 1}, Fault(gpu=1, row_remap_failed=True)),
    ({"oom": True}, Fault(oom=True)),
    ({"health": False}, Fault(health=False)),
    ({"crash": True}, Fault(crash=True)),
    ({"clear": True}, Fault(clear=True)),
    ({"clear": True, "gpu": 0}, Fault(clear=True, gpu=0)),
    ({"xid": 79, "gpu_lost": True}, Fault(xids=(79,), gpu_lost=True)),
], ids=lambda v: str(v))
def test_parse_valid(body, expected) -> None:
    assert parse_fault(body, gpu_count=2) == expected


@pytest.mark.parametrize(("body", "needle"), [
    ([], "non-empty JSON object"),
    ({}, "non-empty JSON object"),
    ("xid", "non-empty JSON object"),
    ({"xid": 0}, "'xid'"),
    ({"xid": "79"}, "'xid'"),
    ({"xid": True}, "'xid'"),
    ({"xid": [79, None]}, "'xid'"),
    ({"ecc_uncorrected": -1}, "'ecc_uncorrected'"),
    ({"ecc_uncorrected": 1.5}, "'ecc_uncorrected'"),
    ({"gpu_lost": 1}, "'gpu_lost'"),
    ({"row_remap_failed": "yes"}, "'row_remap_failed'"),
    ({"oom": "yes"}, "'oom'"),
    ({"gpu": 2, "xid": 79}, "'gpu'"),
    ({"gpu": -1, "xid": 79}, "'gpu'"),
    ({"gpu": True, "xid": 79}, "'gpu'"),
    ({"crash": False}, "only take true"),
    ({"clear": True, "xid": 79}, "cannot be combined"),
    ({"explode": True}, "unknown keys ['explode']"),
], ids=lambda v: str(v))
def test_parse_invalid(body, needle) -> None:
    with pytest.raises(FaultError) as err:
        parse_fault(body, gpu_count=2)
    assert needle in str(err.value)


# ------------------------------------------------------------------ FaultState


def test_xids_are_queued_per_gpu_and_taken_once() -> None:
    s = FaultState(2)
    s.apply(Fault(xids=(79,)))
    s.apply(Fault(gpu=1, xids=(48, 94)))
    s.apply(Fault(xids=(13,)))
    assert s.take_xids(0) == [79, 13]
    assert s.take_xids(1) == [48, 94]
    assert (s.take_xids(0), s.take_xids(1)) == ([], [])


def test_xid_queue_is_bounded_keeping_newest() -> None:
    s = FaultState(1)
    s.apply(Fault(xids=tuple(range(1, MAX_PENDING_XIDS + 11))))
    got = s.take_xids(0)
    assert len(got) == MAX_PENDING_XIDS and got[-1] == MAX_PENDING_XIDS + 10 and got[0] == 11


def test_ecc_uncorrected_accumulates_and_sets_pending_retirement() -> None:
    s = FaultState(1)
    s.apply(Fault(ecc_corrected=3))
    assert s.gpus[0].retired_pages_pending == 0
    s.apply(Fault(ecc_uncorrected=1))
    s.apply(Fault(ecc_uncorrected=2))
    g = s.gpus[0]
    assert (g.ecc_uncorrected, g.ecc_corrected, g.retired_pages_pending) == (3, 3, 1)


def test_lost_oom_and_clear_transitions() -> None:
    s = FaultState(2)
    assert not s.any_lost and not s.oom
    s.apply(Fault(gpu=1, gpu_lost=True))
    s.apply(Fault(oom=True))
    assert s.any_lost and s.gpus[1].lost and not s.gpus[0].lost and s.oom
    s.apply(Fault(xids=(79,), ecc_uncorrected=1))
    s.apply(Fault(clear=True, gpu=1))  # that GPU only
    assert not s.any_lost and s.oom and s.gpus[0].ecc_uncorrected == 1
    s.apply(Fault(gpu=1, gpu_lost=True))
    s.apply(Fault(gpu=1, gpu_lost=False))  # revived explicitly
    assert not s.any_lost
    s.apply(Fault(gpu_lost=True))
    s.apply(Fault(clear=True))  # everything
    assert not s.any_lost and not s.oom and s.take_xids(0) == [] and s.gpus[0].ecc_uncorrected == 0


def test_health_and_crash_do_not_touch_gpu_state() -> None:
    s = FaultState(1)
    s.apply(Fault(health=False))
    s.apply(Fault(crash=True))
    assert s.as_dict() == FaultState(1).as_dict()


# ------------------------------------------------------------------ layout and readings


def test_layouts_follow_the_profile() -> None:
    h100 = layout_for(get_profile("llama3-8b-h100"))
    assert (h100.kind, h100.gpu_count) == (H100, 1)
    assert h100.name == "NVIDIA H100 80GB HBM3 (simulated)"
    assert h100.kv_bytes_per_block_per_gpu == 16 * 128 * 1024
    assert layout_for(get_profile("llama3-8b-h200")).kind == H200
    tp4 = layout_for(get_profile("llama3-70b-tp4-h100"))
    assert tp4.gpu_count == 4 and tp4.weights_bytes_per_gpu == 141_100_000_000 // 4
    assert layout_for(get_profile("llama3-8b-h100"), 2).weights_bytes_per_gpu == 16_060_000_000 // 2


def test_memory_used_is_weights_plus_blocks_in_use() -> None:
    g = gpus()
    lay = g.layout
    idle = g.read(0.0, stats(0))["gpus"][0]
    busy = g.read(0.0, stats(1000))["gpus"][0]
    assert idle["memory_used_bytes"] == RUNTIME_RESERVE_BYTES + lay.weights_bytes_per_gpu
    assert busy["memory_used_bytes"] - idle["memory_used_bytes"] == 1000 * 16 * 128 * 1024
    full = g.read(0.0, stats(28000))["gpus"][0]
    assert full["memory_used_bytes"] <= full["memory_total_bytes"] == 81_559 * 2**20


def test_every_answer_is_labelled_simulated() -> None:
    r = gpus("llama3-70b-tp4-h100").read(0.0, stats())
    assert r["simulated"] is True
    assert [g["index"] for g in r["gpus"]] == [0, 1, 2, 3]
    assert all(g["name"].endswith("(simulated)") for g in r["gpus"])
    assert len({g["uuid"] for g in r["gpus"]}) == 4


def test_utilization_is_the_busy_fraction_of_the_last_second() -> None:
    g = gpus()
    assert g.read(10.0, stats())["gpus"][0]["utilization_pct"] == 0.0
    g.busy.record(9.0, 9.25)
    g.busy.record(9.5, 9.75)
    r = g.read(10.0, stats())["gpus"][0]
    assert r["utilization_pct"] == 50.0
    assert H100.idle_power_w < r["power_w"] < H100.max_power_w
    assert H100.idle_temp_c < r["temperature_c"] < H100.max_temp_c
    assert g.read(11.0, stats())["gpus"][0]["utilization_pct"] == 0.0  # old steps fall out


def test_busy_window_clips_a_step_in_progress() -> None:
    w = BusyWindow(1.0)
    w.record(4.0, 6.0)
    assert w.fraction(5.0) == 1.0
    w.record(7.0, 7.0)  # zero-length (instant profile): not busy
    assert w.fraction(7.5) == 0.0


def test_read_consumes_xids_like_an_event_set() -> None:
    g = gpus(count=2)
    g.faults.apply(Fault(gpu=1, xids=(79,)))
    first = g.read(0.0, stats())["gpus"]
    assert [x["xid_events"] for x in first] == [[], [79]]
    assert [x["xid_events"] for x in g.read(0.0, stats())["gpus"]] == [[], []]


def test_faults_show_in_readings() -> None:
    g = gpus(count=2)
    g.faults.apply(Fault(ecc_uncorrected=2, ecc_corrected=1))
    g.faults.apply(Fault(gpu=1, gpu_lost=True, xids=(79,)))
    ok, lost = g.read(0.0, stats(100))["gpus"]
    assert (ok["ecc_uncorrected_volatile"], ok["ecc_corrected_volatile"], ok["retired_pages_pending"]) == (2, 1, 1)
    assert not ok["lost"] and ok["error"] == ""
    assert lost["lost"] and lost["error"] == LOST_ERROR and lost["xid_events"] == [79]
    assert (lost["memory_total_bytes"], lost["memory_used_bytes"], lost["utilization_pct"]) == (0, 0, 0.0)
    assert lost["uuid"] == "GPU-1"  # still identifiable


def test_oom_reads_full_memory() -> None:
    g = gpus()
    g.faults.apply(Fault(oom=True))
    r = g.read(0.0, stats(0))["gpus"][0]
    assert r["memory_used_bytes"] == r["memory_total_bytes"]
    assert "out of memory" in r["error"]
    g.faults.apply(Fault(oom=False))
    assert g.read(0.0, stats(0))["gpus"][0]["error"] == ""
    assert "CUDA out of memory" in g.oom_message()
