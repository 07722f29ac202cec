"""GPU telemetry from NVML (pynvml, from the nvidia-ml-py package).

Without an NVIDIA driver `nvmlInit` raises (NVMLError_LibraryNotFound, DriverNotLoaded, ...):
the reader then reports `available=False` with the error text and no GPUs. Numbers are never
invented. Per-GPU counters a board does not support (ECC on consumer cards, retired pages)
stay 0; a GPU the driver reports lost is marked `lost=True`.

Blocking calls: run `read` in a thread (`asyncio.to_thread`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any


@dataclass
class GpuStat:
    """One GPU; field names match tidegate.v1.GpuStats."""

    index: int
    uuid: str = ""
    name: str = ""
    memory_total_bytes: int = 0
    memory_used_bytes: int = 0
    utilization_pct: float = 0.0
    ecc_uncorrected_volatile: int = 0
    ecc_corrected_volatile: int = 0
    retired_pages_pending: int = 0   # 1 when the driver has page retirements pending a reset
    lost: bool = False
    error: str = ""
    temperature_c: float = 0.0
    power_w: float = 0.0


@dataclass(frozen=True)
class GpuTelemetry:
    available: bool
    error: str = ""
    gpus: tuple[GpuStat, ...] = field(default_factory=tuple)


class _Lost(Exception):
    pass


class NvmlReader:
    """Reads the replica's GPUs. `nvml` is the pynvml module (injectable for tests)."""

    def __init__(self, nvml: ModuleType | Any | None = None) -> None:
        self._nvml = nvml
        self._init_error: str | None = None
        self._initialised = False

    def _module(self) -> Any:
        if self._nvml is None:
            self._nvml = importlib.import_module("pynvml")
        return self._nvml

    def _ensure_init(self) -> str | None:
        """nvmlInit once; returns the error text when NVML is unavailable."""
        if self._initialised or self._init_error is not None:
            return self._init_error
        try:
            nv = self._module()
        except ImportError as exc:
            self._init_error = f"pynvml not importable: {exc}"
            return self._init_error
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            self._init_error = f"{type(exc).__name__}: {exc}"
            return self._init_error
        self._initialised = True
        return None

    def read(self, indices: Sequence[int] = ()) -> GpuTelemetry:
        err = self._ensure_init()
        if err is not None:
            return GpuTelemetry(available=False, error=err)
        nv = self._module()
        try:
            wanted = list(indices) if indices else list(range(nv.nvmlDeviceGetCount()))
        except nv.NVMLError as exc:
            return GpuTelemetry(available=False, error=f"{type(exc).__name__}: {exc}")
        return GpuTelemetry(available=True, gpus=tuple(self._read_one(nv, i) for i in wanted))

    def _read_one(self, nv: Any, index: int) -> GpuStat:
        stat = GpuStat(index=index)
        errors: list[str] = []

        def call(fn: Callable[..., Any], *args: Any) -> Any:
            """None when unsupported; raises _Lost when the GPU is gone; records other errors."""
            try:
                return fn(*args)
            except nv.NVMLError_GpuIsLost:
                raise _Lost() from None
            except nv.NVMLError_NotSupported:
                return None
            except nv.NVMLError as exc:
                errors.append(f"{fn.__name__}: {exc}")
                return None

        try:
            handle = call(nv.nvmlDeviceGetHandleByIndex, index)
            if handle is None:
                stat.error = "; ".join(errors) or "no handle"
                return stat
            stat.uuid = _text(call(nv.nvmlDeviceGetUUID, handle))
            stat.name = _text(call(nv.nvmlDeviceGetName, handle))
            mem = call(nv.nvmlDeviceGetMemoryInfo, handle)
            if mem is not None:
                stat.memory_total_bytes = int(mem.total)
                stat.memory_used_bytes = int(mem.used)
            util = call(nv.nvmlDeviceGetUtilizationRates, handle)
            if util is not None:
                stat.utilization_pct = float(util.gpu)
            unc = call(
                nv.nvmlDeviceGetTotalEccErrors, handle,
                nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC,
            )
            stat.ecc_uncorrected_volatile = int(unc or 0)
            cor = call(
                nv.nvmlDeviceGetTotalEccErrors, handle,
                nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC,
            )
            stat.ecc_corrected_volatile = int(cor or 0)
            pending = call(nv.nvmlDeviceGetRetiredPagesPendingStatus, handle)
            stat.retired_pages_pending = 1 if pending == nv.NVML_FEATURE_ENABLED else 0
            temp = call(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU)
            stat.temperature_c = float(temp or 0.0)
            power_mw = call(nv.nvmlDeviceGetPowerUsage, handle)
            stat.power_w = float(power_mw or 0) / 1000.0
        except _Lost:
            stat.lost = True
            errors.append("GPU is lost")
        stat.error = "; ".join(errors)
        return stat

    def close(self) -> None:
        if self._initialised:
            nv = self._module()
            try:
                nv.nvmlShutdown()
            except nv.NVMLError:
                pass
            self._initialised = False


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)
