"""scripts/bench_router.py's driver leaves no process behind when a start fails (its helpers run
in their own sessions, so nothing else would stop them)."""

from __future__ import annotations

import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.e2e

BENCH = SimpleNamespace(**runpy.run_path(str(Path(__file__).resolve().parents[2] / "scripts" / "bench_router.py")))


def test_a_router_that_does_not_start_leaves_no_upstream_running(tmp_path: Path) -> None:
    args = SimpleNamespace(load_core=None, router_core=None, chunks=1, chunk_interval_ms=1.0, replicas=1,
                           router_cmd="false", router_arg=[], baseline_cmd=None)   # `false router ...` exits
    bench = BENCH.Bench(args, tmp_path)
    with pytest.raises(SystemExit, match="router did not start"):
        bench.run()
    assert len(bench.procs) == 2                    # the upstream, then the router that failed
    assert all(p.poll() is not None for p in bench.procs), "a helper process is still running"
