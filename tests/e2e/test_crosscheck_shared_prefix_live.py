"""Prefix caching through HTTP on a live fleet (etcd, control plane, `tidegate sim` engines with
agents, router; real processes on 127.0.0.1): the cross-check's shared-prefix workload, replayed
through the router as the cross-check replays it, makes the engines' own
vllm:prefix_cache_queries/hits counters count hits."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tidegate.fleet import crosscheck as xc
from tidegate.fleet import loadgen, traces
from tidegate.fleet.up import Fleet, UpConfig

pytestmark = pytest.mark.e2e

MODEL = "sim-model"


def test_shared_prefixes_hit_the_live_engines_caches(fresh_etcd: Any, tmp_path: Path) -> None:
    path = tmp_path / "workload.jsonl"
    xc.write_workload(path, 24, 12.0, 5, 100, 8, groups=2, prefix_tokens=1024)
    trace = traces.load(path)
    cfg = UpConfig(replicas=2, model=MODEL, profile="llama3-8b-h100", etcd=(fresh_etcd.endpoint,),
                   run_dir=tmp_path / "run", report_interval_s=0.5, ready_timeout_s=60)
    with Fleet(cfg) as fleet:
        info = fleet.start()
        engines = [r["engine_url"] for r in info["replicas"]]
        queries0, hits0 = asyncio.run(xc.prefix_counters(engines))
        results, sent = asyncio.run(loadgen.replay(info["router_url"], MODEL, trace, time_scale=1.0,
                                                   duration_s=trace[-1].arrival_s + 1e-6, request_timeout_s=60))
        queries1, hits1 = asyncio.run(xc.prefix_counters(engines))
    assert sent == 24 and all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert queries1 - queries0 == sum(r.prompt_tokens for r in trace)  # each prompt looked up once
    hits = hits1 - hits0
    # The first request of each group finds nothing cached; a later one at most its group's 1,024 tokens.
    assert 0 < hits <= (24 - 2) * 1024 and hits % 16 == 0
