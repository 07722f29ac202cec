"""Simulated NVML readings and injectable GPU/engine faults of one simulated replica.

Everything here is a SIMULATION, labelled as such wherever it leaves the process (``"simulated":
true`` in every JSON answer, " (simulated)" in every GPU name). No real GPU is read.

Readings (``SimulatedGpus.read``), per GPU, derived from the profile and the engine's state:

- ``name``, ``memory_total_bytes``: the GPU kind named by the profile (``h200`` in the profile's
  name -> "NVIDIA H200", 143,771 MiB; anything else -> "NVIDIA H100 80GB HBM3", 81,559 MiB, the
  totals NVML reports for those boards).
- GPU count: ``--gpu-count``, else the profile's tensor-parallel degree (``tpN`` in its name, else 1).
  Weights and KV are split evenly over the GPUs, as tensor parallelism does.
- ``memory_used_bytes = runtime_reserve + weights / gpus + used_blocks * kv_bytes_per_block / gpus``,
  clamped to the total. ``runtime_reserve`` (2 GiB) stands for the CUDA context, CUDA graphs and
  activations. Weights and KV bytes per token come from the model named by the profile (Llama-3
  70B: 141.1 GB of BF16 weights, 320 KiB of KV per token; otherwise Llama-3 8B: 16.06 GB, 128 KiB),
  the figures profiles.yaml documents. Caveat: real vLLM pre-allocates its whole KV pool at start,
  so real NVML shows a constant; the simulation counts only blocks in use so that load is visible.
  While an ``oom`` fault is set, used = total (the memory is exhausted) and each GPU's ``error``
  reads ``OOM_ERROR`` (real NVML has no OOM signal; this is how the simulation tells the agent,
  and through it the control plane, which matches "out of memory" in GPU errors).
- ``utilization_pct``: the share of the last ``UTIL_WINDOW_S`` seconds (wall clock) in which the
  engine was running a step, like NVML's "a kernel was executing" sample. The ``instant`` profile
  has zero-length steps, so it always reads 0.
- ``temperature_c``, ``power_w``: linear in utilisation between the board's idle and loaded
  figures (no thermal lag): illustrative numbers, not a thermal model.
- ``ecc_*``, ``retired_pages_pending``, ``row_remap_failed``, ``lost``, ``xid_events``: from
  injected faults only.

Xid events behave like an NVML event set: each ``read`` returns the events queued since the
previous read and clears them (at most ``MAX_PENDING_XIDS`` per GPU are kept; older ones drop).

A lost GPU reads like NVML reports one: ``lost: true``, error "GPU is lost", every reading 0 (its
index, uuid and name stay, so that it can be identified); its queued Xid events are still returned.

Faults (``parse_fault`` validates a ``POST /sim/faults`` body; keys can be combined):
``{"xid": 79}`` or ``{"xid": [48, 94]}`` queue Xid events; ``{"ecc_uncorrected": n}`` adds n
volatile uncorrected ECC errors and sets ``retired_pages_pending`` (a page retirement or row remap
that waits for a GPU reset, as an uncorrectable error causes); ``{"ecc_corrected": n}``;
``{"gpu_lost": true|false}``; ``{"row_remap_failed": true|false}`` (the driver could not remap a
row with uncorrectable errors: Ampere and later); ``{"oom": true|false}``; ``{"health": true|false}``;
``{"crash": true}``; ``{"clear": true}``. ``"gpu": i`` picks the GPU of xid/ecc/gpu_lost/row_remap_failed/clear
(default 0; a clear without ``gpu`` clears every fault, the replica's too). Faults are independent:
a ``gpu_lost`` does not also queue an Xid 79; inject both for the full picture.
What the engine does under each fault (HTTP side) is documented in simulator.server.

Pure: no clock reads (callers pass ``now``), no I/O, no logging.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tidegate.simulator.engine import EngineStats
from tidegate.simulator.profiles import Profile

GIB = 2**30
MIB = 2**20
RUNTIME_RESERVE_BYTES = 2 * GIB
UTIL_WINDOW_S = 1.0
MAX_PENDING_XIDS = 64
MAX_XID = 1023
SIMULATED_SUFFIX = " (simulated)"
LOST_ERROR = "GPU is lost"
OOM_ERROR = "CUDA out of memory (simulated oom fault)"

FAULT_KEYS = ("xid", "ecc_uncorrected", "ecc_corrected", "gpu_lost", "row_remap_failed", "oom", "health", "crash",
              "clear", "gpu")


class FaultError(ValueError):
    """A fault request is invalid; the message says why (answered as HTTP 400)."""


@dataclass(frozen=True)
class GpuKind:
    name: str
    memory_total_bytes: int
    idle_power_w: float
    max_power_w: float
    idle_temp_c: float
    max_temp_c: float


@dataclass(frozen=True)
class ModelSize:
    weights_bytes: int
    kv_bytes_per_token: int


H100 = GpuKind("NVIDIA H100 80GB HBM3", 81_559 * MIB, 70.0, 700.0, 32.0, 68.0)
H200 = GpuKind("NVIDIA H200", 143_771 * MIB, 75.0, 700.0, 32.0, 66.0)
LLAMA3_8B = ModelSize(16_060_000_000, 128 * 1024)
LLAMA3_70B = ModelSize(141_100_000_000, 320 * 1024)


@dataclass(frozen=True)
class GpuLayout:
    """What the simulated replica's GPUs are: kind, count, and the per-GPU share of the model."""

    kind: GpuKind
    gpu_count: int
    weights_bytes_per_gpu: int
    kv_bytes_per_block_per_gpu: int

    @property
    def name(self) -> str:
        return self.kind.name + SIMULATED_SUFFIX


def default_gpu_count(profile: Profile) -> int:
    """The profile's tensor-parallel degree: ``tpN`` in its name, else 1."""
    m = re.search(r"(?:^|-)tp(\d+)(?:-|$)", profile.name)
    return int(m.group(1)) if m else 1


def layout_for(profile: Profile, gpu_count: int | None = None) -> GpuLayout:
    count = gpu_count if gpu_count is not None else default_gpu_count(profile)
    if count < 1:
        raise ValueError("gpu_count must be positive")
    kind = H200 if "h200" in profile.name.lower() else H100
    model = LLAMA3_70B if "70b" in (profile.model + " " + profile.name).lower() else LLAMA3_8B
    return GpuLayout(
        kind=kind, gpu_count=count, weights_bytes_per_gpu=model.weights_bytes // count,
        kv_bytes_per_block_per_gpu=model.kv_bytes_per_token * profile.block_size // count,
    )


@dataclass
class GpuFaults:
    xids: deque[int] = field(default_factory=lambda: deque(maxlen=MAX_PENDING_XIDS))
    ecc_uncorrected: int = 0
    ecc_corrected: int = 0
    retired_pages_pending: int = 0
    row_remap_failed: bool = False
    lost: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"pending_xid_events": list(self.xids), "ecc_uncorrected_volatile": self.ecc_uncorrected,
                "ecc_corrected_volatile": self.ecc_corrected,
                "retired_pages_pending": self.retired_pages_pending, "row_remap_failed": self.row_remap_failed,
                "lost": self.lost}


@dataclass(frozen=True)
class Fault:
    """One validated POST /sim/faults body. None means "leave as is"."""

    gpu: int | None = None
    xids: tuple[int, ...] = ()
    ecc_uncorrected: int = 0
    ecc_corrected: int = 0
    gpu_lost: bool | None = None
    oom: bool | None = None
    health: bool | None = None
    crash: bool = False
    clear: bool = False
    row_remap_failed: bool | None = None


def _count(body: dict[str, Any], key: str) -> int:
    v = body.get(key, 0)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise FaultError(f"'{key}' must be a non-negative integer")
    return v


def _flag(body: dict[str, Any], key: str) -> bool | None:
    v = body.get(key)
    if v is not None and not isinstance(v, bool):
        raise FaultError(f"'{key}' must be true or false")
    return v


def parse_fault(body: Any, gpu_count: int) -> Fault:
    """Validate a POST /sim/faults body (already JSON-decoded); raises FaultError."""
    if not isinstance(body, dict) or not body:
        raise FaultError("body must be a non-empty JSON object with keys " + ", ".join(FAULT_KEYS))
    unknown = sorted(set(body) - set(FAULT_KEYS))
    if unknown:
        raise FaultError(f"unknown keys {unknown}; valid keys: {', '.join(FAULT_KEYS)}")
    gpu = body.get("gpu")
    if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < gpu_count):
        raise FaultError(f"'gpu' must be a GPU index in 0..{gpu_count - 1}")
    raw_xid = body.get("xid", [])
    xids = raw_xid if isinstance(raw_xid, list) else [raw_xid]
    if any(isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= MAX_XID for x in xids):
        raise FaultError(f"'xid' must be an Xid code (1..{MAX_XID}) or a list of them")
    crash, clear = _flag(body, "crash"), _flag(body, "clear")
    if crash is False or clear is False:
        raise FaultError("'crash' and 'clear' only take true")
    if clear and len(set(body) - {"clear", "gpu"}) > 0:
        raise FaultError("'clear' cannot be combined with other faults")
    return Fault(
        gpu=gpu, xids=tuple(xids), ecc_uncorrected=_count(body, "ecc_uncorrected"),
        ecc_corrected=_count(body, "ecc_corrected"), gpu_lost=_flag(body, "gpu_lost"), oom=_flag(body, "oom"),
        health=_flag(body, "health"), crash=bool(crash), clear=bool(clear),
        row_remap_failed=_flag(body, "row_remap_failed"),
    )


@dataclass
class FaultState:
    """Injected faults: per GPU (Xid queue, ECC, lost) and of the replica (oom)."""

    gpu_count: int
    gpus: list[GpuFaults] = field(init=False)
    oom: bool = False

    def __post_init__(self) -> None:
        self.gpus = [GpuFaults() for _ in range(self.gpu_count)]

    @property
    def any_lost(self) -> bool:
        return any(g.lost for g in self.gpus)

    def apply(self, fault: Fault) -> None:
        """Apply the GPU and oom parts of a fault (health and crash belong to the server)."""
        if fault.clear:
            if fault.gpu is None:
                self.gpus = [GpuFaults() for _ in range(self.gpu_count)]
                self.oom = False
            else:
                self.gpus[fault.gpu] = GpuFaults()
            return
        g = self.gpus[fault.gpu or 0]
        g.xids.extend(fault.xids)
        if fault.ecc_uncorrected:
            g.ecc_uncorrected += fault.ecc_uncorrected
            g.retired_pages_pending = 1
        g.ecc_corrected += fault.ecc_corrected
        if fault.gpu_lost is not None:
            g.lost = fault.gpu_lost
        if fault.row_remap_failed is not None:
            g.row_remap_failed = fault.row_remap_failed
        if fault.oom is not None:
            self.oom = fault.oom

    def take_xids(self, index: int) -> list[int]:
        """The Xid events queued for a GPU since the last call, which clears them."""
        q = self.gpus[index].xids
        out = list(q)
        q.clear()
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"oom": self.oom, "gpus": [{"index": i, **g.as_dict()} for i, g in enumerate(self.gpus)]}


class BusyWindow:
    """Wall-clock intervals in which the engine ran a step, kept for the last ``window_s`` seconds."""

    def __init__(self, window_s: float = UTIL_WINDOW_S) -> None:
        self.window_s = window_s
        self._spans: deque[tuple[float, float]] = deque()

    def record(self, start: float, end: float) -> None:
        if end > start:
            self._spans.append((start, end))

    def fraction(self, now: float) -> float:
        lo = now - self.window_s
        while self._spans and self._spans[0][1] <= lo:
            self._spans.popleft()
        busy = sum(max(0.0, min(e, now) - max(s, lo)) for s, e in self._spans)
        return min(1.0, busy / self.window_s)


class SimulatedGpus:
    """The simulated GPUs of one replica: layout, identities, injected faults and busy time."""

    def __init__(self, layout: GpuLayout, uuids: Sequence[str]) -> None:
        if len(uuids) != layout.gpu_count:
            raise ValueError("need one uuid per GPU")
        self.layout = layout
        self.uuids = tuple(uuids)
        self.faults = FaultState(layout.gpu_count)
        self.busy = BusyWindow()

    def read(self, now: float, stats: EngineStats) -> dict[str, Any]:
        """The GET /sim/gpu answer; consumes the queued Xid events."""
        lay, kind = self.layout, self.layout.kind
        util = self.busy.fraction(now)
        used = RUNTIME_RESERVE_BYTES + lay.weights_bytes_per_gpu + stats.used_blocks * lay.kv_bytes_per_block_per_gpu
        if self.faults.oom:
            used = kind.memory_total_bytes
        gpus = []
        for i, f in enumerate(self.faults.gpus):
            g: dict[str, Any] = {
                "index": i, "uuid": self.uuids[i], "name": lay.name,
                "memory_total_bytes": kind.memory_total_bytes,
                "memory_used_bytes": min(used, kind.memory_total_bytes),
                "utilization_pct": round(100.0 * util, 1),
                "ecc_uncorrected_volatile": f.ecc_uncorrected, "ecc_corrected_volatile": f.ecc_corrected,
                "retired_pages_pending": f.retired_pages_pending, "row_remap_failed": f.row_remap_failed,
                "lost": False,
                "error": OOM_ERROR if self.faults.oom else "",
                "temperature_c": round(kind.idle_temp_c + (kind.max_temp_c - kind.idle_temp_c) * util, 1),
                "power_w": round(kind.idle_power_w + (kind.max_power_w - kind.idle_power_w) * util, 1),
                "xid_events": self.faults.take_xids(i),
            }
            if f.lost:
                for k in ("memory_total_bytes", "memory_used_bytes", "ecc_uncorrected_volatile",
                          "ecc_corrected_volatile", "retired_pages_pending"):
                    g[k] = 0
                g.update(utilization_pct=0.0, temperature_c=0.0, power_w=0.0, lost=True, error=LOST_ERROR,
                         row_remap_failed=False)
            gpus.append(g)
        return {"simulated": True, "gpus": gpus}

    def oom_message(self) -> str:
        """The error text of a request refused under an oom fault (PyTorch's wording)."""
        total_gib = self.layout.kind.memory_total_bytes / GIB
        return (f"CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                f"{math.floor(total_gib * 100) / 100:.2f} GiB of which 0 bytes is free. (simulated oom fault)")
