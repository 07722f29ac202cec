"""Check a GPU node's NVML path the way the Tidegate agent reads it (tidegate.agent.nvml).

Run it on a GPU machine before deploying the agent there (or after a driver upgrade):

    python scripts/nvml_check.py --alloc-gib 16 --json nvml.json

It reads every GPU through the agent's own `NvmlReader`, then checks what the control plane
relies on:
- NVML initialises and lists at least one GPU; each has a `GPU-` UUID, a name, 0 < used <= total
  memory, is not lost and has no failed row remapping (a remap or page retirement waiting for a
  reset only warns). Per-field errors (a query the board refuses) are listed as warnings.
- Xid event registration: whether each GPU accepts it (some virtualised GPUs do not; the agent
  then reports no Xid events, and says so here).
- Memory follows allocations: with `--alloc-gib N` (needs PyTorch or CuPy with CUDA), N GiB are
  allocated on the first GPU read; used memory must rise by at least 90 % of N, then fall back
  after the memory is freed.
- The cost of one read (the agent reads once per report, in a worker thread): median and max of
  `--reads` reads, and one read through `aread` from an event loop.

Exit status: 0 when every check passes, 1 when one fails, 2 when NVML is unavailable (no driver:
the agent then reports `gpu_telemetry_available=false` with this same error text).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from tidegate.agent.nvml import GpuTelemetry, NvmlReader

GIB = 2**30


def _allocator(gib: float, index: int) -> tuple[str, Callable[[], None]] | None:
    """(library, free) after allocating and touching `gib` GiB on GPU `index`; None without one."""
    n = int(gib * GIB)
    try:
        import torch

        if torch.cuda.is_available():
            buf = torch.empty(n, dtype=torch.uint8, device=f"cuda:{index}")
            buf.fill_(1)
            torch.cuda.synchronize(index)
            holder: list[Any] = [buf]

            def free_torch() -> None:
                holder.clear()
                torch.cuda.empty_cache()  # the caching allocator keeps blocks otherwise
                torch.cuda.synchronize(index)

            return "torch", free_torch
    except ImportError:
        pass
    try:
        import cupy

        with cupy.cuda.Device(index):
            arr = cupy.ones(n, dtype=cupy.uint8)
            cupy.cuda.runtime.deviceSynchronize()
        held: list[Any] = [arr]

        def free_cupy() -> None:
            held.clear()
            cupy.get_default_memory_pool().free_all_blocks()

        return "cupy", free_cupy
    except ImportError:
        return None


def _used(reader: NvmlReader, index: int) -> int:
    t = reader.read([index])
    return t.gpus[0].memory_used_bytes if t.available and t.gpus else 0


def _settled_used(reader: NvmlReader, index: int, want: Callable[[int], bool], timeout_s: float = 5.0) -> int:
    """Used bytes once `want(used)` holds, or the last reading after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    used = _used(reader, index)
    while not want(used) and time.monotonic() < deadline:
        time.sleep(0.1)
        used = _used(reader, index)
    return used


Allocator = Callable[[float, int], "tuple[str, Callable[[], None]] | None"]


def run(
    args: argparse.Namespace, reader: NvmlReader | None = None, allocate: Allocator = _allocator,
) -> tuple[int, dict[str, Any]]:
    """(exit status, result); `reader` and `allocate` are injectable for tests."""
    reader = reader or NvmlReader()
    result: dict[str, Any] = {"checks": [], "warnings": []}
    failures = 0

    def check(name: str, ok: bool, detail: str) -> None:
        nonlocal failures
        failures += not ok
        result["checks"].append({"check": name, "ok": ok, "detail": detail})

    try:
        first: GpuTelemetry = reader.read()
        result["available"] = first.available
        result["error"] = first.error
        result["gpus"] = [asdict(g) for g in first.gpus]
        if not first.available:
            return 2, result
        check("gpus listed", bool(first.gpus), f"{len(first.gpus)} GPU(s)")
        for g in first.gpus:
            ok = (g.uuid.startswith("GPU-") and bool(g.name) and not g.lost and not g.row_remap_failed
                  and 0 < g.memory_used_bytes <= g.memory_total_bytes)
            check(f"gpu {g.index} readings", ok,
                  f"{g.name} {g.uuid} used {g.memory_used_bytes / GIB:.2f} of "
                  f"{g.memory_total_bytes / GIB:.2f} GiB, util {g.utilization_pct:.0f} %, "
                  f"{g.temperature_c:.0f} C, {g.power_w:.0f} W, lost={g.lost}, "
                  f"uncorrectable ECC {g.ecc_uncorrected_volatile}, row remap failed={g.row_remap_failed}")
            if g.retired_pages_pending:
                result["warnings"].append(f"gpu {g.index}: a page retirement or row remap waits for a GPU reset")
            if g.error:
                result["warnings"].append(f"gpu {g.index}: {g.error}")
        support = reader.xid_event_support()
        result["xid_event_support"] = {str(i): s for i, s in support.items()}
        for i, s in support.items():
            if not s:
                result["warnings"].append(
                    f"gpu {i}: Xid event registration not supported; the agent reports no Xid events")

        times = []
        for _ in range(args.reads):
            t0 = time.perf_counter()
            reader.read()
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        via_loop = asyncio.run(reader.aread())
        aread_s = time.perf_counter() - t0
        result["read_ms"] = {"median": statistics.median(times) * 1e3, "max": max(times) * 1e3,
                             "aread": aread_s * 1e3, "n": len(times)}
        check("aread from an event loop", via_loop.available and len(via_loop.gpus) == len(first.gpus),
              f"{aread_s * 1e3:.2f} ms")

        if args.alloc_gib > 0:
            index = first.gpus[0].index
            before = _used(reader, index)
            alloc = allocate(args.alloc_gib, index)
            if alloc is None:
                result["warnings"].append("no PyTorch or CuPy with CUDA here: allocation check skipped")
            else:
                lib, free = alloc
                want = int(0.9 * args.alloc_gib * GIB)
                held = _settled_used(reader, index, lambda u: u - before >= want, args.settle_s)
                free()
                after = _settled_used(reader, index, lambda u: held - u >= want, args.settle_s)
                result["alloc"] = {"library": lib, "gib": args.alloc_gib, "before": before,
                                   "held": held, "after": after}
                check("used memory follows an allocation", held - before >= want,
                      f"{lib}: {args.alloc_gib} GiB allocated, used rose by {(held - before) / GIB:.2f} GiB")
                check("used memory falls after the free", held - after >= want,
                      f"fell by {(held - after) / GIB:.2f} GiB")
        return (1 if failures else 0), result
    finally:
        reader.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--alloc-gib", type=float, default=0.0,
                    help="allocate this much on the first GPU and check that used memory follows (0: skip)")
    ap.add_argument("--reads", type=int, default=50, help="reads timed for the per-read cost")
    ap.add_argument("--settle-s", type=float, default=5.0,
                    help="how long used memory may take to follow an allocation or a free")
    ap.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    args = ap.parse_args(argv)
    code, result = run(args)
    if not result.get("available"):
        print(f"NVML unavailable: {result.get('error')}")
    for c in result["checks"]:
        print(f"{'ok  ' if c['ok'] else 'FAIL'}  {c['check']}: {c['detail']}")
    for w in result["warnings"]:
        print(f"warn  {w}")
    if "read_ms" in result:
        r = result["read_ms"]
        print(f"read cost: median {r['median']:.2f} ms, max {r['max']:.2f} ms over {r['n']} reads; "
              f"aread {r['aread']:.2f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return code


if __name__ == "__main__":
    sys.exit(main())
