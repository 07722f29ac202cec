"""GPU telemetry from the Tidegate simulator's simulated-NVML endpoint (`--gpu-source sim`).

Reads ``GET {engine_url}/sim/gpu`` (simulator.server): the simulator's labelled simulation of
what NvmlReader reads from a real driver, Xid events included (each GET returns and clears the
events queued since the previous one, so each is reported once). Reports built from it carry
``simulated_gpu = true``. An answer that is not labelled ``"simulated": true`` is refused: this
source must never pass real-looking numbers off as real, nor simulated ones as real.

Errors (engine unreachable, no /sim/gpu, malformed answer) give ``available=False`` and the
error, like an NVML without a driver; numbers are never invented.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aiohttp

from tidegate.agent.nvml import GpuStat, GpuTelemetry

_INT_FIELDS = ("memory_total_bytes", "memory_used_bytes", "ecc_uncorrected_volatile", "ecc_corrected_volatile",
               "retired_pages_pending")
_FLOAT_FIELDS = ("utilization_pct", "temperature_c", "power_w")


class SimGpuFormatError(ValueError):
    pass


def _int(v: Any, key: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise SimGpuFormatError(f"{key} must be a non-negative integer")
    return v


def parse_sim_gpu(body: Any) -> tuple[GpuStat, ...]:
    """GpuStats from a GET /sim/gpu answer; raises SimGpuFormatError."""
    if not isinstance(body, dict) or body.get("simulated") is not True:
        raise SimGpuFormatError('answer is not labelled "simulated": true')
    raw = body.get("gpus")
    if not isinstance(raw, list):
        raise SimGpuFormatError("gpus must be a list")
    out = []
    for g in raw:
        if not isinstance(g, dict):
            raise SimGpuFormatError("each GPU must be an object")
        stat = GpuStat(index=_int(g.get("index"), "index"), uuid=str(g.get("uuid", "")),
                       name=str(g.get("name", "")), lost=g.get("lost") is True, error=str(g.get("error", "")),
                       row_remap_failed=g.get("row_remap_failed") is True)
        for key in _INT_FIELDS:
            setattr(stat, key, _int(g.get(key, 0), key))
        for key in _FLOAT_FIELDS:
            v = g.get(key, 0.0)
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise SimGpuFormatError(f"{key} must be a number")
            setattr(stat, key, float(v))
        xids = g.get("xid_events", [])
        if not isinstance(xids, list):
            raise SimGpuFormatError("xid_events must be a list")
        stat.xid_events = [_int(x, "xid_events[]") for x in xids]
        out.append(stat)
    return tuple(out)


class SimulatedGpuReader:
    """The collector's GPU source for a simulated engine (agent.collector.GpuSource)."""

    simulated = True

    def __init__(self, engine_url: str, session: aiohttp.ClientSession, *, timeout_s: float = 2.0) -> None:
        self._url = engine_url.rstrip("/") + "/sim/gpu"
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def aread(self, indices: Sequence[int] = ()) -> GpuTelemetry:
        try:
            async with self._session.get(self._url, timeout=self._timeout) as resp:
                if resp.status != 200:
                    return GpuTelemetry(available=False, error=f"simulated GPU: GET /sim/gpu: HTTP {resp.status}")
                body = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            return GpuTelemetry(available=False, error=f"simulated GPU: {type(exc).__name__}: {exc}".rstrip(": "))
        try:
            gpus = parse_sim_gpu(body)
        except SimGpuFormatError as exc:
            return GpuTelemetry(available=False, error=f"simulated GPU: {exc}")
        if indices:
            wanted = set(indices)
            gpus = tuple(g for g in gpus if g.index in wanted)
        return GpuTelemetry(available=True, gpus=gpus)

    def close(self) -> None:
        """Nothing to release: the session belongs to the caller."""
