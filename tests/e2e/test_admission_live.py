"""Admission through real processes: real etcd, a real `tidegate sim` engine (slowed 20x, so one
prefill lasts about half a second), a real router with --admission. The routing table is written
to etcd by the test with the engine's rates, so the router's predictions are known.

- while a critical request's prefill holds the replica's prefill budget, a sheddable request
  (its class queue: 0) gets 429 at once with Retry-After, x-tidegate-reject-reason and an OpenAI
  error body, and a critical one is held and then served;
- a held request whose client disconnects leaves no trace in the engine (its counters)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from test_router import RouterProc, start_router, wait_for  # type: ignore[import-not-found]  # noqa: F401

from tidegate import codec, keys
from tidegate.store.etcd import EtcdStore
from tidegate.v1.records_pb2 import RouteEntry, RoutingTable

pytestmark = pytest.mark.e2e

MODEL = "m"
SPEEDUP = 0.05  # every engine step lasts 20x its llama3-8b-h100 time: a 1000-token prefill ~0.5 s


@pytest.fixture
def sim_engine(tmp_path: Path) -> Iterator[str]:
    cmd = [sys.executable, "-m", "tidegate.cli.main", "sim", "--port", "0", "--profile", "llama3-8b-h100",
           "--model", MODEL, "--metrics-flavor", "sglang", "--speedup", str(SPEEDUP), "--log-json"]
    log = open(tmp_path / "sim.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line, (tmp_path / "sim.log").read_text()[-2000:]
        event = json.loads(line)
        assert event["event"] == "listening"
        yield f"http://127.0.0.1:{event['port']}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.stdout.close()  # type: ignore[union-attr]
            log.close()


async def put_table(etcd: str, url: str) -> None:
    t = RoutingTable(pool=MODEL, generation=1, schema_version=1)
    t.computed_at.GetCurrentTime()
    # Rates faster than the slowed engine's: predicted TTFTs stay well inside the 2 s default
    # deadline (nothing here is rejected for its deadline); a 150 ms step base leaves no prefill
    # budget under the 100 ms TPOT target, so a replica is open only with no prefill outstanding.
    t.replicas.append(RouteEntry(replica_id="r0", endpoint=url, weight=100, state=2, kv_capacity_tokens=400_000,
                                 kv_free_tokens=400_000, prefill_tokens_per_s=10_000, decode_step_base_ms=150,
                                 decode_step_per_seq_ms=1))
    store = EtcdStore([etcd])
    await store.connect()
    try:
        await store.put(keys.table(MODEL), codec.encode(t))
    finally:
        await store.close()


def body(words: int, stream: bool = True) -> dict:
    return {"model": MODEL, "prompt": " ".join(["tide"] * words), "max_tokens": 4, "stream": stream}


def headers(cls: str) -> dict[str, str]:
    return {"x-tidegate-priority": cls}


async def post(http: aiohttp.ClientSession, url: str, words: int, cls: str) -> tuple[int, dict, bytes]:
    async with http.post(url + "/v1/completions", json=body(words), headers=headers(cls)) as r:
        return r.status, dict(r.headers), await r.read()


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            head = line.split(" ")[0]
            if head.split("{")[0] == name:
                total += float(line.rsplit(" ", 1)[1])
    return total


async def test_sheddable_gets_429_while_critical_passes_and_disconnect_leaves_no_trace(
        clean_etcd: str, start_router, sim_engine: str) -> None:  # noqa: F811
    await put_table(clean_etcd, sim_engine)
    router = start_router(clean_etcd, "--trust-priority-header", "--admission",
                          "--admission-queue", "critical=4,standard=4,sheddable=0")
    async with aiohttp.ClientSession() as http:
        async def synced() -> bool:
            async with http.get(router.url + "/health") as r:
                return r.status == 200 and (await r.json())["pools"].get(MODEL, {}).get("replicas") == 1
        await wait_for(synced)

        # A: a critical request with ~1,000 prompt tokens takes the replica (its prefill ~0.5 s).
        first = asyncio.create_task(post(http, router.url, 1000, "critical"))
        await asyncio.sleep(0.1)
        # B: sheddable, no room in its class queue -> 429 now; C: critical, held, then served.
        # D: critical, held behind C, its client goes away.
        shed = asyncio.create_task(post(http, router.url, 50, "sheddable"))
        held = asyncio.create_task(post(http, router.url, 50, "critical"))
        await asyncio.sleep(0.05)
        gone = asyncio.create_task(post(http, router.url, 60, "critical"))
        await asyncio.sleep(0.15)
        assert not gone.done()
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone

        status, hdrs, raw = await shed
        assert status == 429, raw
        assert hdrs["x-tidegate-reject-reason"] == "queue_full"
        assert int(hdrs["Retry-After"]) >= 1
        err = json.loads(raw)["error"]
        assert err["code"] == "queue_full" and err["type"] == "rate_limit_exceeded" and err["message"]
        for task in (first, held):
            status, _, raw = await task
            assert status == 200, raw
            assert b"[DONE]" in raw

        async def settled() -> bool:
            async with http.get(sim_engine + "/metrics") as r:
                text = await r.text()
            return metric(text, "sglang:num_requests_total") >= 2 and metric(text, "sglang:num_running_reqs") == 0

        await wait_for(settled)
        async with http.get(sim_engine + "/metrics") as r:
            engine = await r.text()
        # Only A and C reached the engine; D never did (not even as an abort).
        assert metric(engine, "sglang:num_requests_total") == 2
        assert metric(engine, "sglang:num_aborted_requests_total") == 0
        async with http.get(router.url + "/metrics") as r:
            text = await r.text()
        assert metric(text, "tidegate_router_admission_rejected_total", priority="sheddable", reason="queue_full") == 1
        assert metric(text, "tidegate_router_admission_rejected_total", priority="critical") == 0
        assert metric(text, "tidegate_router_admission_queue_wait_seconds_count", priority="critical",
                      outcome="disconnected") == 1
        assert metric(text, "tidegate_router_admission_queue_wait_seconds_count", priority="critical",
                      outcome="dispatched") == 1
        assert metric(text, "tidegate_router_admission_queued", priority="critical") == 0
