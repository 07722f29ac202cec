"""agent.nvml: NvmlReader with a fake pynvml module, and with the real one (no driver here).

Also agent.simgpu.SimulatedGpuReader against a real aiohttp server on 127.0.0.1.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass, field

import aiohttp
import pynvml
import pytest
from aiohttp import web

from tidegate.agent.nvml import GpuStat, GpuTelemetry, NvmlReader
from tidegate.agent.simgpu import SimulatedGpuReader


class FakeNvmlError(Exception):
    pass


class FakeNotSupported(FakeNvmlError):
    pass


class FakeGpuIsLost(FakeNvmlError):
    pass


class FakeUnknown(FakeNvmlError):
    pass


class FakeTimeout(FakeNvmlError):
    pass


@dataclass
class FakeEventData:
    device: object
    eventType: int
    eventData: int
    gpuInstanceId: int = 0
    computeInstanceId: int = 0


@dataclass
class FakeEventSet:
    devices: list = field(default_factory=list)  # registered FakeGpus
    freed: bool = False


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
    # Row remapping (correctable, uncorrectable, pending, failed); None = not supported (pre-Ampere)
    remap: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    temp: int = 55
    power_mw: int = 250_000
    lost: bool = False
    events_supported: bool = True
    xids: deque[int] = field(default_factory=deque)  # critical Xid events the driver has not delivered


class FakeNvml:
    """Stands in for the pynvml module: the functions and constants NvmlReader uses."""

    NVMLError = FakeNvmlError
    NVMLError_NotSupported = FakeNotSupported
    NVMLError_GpuIsLost = FakeGpuIsLost
    NVMLError_Timeout = FakeTimeout
    nvmlEventTypeXidCriticalError = 0x8
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
        self.event_sets: list[FakeEventSet] = []
        self.register_calls = 0

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

    def nvmlDeviceGetRemappedRows(self, h: FakeGpu) -> tuple[int, int, int, int]:
        g = self._alive(h)
        if g.remap is None:
            raise FakeNotSupported("Not Supported")
        return g.remap

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        return self._alive(h).temp

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        return self._alive(h).power_mw

    def nvmlEventSetCreate(self) -> FakeEventSet:
        s = FakeEventSet()
        self.event_sets.append(s)
        return s

    def nvmlEventSetFree(self, s: FakeEventSet) -> None:
        s.freed = True

    def nvmlDeviceRegisterEvents(self, h: FakeGpu, types: int, s: FakeEventSet) -> None:
        self.register_calls += 1
        g = self._alive(h)
        if not g.events_supported:
            raise FakeNotSupported("Not Supported")
        assert types == self.nvmlEventTypeXidCriticalError
        s.devices.append(g)

    def nvmlEventSetWait(self, s: FakeEventSet, timeout_ms: int) -> FakeEventData:
        # Like the driver: events are delivered even after the GPU is lost; none pending -> timeout.
        assert timeout_ms == 0 and not s.freed
        for g in s.devices:
            if g.xids:
                return FakeEventData(device=g, eventType=self.nvmlEventTypeXidCriticalError,
                                     eventData=g.xids.popleft())
        raise FakeTimeout("Timeout")


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


@pytest.mark.parametrize(("remap", "pages", "pending", "failed"), [
    pytest.param((0, 0, 0, 0), 0, 0, False, id="Hopper, healthy"),
    pytest.param((3, 1, 1, 0), 0, 1, False, id="a remap waits for a reset"),
    pytest.param((3, 1, 0, 1), 0, 0, True, id="remapping failed"),
    pytest.param(None, 1, 1, False, id="pre-Ampere: page retirement pending"),
    pytest.param(None, 0, 0, False, id="pre-Ampere: nothing pending"),
])
def test_row_remapping_and_page_retirement(remap, pages, pending, failed) -> None:
    g = NvmlReader(FakeNvml([FakeGpu("GPU-a", "x", remap=remap, pending=pages)])).read().gpus[0]
    assert (g.retired_pages_pending, g.row_remap_failed, g.error) == (pending, failed, "")


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
            assert t.gpus
            for g in t.gpus:
                assert g.memory_total_bytes > 0 and not g.lost
                assert 0 < g.memory_used_bytes <= g.memory_total_bytes  # the driver holds some
                assert g.uuid.startswith("GPU-") and g.name
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




# ------------------------------------------------------------------ Xid events


def test_xid_events_are_reported_once_per_device() -> None:
    a, b = FakeGpu("GPU-a", "x"), FakeGpu("GPU-b", "y")
    nv = FakeNvml([a, b])
    reader = NvmlReader(nv)
    assert [g.xid_events for g in reader.read().gpus] == [[], []]  # registers; nothing yet
    a.xids.extend([79, 48])
    b.xids.append(94)
    assert [g.xid_events for g in reader.read().gpus] == [[79, 48], [94]]
    assert [g.xid_events for g in reader.read().gpus] == [[], []]  # drained: not reported twice
    assert nv.register_calls == 2  # once per device, not once per read
    assert reader.xid_event_support() == {0: True, 1: True}
    reader.close()
    assert all(s.freed for s in nv.event_sets) and nv.shutdown_calls == 1


def test_xid_events_of_a_gpu_that_is_then_lost_still_arrive() -> None:
    g = FakeGpu("GPU-a", "x")
    nv = FakeNvml([g])
    reader = NvmlReader(nv)
    reader.read()
    g.xids.append(79)
    g.lost = True
    stat = reader.read().gpus[0]
    assert stat.lost and stat.xid_events == [79]


def test_events_not_supported_is_tolerated_and_not_retried() -> None:
    nv = FakeNvml([FakeGpu("GPU-a", "x", events_supported=False)])
    reader = NvmlReader(nv)
    for _ in range(3):
        g = reader.read().gpus[0]
        assert g.xid_events == [] and g.error == "" and g.memory_total_bytes == 80 * 2**30
    assert nv.register_calls == 1
    assert nv.event_sets[0].freed  # the unused set is released at once
    assert reader.xid_event_support() == {0: False}


def test_lost_before_registration_registers_later() -> None:
    g = FakeGpu("GPU-a", "x", lost=True)
    nv = FakeNvml([g])
    reader = NvmlReader(nv)
    assert reader.read().gpus[0].lost
    g.lost = False  # e.g. after a reset
    reader.read()
    g.xids.append(31)
    assert reader.read().gpus[0].xid_events == [31]


def test_wait_error_is_recorded_and_readings_kept() -> None:
    class WaitFails(FakeNvml):
        def nvmlEventSetWait(self, s: FakeEventSet, timeout_ms: int) -> FakeEventData:
            raise FakeUnknown("Unknown Error")

    g = NvmlReader(WaitFails([FakeGpu("GPU-a", "x")])).read().gpus[0]
    assert "nvmlEventSetWait" in g.error and g.xid_events == [] and g.utilization_pct == 42.0


# ------------------------------------------------------------------ SimulatedGpuReader

SIM_GPU = {
    "index": 0, "uuid": "GPU-sim-0", "name": "NVIDIA H100 80GB HBM3 (simulated)",
    "memory_total_bytes": 85520809984, "memory_used_bytes": 20_000_000_000, "utilization_pct": 37.5,
    "ecc_uncorrected_volatile": 2, "ecc_corrected_volatile": 0, "retired_pages_pending": 1, "lost": False,
    "error": "", "temperature_c": 45.5, "power_w": 300.0, "xid_events": [79],
}


@pytest.fixture
async def sim_gpu_server():
    """A real HTTP server answering GET /sim/gpu with whatever the test puts in `answer`."""
    state: dict = {"status": 200, "body": {"simulated": True, "gpus": [SIM_GPU]}, "gets": 0}

    async def handle(request: web.Request) -> web.Response:
        state["gets"] += 1
        return web.json_response(state["body"], status=state["status"])

    app = web.Application()
    app.router.add_get("/sim/gpu", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    async with aiohttp.ClientSession() as session:
        yield state, f"http://127.0.0.1:{port}/", session
    await runner.cleanup()


async def test_sim_reader_parses_labelled_answer(sim_gpu_server) -> None:
    state, url, session = sim_gpu_server
    reader = SimulatedGpuReader(url, session)
    assert reader.simulated
    t = await reader.aread()
    assert t.available and t.error == ""
    assert t.gpus == (GpuStat(
        index=0, uuid="GPU-sim-0", name="NVIDIA H100 80GB HBM3 (simulated)", memory_total_bytes=85520809984,
        memory_used_bytes=20_000_000_000, utilization_pct=37.5, ecc_uncorrected_volatile=2,
        ecc_corrected_volatile=0, retired_pages_pending=1, lost=False, error="", temperature_c=45.5,
        power_w=300.0, xid_events=[79],
    ),)
    assert state["gets"] == 1


async def test_sim_reader_filters_indices(sim_gpu_server) -> None:
    state, url, session = sim_gpu_server
    state["body"] = {"simulated": True, "gpus": [SIM_GPU, {**SIM_GPU, "index": 1, "lost": True, "xid_events": []}]}
    t = await SimulatedGpuReader(url, session).aread([1])
    assert [(g.index, g.lost) for g in t.gpus] == [(1, True)]


@pytest.mark.parametrize(("status", "body", "needle"), [
    (404, {"error": "nope"}, "HTTP 404"),
    (200, {"gpus": [SIM_GPU]}, "not labelled"),  # unlabelled numbers are refused
    (200, {"simulated": False, "gpus": [SIM_GPU]}, "not labelled"),
    (200, {"simulated": True, "gpus": [{**SIM_GPU, "memory_used_bytes": -1}]}, "memory_used_bytes"),
    (200, {"simulated": True, "gpus": [{**SIM_GPU, "xid_events": 79}]}, "xid_events"),
    (200, {"simulated": True, "gpus": "x"}, "gpus must be a list"),
], ids=["404", "unlabelled", "labelled-false", "negative", "xid-not-list", "gpus-not-list"])
async def test_sim_reader_errors_are_unavailable(sim_gpu_server, status, body, needle) -> None:
    state, url, session = sim_gpu_server
    state["status"], state["body"] = status, body
    t = await SimulatedGpuReader(url, session).aread()
    assert not t.available and t.gpus == () and needle in t.error


async def test_sim_reader_unreachable_engine() -> None:
    with socket.socket() as sock:  # a port that was free a moment ago and has no listener now
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with aiohttp.ClientSession() as session:
        t = await SimulatedGpuReader(f"http://127.0.0.1:{port}", session, timeout_s=2.0).aread()
    assert not t.available and "simulated GPU" in t.error and "ClientConnectorError" in t.error


# ------------------------------------------------------------------ threads


def test_close_waits_for_a_read_in_flight() -> None:
    """A cancelled `aread` leaves its worker thread reading; `close` must not free the event sets
    or shut NVML down under it (on a real driver that is a segmentation fault)."""
    inside, release = threading.Event(), threading.Event()

    class SlowMemory(FakeNvml):
        slow = False

        def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> FakeMem:
            if self.slow:
                inside.set()
                assert release.wait(5)
            return super().nvmlDeviceGetMemoryInfo(h)

    nv = SlowMemory([FakeGpu("GPU-a", "x")])
    reader = NvmlReader(nv)
    reader.read()  # registers the event set; the next read blocks in the memory query
    nv.slow = True
    readings: list[GpuTelemetry] = []
    reading = threading.Thread(target=lambda: readings.append(reader.read()))
    reading.start()
    assert inside.wait(5)
    closing = threading.Thread(target=reader.close)
    closing.start()
    closing.join(0.2)
    assert closing.is_alive()  # waiting for the read
    assert nv.shutdown_calls == 0 and not nv.event_sets[0].freed
    release.set()
    reading.join(5)
    closing.join(5)
    assert readings[0].available and readings[0].gpus[0].error == ""
    assert nv.shutdown_calls == 1 and nv.event_sets[0].freed


class HangingMemory(FakeNvml):
    """A wedged driver: the memory query blocks until `release` is set (the test's teardown)."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        super().__init__(gpus)
        self.hang, self.inside, self.release = False, threading.Event(), threading.Event()

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> FakeMem:
        if self.hang:
            self.inside.set()
            self.release.wait(30)
        return super().nvmlDeviceGetMemoryInfo(h)


def test_a_read_behind_a_hung_one_answers_busy_and_close_gives_up() -> None:
    nv = HangingMemory([FakeGpu("GPU-a", "x")])
    reader = NvmlReader(nv, busy_timeout_s=0.05, close_timeout_s=0.05)
    reader.read()
    nv.hang = True
    stuck = threading.Thread(target=reader.read, daemon=True)
    stuck.start()
    try:
        assert nv.inside.wait(5)
        t = reader.read()
        assert not t.available and t.gpus == () and "NVML busy" in t.error and t.busy
        assert reader.close() is False  # not under the hung read: nothing freed, no shutdown
        assert nv.shutdown_calls == 0 and not nv.event_sets[0].freed
    finally:
        nv.hang = False
        nv.release.set()
        stuck.join(5)
    assert reader.read().available  # the driver answered: reads work again
    assert reader.close() is True and nv.shutdown_calls == 1


async def test_aread_hands_back_results_and_errors() -> None:
    reader = NvmlReader(FakeNvml([FakeGpu("GPU-a", "x")]))
    assert (await reader.aread()).gpus[0].uuid == "GPU-a"

    class Broken(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            raise RuntimeError("driver bug")

    with pytest.raises(RuntimeError, match="driver bug"):
        await NvmlReader(Broken([])).aread()


HUNG_EXIT = """
import asyncio, threading
from tidegate.agent.nvml import NvmlReader

class Hung:
    class NVMLError(Exception):
        pass
    def nvmlInit(self):
        pass
    def nvmlDeviceGetCount(self):
        threading.Event().wait()  # never returns

async def main():
    try:
        await asyncio.wait_for(NvmlReader(Hung()).aread(), 0.2)
    except TimeoutError:
        print("timed out", flush=True)

asyncio.run(main())
"""


def test_a_hung_read_does_not_keep_the_process_from_exiting(tmp_path) -> None:
    """The read runs in a daemon thread of its own: asyncio.run's executor shutdown and the
    interpreter's exit would wait forever for a thread of the loop's executor stuck in NVML."""
    out = subprocess.run([sys.executable, "-c", HUNG_EXIT], capture_output=True, text=True, timeout=30,
                         cwd=tmp_path)  # the installed package, not the source tree's folders
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "timed out"
