"""GPU telemetry from NVML (pynvml, from the nvidia-ml-py package).

Without an NVIDIA driver `nvmlInit` raises (NVMLError_LibraryNotFound, DriverNotLoaded, ...):
the reader then reports `available=False` with the error text and no GPUs. Numbers are never
invented. Per-GPU counters a board does not support (ECC on consumer cards, retired pages)
stay 0; a GPU the driver reports lost is marked `lost=True`.

Critical Xid errors: the first read of a device registers it for
`nvmlEventTypeXidCriticalError` events in an event set of its own (`nvmlEventSetCreate`,
`nvmlDeviceRegisterEvents`); every read then drains that set with `nvmlEventSetWait(set, 0)` until
NVML answers NVML_ERROR_TIMEOUT, and reports each event's `eventData` (the Xid code) in
`xid_events`, so each event is reported once. Events that happened before registration are not
seen (NVML does not replay them). A device or driver that does not support events is remembered
and not asked again; its `xid_events` stay empty.

Blocking calls: run `read` in a thread, or `await aread(...)`, which does (a daemon thread).
One lock serialises `read` and `close`: a cancelled `aread` leaves its thread running, and a
`close` (nvmlEventSetFree, nvmlShutdown) under a read in flight would free what the read is
using (a process on a real H200 once died of a segmentation fault in these tests; this was the
one unsynchronised path); two reads at once would also register a device's event set twice.

A wedged GPU or driver can make an NVML call hang for minutes. The lock is therefore taken with
a bound: a read that finds the previous one still inside NVML after `busy_timeout_s` (a read
takes ~0.5 ms on an H200, so the lock is never held that long but by a hung call) reports
`available=False` ("NVML busy") instead of queueing one more thread behind it, and
`close` gives up after `close_timeout_s` without shutting NVML down (the process is exiting;
the driver cleans up after it), so SIGTERM still ends the agent. The collector bounds `aread`
too (agent.collector), so the engine's figures keep flowing while NVML hangs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import threading
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
    # 1 when a page retirement (before Ampere) or a row remapping (Ampere and later) waits for a
    # GPU reset to take effect
    retired_pages_pending: int = 0
    lost: bool = False
    error: str = ""
    temperature_c: float = 0.0
    power_w: float = 0.0
    xid_events: list[int] = field(default_factory=list)  # critical Xid codes since the previous read
    row_remap_failed: bool = False   # the driver could not remap a row (Ampere and later)


@dataclass(frozen=True)
class GpuTelemetry:
    available: bool
    error: str = ""
    gpus: tuple[GpuStat, ...] = field(default_factory=tuple)
    busy: bool = False   # not read: the previous read is still inside NVML


class _Lost(Exception):
    pass


MAX_EVENTS_PER_READ = 256  # a bound on one drain, in case the driver keeps answering
_UNSUPPORTED = object()  # event registration not supported on this device: do not ask again


class NvmlReader:
    """Reads the replica's GPUs. `nvml` is the pynvml module (injectable for tests)."""

    simulated = False  # agent.collector.GpuSource

    def __init__(self, nvml: ModuleType | Any | None = None, busy_timeout_s: float = 0.1,
                 close_timeout_s: float = 5.0) -> None:
        self._nvml = nvml
        self._busy_timeout_s = busy_timeout_s
        self._close_timeout_s = close_timeout_s
        self._init_error: str | None = None
        self._initialised = False
        self._event_sets: dict[int, Any] = {}  # index -> its Xid event set, or _UNSUPPORTED
        self._lock = threading.Lock()  # read and close, see the module's docstring

    async def aread(self, indices: Sequence[int] = ()) -> GpuTelemetry:
        """`read` in a daemon thread of its own, not the loop's executor: a read hung in the driver
        would otherwise keep the process from exiting (the executor's threads are joined at exit).
        asyncio.wrap_future carries the answer (or the exception) back to the loop thread-safely,
        and drops it when the awaiting task was cancelled (the collector's bound) or the loop closed."""
        answer: concurrent.futures.Future[GpuTelemetry] = concurrent.futures.Future()

        def work() -> None:
            if not answer.set_running_or_notify_cancel():
                return  # cancelled before the thread ran: nothing to read for
            try:
                answer.set_result(self.read(indices))
            except Exception as exc:  # handed to the awaiting task, as to_thread would
                answer.set_exception(exc)

        threading.Thread(target=work, name="nvml-read", daemon=True).start()
        return await asyncio.wrap_future(answer)

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
        if not self._lock.acquire(timeout=self._busy_timeout_s):
            return GpuTelemetry(available=False, error="NVML busy: the previous read has not returned "
                                f"after {self._busy_timeout_s:g} s (hung GPU or driver?)", busy=True)
        try:
            return self._read(indices)
        finally:
            self._lock.release()

    def _read(self, indices: Sequence[int]) -> GpuTelemetry:
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
            # Ampere and later replace page retirement with row remapping (NotSupported before):
            # (correctable rows, uncorrectable rows, remap pending a reset, remap failed).
            remap = call(nv.nvmlDeviceGetRemappedRows, handle)
            if remap is not None:
                _, _, remap_pending, remap_failed = remap
                stat.retired_pages_pending = 1 if stat.retired_pages_pending or remap_pending else 0
                stat.row_remap_failed = bool(remap_failed)
            temp = call(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU)
            stat.temperature_c = float(temp or 0.0)
            power_mw = call(nv.nvmlDeviceGetPowerUsage, handle)
            stat.power_w = float(power_mw or 0) / 1000.0
            if index not in self._event_sets:
                self._event_sets[index] = self._register_xid_events(nv, handle, call)
        except _Lost:
            stat.lost = True
            errors.append("GPU is lost")
        # Drained even when the GPU is lost: the set outlives the device's other queries.
        stat.xid_events = self._drain_xid_events(nv, index, errors)
        stat.error = "; ".join(errors)
        return stat

    def _register_xid_events(self, nv: Any, handle: Any, call: Callable[..., Any]) -> Any:
        """The device's new Xid event set, or _UNSUPPORTED (raises _Lost when the GPU is gone)."""
        event_set = call(nv.nvmlEventSetCreate)
        if event_set is None:
            return _UNSUPPORTED
        try:
            nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, event_set)
        except nv.NVMLError as exc:
            self._free_event_set(nv, event_set)
            if isinstance(exc, nv.NVMLError_GpuIsLost):
                raise _Lost() from None
            return _UNSUPPORTED  # NotSupported, or a driver that refuses: GPU readings still work
        return event_set

    def _drain_xid_events(self, nv: Any, index: int, errors: list[str]) -> list[int]:
        event_set = self._event_sets.get(index)
        if event_set is None or event_set is _UNSUPPORTED:
            return []
        xids: list[int] = []
        for _ in range(MAX_EVENTS_PER_READ):
            try:
                data = nv.nvmlEventSetWait(event_set, 0)
            except nv.NVMLError_Timeout:
                break
            except nv.NVMLError as exc:
                errors.append(f"nvmlEventSetWait: {exc}")
                break
            if int(data.eventType) & nv.nvmlEventTypeXidCriticalError:
                xids.append(int(data.eventData))
        return xids

    def xid_event_support(self) -> dict[int, bool]:
        """Per GPU index read so far: whether its Xid event registration succeeded."""
        return {i: s is not _UNSUPPORTED for i, s in self._event_sets.items()}

    @staticmethod
    def _free_event_set(nv: Any, event_set: Any) -> None:
        try:
            nv.nvmlEventSetFree(event_set)
        except nv.NVMLError:
            pass

    def close(self) -> bool:
        """Frees the event sets and shuts NVML down; False when a read still inside NVML kept it
        from doing so within `close_timeout_s` (then nothing is freed: see the module docstring)."""
        if not self._lock.acquire(timeout=self._close_timeout_s):
            return False
        try:
            self._close()
        finally:
            self._lock.release()
        return True

    def _close(self) -> None:
        if self._initialised:
            nv = self._module()
            for event_set in self._event_sets.values():
                if event_set is not _UNSUPPORTED:
                    self._free_event_set(nv, event_set)
            self._event_sets.clear()
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
