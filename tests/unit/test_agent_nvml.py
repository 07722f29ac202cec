"""agent.nvml: NvmlReader with a fake pynvml module, and with the real one (no driver here)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pynvml

from agent.nvml import GpuStat, NvmlReader


class FakeNvmlError(Exception):
    pass


class FakeNotSupported(FakeNvmlError):
    pass


class FakeGpuIsLost(FakeNvmlError):
    pass


class FakeUnknown(FakeNvmlError):
    pass


@dataclass
class FakeMem:
    total: int
    used: int
    free: int = 0


@dataclass
class FakeUtil:
    gpu: int
    memory: int = 0


@dataclass
class FakeGpu:
    uuid: str
    name: str
    total: int = 80 * 2**30
    used: int = 10 * 2**30
    util: int = 42
    ecc: dict[int, int] | None = field(default_factory=lambda: {1: 3, 0: 7})  # None = not supported
    pending: int | None = 0     # None = not supported
    temp: int = 55
    power_mw: int = 250_000
    lost: bool = False


class FakeNvml:
    """Stands in for the pynvml module: the functions and constants NvmlReader uses."""

    NVMLError = FakeNvmlError
    NVMLError_NotSupported = FakeNotSupported
    NVMLError_GpuIsLost = FakeGpuIsLost
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_TEMPERATURE_GPU = 0
    NVML_FEATURE_ENABLED = 1

    def __init__(self, gpus: list[FakeGpu], init_error: Exception | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.init_calls = 0
        self.shutdown_calls = 0

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        if i >= len(self.gpus):
            raise FakeUnknown("invalid index")
        return self._alive(self.gpus[i])

    def _alive(self, g: FakeGpu) -> FakeGpu:
        if g.lost:
            raise FakeGpuIsLost("GPU is lost")
        return g

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return self._alive(h).uuid

    def nvmlDeviceGetName(self, h: FakeGpu) -> bytes:
        return self._alive(h).name.encode()  # old pynvml returned bytes

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> FakeMem:
        g = self._alive(h)
        return FakeMem(total=g.total, used=g.used)

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> FakeUtil:
        return FakeUtil(gpu=self._alive(h).util)

    def nvmlDeviceGetTotalEccErrors(self, h: FakeGpu, kind: int, counter: int) -> int:
        g = self._alive(h)
        if g.ecc is None:
            raise FakeNotSupported("Not Supported")
        return g.ecc[kind]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: FakeGpu) -> int:
        g = self._alive(h)
        if g.pending is None:
            raise FakeNotSupported("Not Supported")
        return g.pending

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        return self._alive(h).temp

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        return self._alive(h).power_mw


def test_happy_path_all_gpus() -> None:
    nv = FakeNvml([FakeGpu("GPU-a", "NVIDIA H100"), FakeGpu("GPU-b", "NVIDIA H100", pending=1)])
    t = NvmlReader(nv).read()
    assert t.available and t.error == ""
    assert t.gpus[0] == GpuStat(
        index=0, uuid="GPU-a", name="NVIDIA H100", memory_total_bytes=80 * 2**30,
        memory_used_bytes=10 * 2**30, utilization_pct=42.0, ecc_uncorrected_volatile=3,
        ecc_corrected_volatile=7, retired_pages_pending=0, temperature_c=55.0, power_w=250.0,
    )
    assert t.gpus[1].index == 1 and t.gpus[1].retired_pages_pending == 1


def test_selected_indices_and_init_once() -> None:
    nv = FakeNvml([FakeGpu("GPU-a", "x"), FakeGpu("GPU-b", "y")])
    reader = NvmlReader(nv)
    assert [g.uuid for g in reader.read([1]).gpus] == ["GPU-b"]
    reader.read([0, 1])
    assert nv.init_calls == 1
    reader.close()
    assert nv.shutdown_calls == 1


def test_unsupported_ecc_and_retired_pages_stay_zero() -> None:
    nv = FakeNvml([FakeGpu("GPU-a", "GeForce", ecc=None, pending=None)])
    g = NvmlReader(nv).read().gpus[0]
    assert (g.ecc_uncorrected_volatile, g.ecc_corrected_volatile, g.retired_pages_pending) == (0, 0, 0)
    assert g.error == "" and not g.lost
    assert g.memory_total_bytes == 80 * 2**30  # the supported readings still arrive


def test_lost_gpu_is_marked_not_invented() -> None:
    nv = FakeNvml([FakeGpu("GPU-a", "x"), FakeGpu("GPU-b", "y", lost=True)])
    t = NvmlReader(nv).read()
    assert t.available
    ok, lost = t.gpus
    assert not ok.lost
    assert lost.lost and "lost" in lost.error
    assert (lost.memory_total_bytes, lost.utilization_pct, lost.uuid) == (0, 0.0, "")


def test_lost_midway_keeps_earlier_readings() -> None:
    class LosesAfterMemory(FakeNvml):
        def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> FakeUtil:
            raise FakeGpuIsLost("GPU is lost")

    g = NvmlReader(LosesAfterMemory([FakeGpu("GPU-a", "x")])).read().gpus[0]
    assert g.lost and g.memory_total_bytes == 80 * 2**30 and g.temperature_c == 0.0


def test_other_nvml_error_is_recorded_per_gpu() -> None:
    nv = FakeNvml([FakeGpu("GPU-a", "x")])
    g = NvmlReader(nv).read([0, 5]).gpus[1]
    assert g.index == 5 and "invalid index" in g.error and not g.lost


def test_init_failure_reports_unavailable() -> None:
    nv = FakeNvml([], init_error=FakeUnknown("Driver Not Loaded"))
    reader = NvmlReader(nv)
    t = reader.read()
    assert not t.available and t.gpus == ()
    assert "Driver Not Loaded" in t.error
    reader.read()
    assert nv.init_calls == 1


def _has_driver() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_real_pynvml() -> None:
    reader = NvmlReader()  # the real pynvml module
    t = reader.read()
    try:
        if _has_driver():
            assert t.available and t.error == ""
            for g in t.gpus:
                assert g.memory_total_bytes > 0 and not g.lost
        else:
            assert not t.available
            assert t.error  # e.g. "NVMLError_LibraryNotFound: NVML Shared Library Not Found"
            assert t.gpus == ()
    finally:
        reader.close()


def test_fake_matches_real_module_surface() -> None:
    """The fake must not use names the real pynvml lacks."""
    used = [n for n in dir(FakeNvml) if n.startswith(("nvml", "NVML"))]
    missing = [n for n in used if not hasattr(pynvml, n)]
    assert missing == []


