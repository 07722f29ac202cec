"""Simulated GPU faults end to end: a real `tidegate sim` process, its /sim/faults and /sim/gpu
routes, and the agent's collector reading it with the `sim` GPU source.

Everything runs on 127.0.0.1 with ephemeral ports. Waits have generous timeouts as a safety net
only; no assertion depends on timing.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tidegate.agent.collector import Collector
from tidegate.agent.main import AgentConfig, configure_parser
from tidegate.agent.simgpu import SimulatedGpuReader
from tidegate.config import ConfigError, load
from tidegate.simulator.engine import Engine
from tidegate.simulator.main import CRASH_EXIT_CODE
from tidegate.simulator.profiles import get_profile
from tidegate.simulator.server import SIM_KEY, create_app

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
MODEL = "sim-model"
WAIT_S = 10.0


class SimProcess:
    def __init__(self, *extra: str) -> None:
        cmd = [sys.executable, "-m", "tidegate.cli.main", "sim", "--port", "0", "--profile", "tiny-h100",
               "--model", MODEL, "--speedup", "20", "--log-json", *extra]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        event = json.loads(self.proc.stdout.readline())
        assert event["event"] == "listening"
        self.url = f"http://127.0.0.1:{event['port']}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


@pytest.fixture
def sim() -> Iterator[SimProcess]:
    p = SimProcess()
    try:
        yield p
    finally:
        p.stop()


async def fault(session: aiohttp.ClientSession, url: str, body: object) -> tuple[int, dict]:
    async with session.post(url + "/sim/faults", json=body) as r:
        return r.status, await r.json()


async def status_of(session: aiohttp.ClientSession, url: str) -> int:
    async with session.get(url + "/health") as r:
        return r.status


async def complete(session: aiohttp.ClientSession, url: str) -> tuple[int, dict]:
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 4}
    async with session.post(url + "/v1/completions", json=body) as r:
        return r.status, await r.json()


def collector(url: str, session: aiohttp.ClientSession) -> Collector:
    return Collector(url, session, model=MODEL, gpu_reader=SimulatedGpuReader(url, session), window_s=60.0)


async def test_xid_event_reaches_the_report_exactly_once(sim: SimProcess) -> None:
    async with aiohttp.ClientSession() as session:
        c = collector(sim.url, session)
        before = await c.collect()
        assert before.simulated_gpu and before.gpu_telemetry_available and before.gpu_telemetry_error == ""
        assert len(before.gpus) == 1 and list(before.gpus[0].xid_events) == []
        g = before.gpus[0]
        assert g.name == "NVIDIA H100 80GB HBM3 (simulated)" and g.uuid.startswith("GPU-")
        assert 0 < g.memory_used_bytes < g.memory_total_bytes

        assert (await fault(session, sim.url, {"xid": 79}))[0] == 200
        report = await c.collect()
        assert report.simulated_gpu and report.gpu_telemetry_available
        assert list(report.gpus[0].xid_events) == [79]
        assert report.engine.healthy  # an Xid alone does not stop the engine
        again = await c.collect()
        assert list(again.gpus[0].xid_events) == []


async def test_gpu_lost_fails_health_and_is_reported_then_cleared(sim: SimProcess) -> None:
    async with aiohttp.ClientSession() as session:
        c = collector(sim.url, session)
        code, answer = await fault(session, sim.url, {"gpu_lost": True})
        assert code == 200 and answer["simulated"] and not answer["healthy"]
        assert await status_of(session, sim.url) == 503
        code, body = await complete(session, sim.url)
        assert code == 500 and "GPU is lost" in body["error"]["message"]
        report = await c.collect()
        assert report.simulated_gpu and report.gpu_telemetry_available
        assert report.gpus[0].lost and report.gpus[0].error == "GPU is lost"
        assert not report.engine.healthy and "health: HTTP 503" in report.engine.error

        assert (await fault(session, sim.url, {"clear": True}))[0] == 200
        assert await status_of(session, sim.url) == 200
        assert (await complete(session, sim.url))[0] == 200
        after = await c.collect()
        assert not after.gpus[0].lost and after.engine.healthy


async def test_oom_fails_requests_but_not_health(sim: SimProcess) -> None:
    async with aiohttp.ClientSession() as session:
        assert (await fault(session, sim.url, {"oom": True}))[0] == 200
        code, body = await complete(session, sim.url)
        assert code == 500 and "CUDA out of memory" in body["error"]["message"]
        assert await status_of(session, sim.url) == 200
        g = (await collector(sim.url, session).collect()).gpus[0]
        assert g.memory_used_bytes == g.memory_total_bytes and "out of memory" in g.error
        assert (await fault(session, sim.url, {"oom": False}))[0] == 200
        assert (await complete(session, sim.url))[0] == 200


async def test_ecc_and_health_faults(sim: SimProcess) -> None:
    async with aiohttp.ClientSession() as session:
        c = collector(sim.url, session)
        assert (await fault(session, sim.url, {"ecc_uncorrected": 1}))[0] == 200
        g = (await c.collect()).gpus[0]
        assert (g.ecc_uncorrected_volatile, g.retired_pages_pending, g.lost) == (1, 1, False)
        assert not g.row_remap_failed
        assert (await fault(session, sim.url, {"row_remap_failed": True}))[0] == 200
        assert (await c.collect()).gpus[0].row_remap_failed
        assert (await fault(session, sim.url, {"row_remap_failed": False}))[0] == 200
        assert not (await c.collect()).gpus[0].row_remap_failed
        assert (await fault(session, sim.url, {"health": False}))[0] == 200
        assert await status_of(session, sim.url) == 503
        assert (await fault(session, sim.url, {"health": True}))[0] == 200
        assert await status_of(session, sim.url) == 200
        async with session.get(sim.url + "/sim/faults") as r:
            state = await r.json()
        assert state["simulated"] and state["faults"]["gpus"][0]["ecc_uncorrected_volatile"] == 1


@pytest.mark.parametrize(("raw", "needle"), [
    (b"{not json", "body must be JSON"),
    (b'{"explode": true}', "unknown keys"),
    (b'{"xid": "79"}', "'xid'"),
    (b'{"gpu": 3, "xid": 79}', "'gpu'"),
], ids=["not-json", "unknown-key", "bad-xid", "bad-gpu"])
async def test_bad_fault_bodies_are_400(sim: SimProcess, raw: bytes, needle: str) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(sim.url + "/sim/faults", data=raw,
                                headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400
            assert needle in (await r.json())["error"]["message"]
        assert await status_of(session, sim.url) == 200  # nothing was applied


async def test_crash_exits_the_process_non_zero(sim: SimProcess) -> None:
    async with aiohttp.ClientSession() as session:
        code, answer = await fault(session, sim.url, {"crash": True})
    assert code == 200 and answer["crashing"] is True
    rc = await asyncio.to_thread(sim.proc.wait, WAIT_S)
    assert rc == CRASH_EXIT_CODE != 0


def test_gpu_count_flag() -> None:
    p = SimProcess("--gpu-count", "2")
    try:
        async def read() -> dict:
            async with aiohttp.ClientSession() as session, session.get(p.url + "/sim/gpu") as r:
                return await r.json()
        body = asyncio.run(read())
        assert body["simulated"] is True and [g["index"] for g in body["gpus"]] == [0, 1]
        assert body["gpus"][0]["uuid"] != body["gpus"][1]["uuid"]
    finally:
        p.stop()


# ------------------------------------------------------------------ in process


@pytest.fixture
async def app_url() -> AsyncIterator[tuple[web.Application, str]]:
    engine = Engine(get_profile("tiny-h100"), random.Random(0))
    app = create_app(engine, MODEL, speedup=1.0)  # no on_crash hook
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield app, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    await runner.cleanup()


async def test_crash_without_hook_is_refused(app_url) -> None:
    _, url = app_url
    async with aiohttp.ClientSession() as session:
        code, body = await fault(session, url, {"crash": True})
    assert code == 409 and "tidegate sim" in body["error"]["message"]


async def test_readings_follow_load_and_gpu_lost_aborts_in_flight(app_url) -> None:
    app, url = app_url
    sim = app[SIM_KEY]
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/sim/gpu") as r:
            idle = (await r.json())["gpus"][0]
        body = {"model": MODEL, "prompt": "x" * 4 * 500, "max_tokens": 2000}
        tasks = [asyncio.create_task(session.post(url + "/v1/completions", json=body)) for _ in range(4)]
        for _ in range(int(WAIT_S / 0.01)):
            if sim.engine.stats().running == 4:
                break
            await asyncio.sleep(0.01)
        async with session.get(url + "/sim/gpu") as r:
            busy = (await r.json())["gpus"][0]
        assert busy["memory_used_bytes"] > idle["memory_used_bytes"]
        assert busy["utilization_pct"] > 0 and busy["power_w"] > idle["power_w"]

        assert (await fault(session, url, {"gpu_lost": True}))[0] == 200
        responses = await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S)
        assert [r.status for r in responses] == [503] * 4  # the engine died under them
        for r in responses:
            r.release()
        assert sim.engine.stats().running == 0 and sim.engine.stats().used_blocks == 0


# ------------------------------------------------------------------ agent config


def test_agent_gpu_source_flag() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    configure_parser(parser)
    base = ["--engine-url", "http://127.0.0.1:1", "--replica-id", "r", "--model", "m", "--controlplane", "h:1"]
    assert load(AgentConfig, "agent", parser.parse_args(base), None, environ={}).gpu_source == "nvml"
    cfg = load(AgentConfig, "agent", parser.parse_args([*base, "--gpu-source", "sim"]), None, environ={})
    assert cfg.gpu_source == "sim"
    with pytest.raises(ConfigError, match="gpu_source|gpu-source"):
        load(AgentConfig, "agent", parser.parse_args([*base, "--gpu-source", "dcgm"]), None, environ={})
