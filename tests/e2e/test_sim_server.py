"""The simulator's HTTP server, for real: in-process on an ephemeral port, and as a subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tidegate.simulator.engine import Engine
from tidegate.simulator.profiles import get_profile
from tidegate.simulator.server import SIM_KEY, create_app
from tidegate.tokens import PREFIX_BLOCK_BYTES, PREFIX_BLOCK_TOKENS

pytestmark = pytest.mark.e2e

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
REPO = Path(__file__).resolve().parents[2]

V1_NAMES = {
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:cache_config_info",
    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
    "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:num_preemptions", "vllm:request_success",
}


async def start(profile: str = "tiny-h100", speedup: float = 50.0, flavor: str = "vllm", fail_health=False):
    engine = Engine(get_profile(profile), random.Random(0))
    app = create_app(engine, MODEL, metrics_flavor=flavor, speedup=speedup, fail_health=fail_health)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, app, f"http://127.0.0.1:{port}"


def distinct_bodies(n: int, prompt_tokens: int, max_tokens: int) -> list[dict]:
    """Completion bodies whose prompts differ from their first bytes: equal prompts would share
    their KV blocks through the prefix cache."""
    return [{"model": MODEL, "prompt": f"{i:04d}" + "x" * (4 * prompt_tokens - 4), "max_tokens": max_tokens}
            for i in range(n)]


@contextlib.asynccontextmanager
async def under_kv_pressure(n: int, prompt_tokens: int, max_tokens: int, *, flavor: str = "vllm"
                            ) -> AsyncIterator[tuple[Any, str, aiohttp.ClientSession, list[asyncio.Task]]]:
    """A sim server (speedup 20) with `n` distinct completions in flight, entered once some wait
    with over half the KV cache in use; yields (the app's sim, base URL, session, the requests'
    tasks). Requests still in flight on exit are cancelled."""
    runner, app, base = await start(speedup=20.0, flavor=flavor)
    sim = app[SIM_KEY]
    tasks: list[asyncio.Task] = []
    try:
        async with aiohttp.ClientSession() as session:
            tasks = [asyncio.create_task(session.post(base + "/v1/completions", json=b))
                     for b in distinct_bodies(n, prompt_tokens, max_tokens)]
            for _ in range(2000):
                stats = sim.engine.stats()
                if stats.waiting > 0 and stats.kv_usage > 0.5:
                    break
                await asyncio.sleep(0.005)
            yield sim, base, session, tasks
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await runner.cleanup()


@pytest.fixture
async def server() -> AsyncIterator[tuple[web.Application, str, aiohttp.ClientSession]]:
    runner, app, base = await start()
    async with aiohttp.ClientSession() as session:
        yield app, base, session
    await runner.cleanup()


async def read_sse(resp: aiohttp.ClientResponse) -> list:
    events = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line:
            continue
        assert line.startswith("data: ")
        data = line[len("data: "):]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def metric_families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(fams: dict, family: str, name: str | None = None) -> float:
    return next(s.value for s in fams[family].samples if s.name == (name or family))


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_non_streaming_usage(server, chat):
    _, base, session = server
    if chat:
        url, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": "abcdefgh"}]}
        prompt_tokens = 2 + 4 + 2
    else:
        url, body = "/v1/completions", {"prompt": "abcdefgh"}
        prompt_tokens = 2
    async with session.post(base + url, json={"model": MODEL, "max_tokens": 7, **body}) as r:
        assert r.status == 200
        out = await r.json()
    assert out["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 7, "total_tokens": prompt_tokens + 7}
    choice = out["choices"][0]
    assert choice["finish_reason"] == "length"
    text = choice["message"]["content"] if chat else choice["text"]
    assert text == " tok" * 7


async def test_max_completion_tokens_and_default(server):
    _, base, session = server
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 3,
            "ignore_eos": True}
    async with session.post(base + "/v1/chat/completions", json=body) as r:
        assert (await r.json())["usage"]["completion_tokens"] == 3
    async with session.post(base + "/v1/completions", json={"model": MODEL, "prompt": "x"}) as r:
        assert (await r.json())["usage"]["completion_tokens"] == 256


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_streaming_sse(server, chat):
    _, base, session = server
    body = {"model": MODEL, "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}
    if chat:
        url = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": "hello"}]
    else:
        url = "/v1/completions"
        body["prompt"] = "hello"
    async with session.post(base + url, json=body) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events = await read_sse(r)
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
    token_chunks = events[1:-2] if chat else events[:-2]
    if chat:
        assert events[0]["choices"][0]["delta"]["role"] == "assistant"
        texts = [c["choices"][0]["delta"]["content"] for c in token_chunks]
    else:
        texts = [c["choices"][0]["text"] for c in token_chunks]
    assert texts == [" tok"] * 5
    assert [c["choices"][0]["finish_reason"] for c in token_chunks] == [None] * 4 + ["length"]


async def test_models_and_health_toggle(server):
    _, base, session = server
    async with session.get(base + "/v1/models") as r:
        data = await r.json()
    assert [m["id"] for m in data["data"]] == [MODEL]
    assert data["data"][0]["owned_by"] == "tidegate-sim"
    async with session.get(base + "/health") as r:
        assert r.status == 200 and await r.read() == b""
    async with session.post(base + "/sim/health", json={"healthy": False}) as r:
        assert r.status == 200
    async with session.get(base + "/health") as r:
        assert r.status == 503
    async with session.post(base + "/sim/health", json={"healthy": True}) as r:
        assert r.status == 200
    async with session.get(base + "/health") as r:
        assert r.status == 200


@pytest.mark.parametrize(
    ("url", "payload", "status", "code"),
    [
        pytest.param("/v1/completions", {"model": "nope", "prompt": "x"}, 404, "model_not_found", id="unknown-model"),
        pytest.param("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "x"}]},
                     404, "model_not_found", id="unknown-model-chat"),
        pytest.param("/v1/completions", b"{not json", 400, None, id="malformed-json"),
        pytest.param("/v1/completions", {"model": MODEL}, 400, None, id="missing-prompt"),
        pytest.param("/v1/chat/completions", {"model": MODEL}, 400, None, id="missing-messages"),
        pytest.param("/v1/completions", {"prompt": "x"}, 400, None, id="missing-model"),
        pytest.param("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, None,
                     id="bad-max-tokens"),
        pytest.param("/v1/completions", {"model": MODEL, "prompt": "x" * 200_000}, 400, "context_length_exceeded",
                     id="prompt-too-long"),
        pytest.param("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 40_000}, 400,
                     "context_length_exceeded", id="completion-too-long"),
    ],
)
async def test_errors(server, url, payload, status, code):
    _, base, session = server
    kwargs = {"data": payload} if isinstance(payload, bytes) else {"json": payload}
    async with session.post(base + url, **kwargs) as r:
        assert r.status == status
        body = await r.json()
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"]
    assert body["error"]["code"] == code


async def test_metrics_have_vllm_names_and_counts(server):
    _, base, session = server
    for _ in range(2):
        body = {"model": MODEL, "prompt": "abcd", "max_tokens": 4}
        async with session.post(base + "/v1/completions", json=body) as r:
            assert r.status == 200
    async with session.get(base + "/metrics") as r:
        assert r.status == 200
        fams = metric_families(await r.text())
    assert V1_NAMES <= set(fams)
    assert sample(fams, "vllm:generation_tokens", "vllm:generation_tokens_total") == 8
    assert sample(fams, "vllm:prompt_tokens", "vllm:prompt_tokens_total") == 2
    assert sample(fams, "vllm:request_success", "vllm:request_success_total") == 2
    assert sample(fams, "vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count") == 2
    assert sample(fams, "vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count") == 6
    assert sample(fams, "vllm:num_requests_running") == 0
    info = next(s for s in fams["vllm:cache_config_info"].samples)
    assert info.labels["num_gpu_blocks"] == "2048" and info.labels["block_size"] == "16" and info.value == 1
    running = next(s for s in fams["vllm:num_requests_running"].samples)
    assert running.labels["model_name"] == MODEL
    buckets = [s.labels["le"] for s in fams["vllm:time_to_first_token_seconds"].samples if s.name.endswith("_bucket")]
    assert buckets[0] == "0.001" and buckets[-2] == "2560.0"


async def test_v0_metrics_flavor():
    runner, _, base = await start(flavor="vllm-v0")
    try:
        async with aiohttp.ClientSession() as session, session.get(base + "/metrics") as r:
            fams = metric_families(await r.text())
    finally:
        await runner.cleanup()
    assert {"vllm:gpu_cache_usage_perc", "vllm:time_per_output_token_seconds"} <= set(fams)
    assert "vllm:kv_cache_usage_perc" not in fams and "vllm:inter_token_latency_seconds" not in fams


async def test_load_shows_in_gauges_and_kv_pressure_preempts():
    async with under_kv_pressure(16, 3000, 600) as (sim, base, session, tasks):
        async with session.get(base + "/metrics") as r:
            fams = metric_families(await r.text())
        assert sample(fams, "vllm:num_requests_running") > 0
        assert sample(fams, "vllm:kv_cache_usage_perc") > 0.5
        responses = await asyncio.gather(*tasks)
        for resp in responses:
            assert (await resp.json())["usage"]["completion_tokens"] == 600
            resp.release()
        s = sim.engine.stats()
        assert s.used_blocks == 0 and s.requests_finished_total == 16
        # 10 prompts of 3k tokens fit in 32k tokens of KV, but not once each grows by 600 outputs
        assert s.preemptions_total > 0


async def test_client_disconnect_aborts_request():
    runner, app, base = await start(speedup=1.0)
    sim = app[SIM_KEY]
    try:
        session = aiohttp.ClientSession()
        body = {"model": MODEL, "prompt": "x" * 4000, "max_tokens": 10_000, "stream": True}
        resp = await session.post(base + "/v1/completions", json=body)
        first = await resp.content.readline()
        assert first.startswith(b"data: ")
        assert sim.engine.stats().running == 1
        resp.close()
        await session.close()
        for _ in range(1000):
            if sim.engine.stats().running == 0:
                break
            await asyncio.sleep(0.01)
        s = sim.engine.stats()
        assert (s.running, s.waiting, s.used_blocks, s.requests_aborted_total) == (0, 0, 0, 1)
        async with aiohttp.ClientSession() as session, session.get(base + "/metrics") as r:
            fams = metric_families(await r.text())
        assert sample(fams, "vllm:num_requests_running") == 0
        assert sample(fams, "vllm:kv_cache_usage_perc") == 0
    finally:
        await runner.cleanup()


def test_subprocess_cli_port_zero_and_sigterm():
    # `tidegate sim` through the real CLI dispatcher (what the console script runs).
    cmd = [sys.executable, "-m", "tidegate.cli.main", "sim", "--port", "0", "--profile", "instant",
           "--model", "sim-model", "--metrics-flavor", "vllm", "--log-json"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stdout.readline()
        event = json.loads(line)
        assert event["event"] == "listening"
        port = event["port"]

        async def talk() -> None:
            async with aiohttp.ClientSession() as session:
                body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20,
                        "stream": True}
                async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r:
                    events = await read_sse(r)
                assert events[-1] == "[DONE]"
                assert sum(1 for e in events[:-1] if e["choices"][0]["delta"].get("content") == " tok") == 20
                async with session.get(f"http://127.0.0.1:{port}/metrics") as r:
                    assert V1_NAMES <= set(metric_families(await r.text()))

        asyncio.run(talk())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


SGLANG_NAMES = {
    "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:max_total_num_tokens",
    "sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds", "sglang:e2e_request_latency_seconds",
    "sglang:prompt_tokens", "sglang:generation_tokens", "sglang:num_requests", "sglang:cache_hit_rate",
}


@pytest.mark.parametrize("flavor", ["vllm", "vllm-v0", "sglang"])
async def test_agent_parser_reads_every_flavor(flavor):
    """The agent's adapter (tidegate.engine_metrics.parse_metrics) on the sim's real /metrics, under load."""
    from tidegate.engine_metrics import TelemetryParseError, parse_metrics

    async with under_kv_pressure(14, 3000, 400, flavor=flavor) as (sim, base, session, tasks):
        # Record what the exposition itself read from the engine (the driver keeps stepping).
        seen = []
        stats = sim.engine.stats
        sim.engine.stats = lambda: seen.append(stats()) or seen[-1]
        async with session.get(base + "/metrics") as r:
            text = await r.text()
        del sim.engine.stats
        s = seen[-1]
        sample = parse_metrics(text, MODEL)
        assert (sample.running, sample.waiting) == (s.running, s.waiting)
        assert s.running > 0 and s.waiting > 0
        assert sample.kv_usage == pytest.approx(s.kv_usage) and sample.kv_usage > 0.5
        assert sample.kv_capacity_tokens == 2048 * 16
        with pytest.raises(TelemetryParseError):  # the model_name label is there and filters
            parse_metrics(text, "another-model")
        if flavor == "sglang":
            assert sample.engine == "sglang" and SGLANG_NAMES <= set(metric_families(text))
            assert all(s.labels.get("model_name") == MODEL
                       for f in metric_families(text).values() for s in f.samples if "le" not in s.labels)
        else:
            assert sample.engine == "vllm"
        responses = await asyncio.gather(*tasks)
        for resp in responses:
            resp.release()
        async with session.get(base + "/metrics") as r:
            done = parse_metrics(await r.text(), MODEL)
        s = sim.engine.stats()
        assert (done.running, done.waiting, done.kv_usage) == (0, 0, 0.0)
        assert done.generation_tokens_total == s.generation_tokens_total == 14 * 400
        assert done.prompt_tokens_total == 14 * 3000
        assert len(done.ttft) > 1 and done.ttft[-1][1] == 14  # +Inf bucket holds every request
        if flavor == "sglang":
            assert done.preemptions_total is None
        else:
            assert done.preemptions_total == s.preemptions_total


async def test_prefix_cache_counters_in_metrics():
    engine = Engine(get_profile("tiny-h100"), random.Random(0))
    engine.add_request("a", 100, 1, 0.0, prefix_hashes=tuple(range(6)))
    engine.advance(1.0)
    engine.add_request("b", 100, 1, engine.clock_s, prefix_hashes=tuple(range(6)))
    engine.advance(engine.clock_s + 1.0)
    app = create_app(engine, MODEL)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as r:
            fams = metric_families(await r.text())
    finally:
        await runner.cleanup()
    assert sample(fams, "vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total") == 200
    assert sample(fams, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total") == 96
    info = next(s for s in fams["vllm:cache_config_info"].samples)
    assert info.labels["enable_prefix_caching"] == "True"


@pytest.mark.parametrize("chat", [False, True], ids=["completion", "chat"])
async def test_prefix_cache_hits_over_http(server, chat):
    """The server hashes the text it receives: a prompt that repeats an earlier one's leading
    PREFIX_BLOCK_BYTES blocks is served from the cache, by exactly those blocks; another prompt is not."""
    app, base, session = server
    shared = "".join(f"system rule {i:03d}. " for i in range(200))[:PREFIX_BLOCK_BYTES * 10]  # 10 whole blocks
    path = "/v1/chat/completions" if chat else "/v1/completions"

    def body(head: str, text: str) -> dict:
        if chat:  # hashed as "system:" + head + "\n" + "user:" + text + "\n": still 10 whole shared blocks
            return {"model": MODEL, "max_tokens": 1, "messages": [{"role": "system", "content": head},
                                                                   {"role": "user", "content": text}]}
        return {"model": MODEL, "max_tokens": 1, "prompt": head + text}

    for head, text in ((shared, "first question " * 20), (shared, "a second, different question " * 10),
                       (shared, "x" * 400), ("another system prompt " * 40, "first question " * 20)):
        async with session.post(base + path, json=body(head, text)) as r:
            assert r.status == 200
            await r.read()
    stats = app[SIM_KEY].engine.stats()
    assert stats.prefix_cache_hits_total == 2 * 10 * PREFIX_BLOCK_TOKENS  # the 2nd and 3rd prompts only


def test_subprocess_cli_sglang_flavor():
    cmd = [sys.executable, "-m", "tidegate.cli.main", "sim", "--port", "0", "--profile", "instant",
           "--metrics-flavor", "sglang"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        port = json.loads(proc.stdout.readline())["port"]

        async def scrape() -> str:
            async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as r:
                return await r.text()

        assert SGLANG_NAMES <= set(metric_families(asyncio.run(scrape())))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
