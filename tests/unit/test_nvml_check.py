"""scripts/nvml_check.py, the GPU node check, driven by the fake pynvml module of
test_agent_nvml (no driver here): what passes, what fails and what only warns."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from module_file import SCRIPTS, load_module  # type: ignore[import-not-found]
from test_agent_nvml import FakeGpu, FakeNvml, FakeUnknown  # type: ignore[import-not-found]

from tidegate.agent.nvml import NvmlReader

NC = load_module(SCRIPTS / "nvml_check.py")
GIB = 2**30


def args(alloc_gib: float = 0.0) -> argparse.Namespace:
    return argparse.Namespace(alloc_gib=alloc_gib, reads=3, settle_s=0.3, json=None)


def fake_allocator(gpu: FakeGpu, moves: bool = True) -> Callable[[float, int], tuple[str, Callable[[], None]]]:
    """Allocates by raising the fake GPU's used memory (or, with moves=False, a driver that lags)."""
    def allocate(gib: float, index: int) -> tuple[str, Callable[[], None]]:
        if moves:
            gpu.used += int(gib * GIB)

        def free() -> None:
            if moves:
                gpu.used -= int(gib * GIB)
        return "fake", free
    return allocate


def failed(result: dict) -> list[str]:
    return [c["check"] for c in result["checks"] if not c["ok"]]


def test_healthy_gpus_and_an_allocation_that_shows_pass() -> None:
    a, b = FakeGpu("GPU-a", "H200"), FakeGpu("GPU-b", "H200")
    code, result = NC.run(args(4), NvmlReader(FakeNvml([a, b])), fake_allocator(a))
    assert code == 0 and failed(result) == []
    assert result["alloc"]["held"] - result["alloc"]["before"] == 4 * GIB
    assert result["xid_event_support"] == {"0": True, "1": True}
    assert result["read_ms"]["n"] == 3 and result["warnings"] == []


def test_used_memory_that_does_not_follow_the_allocation_fails() -> None:
    a = FakeGpu("GPU-a", "H200")
    code, result = NC.run(args(4), NvmlReader(FakeNvml([a])), fake_allocator(a, moves=False))
    assert code == 1
    assert failed(result) == ["used memory follows an allocation", "used memory falls after the free"]


def test_a_lost_gpu_fails_its_readings() -> None:
    code, result = NC.run(args(), NvmlReader(FakeNvml([FakeGpu("GPU-a", "x"), FakeGpu("GPU-b", "y", lost=True)])))
    assert code == 1 and failed(result) == ["gpu 1 readings"]
    assert any("GPU is lost" in w for w in result["warnings"])


def test_failed_row_remapping_fails_and_a_pending_one_warns() -> None:
    bad, waiting = FakeGpu("GPU-a", "H200", remap=(0, 1, 0, 1)), FakeGpu("GPU-b", "H200", remap=(0, 1, 1, 0))
    code, result = NC.run(args(), NvmlReader(FakeNvml([bad, waiting])))
    assert code == 1 and failed(result) == ["gpu 0 readings"]
    assert result["warnings"] == ["gpu 1: a page retirement or row remap waits for a GPU reset"]


def test_unsupported_events_and_no_allocator_only_warn() -> None:
    a = FakeGpu("GPU-a", "x", events_supported=False)
    code, result = NC.run(args(2), NvmlReader(FakeNvml([a])), lambda gib, index: None)
    assert code == 0
    assert result["xid_event_support"] == {"0": False}
    assert any("Xid event registration not supported" in w for w in result["warnings"])
    assert any("allocation check skipped" in w for w in result["warnings"])


def test_no_driver_is_status_2_with_the_agents_error_text() -> None:
    code, result = NC.run(args(), NvmlReader(FakeNvml([], init_error=FakeUnknown("no driver"))))
    assert code == 2 and not result["available"] and "no driver" in result["error"]
    assert result["checks"] == []
