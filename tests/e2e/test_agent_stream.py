"""The agent's stream client against a real grpc.aio Telemetry server and a real HTTP engine stand-in.

Everything runs on 127.0.0.1 with ephemeral ports. Waits have generous timeouts as a safety net
only; no assertion depends on timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from tidegate.agent.collector import Collector
from tidegate.agent.metrics import AgentMetrics
from tidegate.agent.nvml import GpuTelemetry, NvmlReader
from tidegate.agent.stream import HelloInfo, StreamClient
from tidegate.v1 import records_pb2, telemetry_pb2, telemetry_pb2_grpc

pytestmark = pytest.mark.e2e

WAIT_S = 10.0
MODEL = "llama-8b"


def vllm_v1_text(k: int) -> str:
    """vLLM V1 /metrics after k scrapes: gauges fixed, counters and histograms growing with k."""
    return f"""\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} 3.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="{MODEL}"}} 0.25
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0",model_name="{MODEL}"}} 2.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",model_name="{MODEL}"}} {1000 + 100 * k}.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="{MODEL}"}} {500 + 50 * k}.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="2000"}} 1.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="{MODEL}"}} {2.0 * k}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",model_name="{MODEL}"}} {4 * k}.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.5",model_name="{MODEL}"}} {9 * k}.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="{MODEL}"}} {10 * k}.0
vllm:time_to_first_token_seconds_count{{engine="0",model_name="{MODEL}"}} {10 * k}.0
"""


@dataclass
class FakeEngine:
    """A real HTTP server serving vLLM V1 /metrics and /health."""

    healthy: bool = True
    scrapes: int = 0
    url: str = ""
    runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        host, port = self.runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    async def _metrics(self, _: web.Request) -> web.Response:
        self.scrapes += 1
        return web.Response(text=vllm_v1_text(self.scrapes), content_type="text/plain")

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@dataclass
class RecordingTelemetry(telemetry_pb2_grpc.TelemetryServicer):
    """Records every AgentMessage, acks every report, and can push directives."""

    messages: asyncio.Queue[telemetry_pb2.AgentMessage] = field(default_factory=asyncio.Queue)
    authorizations: list[str] = field(default_factory=list)
    directive_after_first_report: telemetry_pb2.Directive | None = None

    async def Stream(  # noqa: N802 - gRPC method name
        self, request_iterator: AsyncIterator[telemetry_pb2.AgentMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[telemetry_pb2.ControlMessage]:
        self.authorizations.extend(str(v) for k, v in context.invocation_metadata() or () if k == "authorization")
        async for msg in request_iterator:
            await self.messages.put(msg)
            if msg.WhichOneof("msg") == "report":
                yield telemetry_pb2.ControlMessage(
                    ack=telemetry_pb2.Ack(
                        seq=msg.report.seq, state=records_pb2.REPLICA_STATE_READY, weight=1.0,
                        controlplane_id="test-cp",
                    )
                )
                if self.directive_after_first_report is not None:
                    d, self.directive_after_first_report = self.directive_after_first_report, None
                    yield telemetry_pb2.ControlMessage(directive=d)

    async def next(self, kind: str | None = None) -> telemetry_pb2.AgentMessage:
        while True:
            msg = await asyncio.wait_for(self.messages.get(), WAIT_S)
            if kind is None or msg.WhichOneof("msg") == kind:
                return msg


async def start_server(servicer: RecordingTelemetry, port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    telemetry_pb2_grpc.add_TelemetryServicer_to_server(servicer, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    assert bound != 0
    await server.start()
    return server, bound


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    e = FakeEngine()
    await e.start()
    yield e
    await e.stop()


@contextlib.asynccontextmanager
async def running_agent(
    targets: list[str], engine_url: str, interval_s: float = 0.05, token: str | None = None
) -> AsyncIterator[tuple[StreamClient, AgentMetrics]]:
    metrics = AgentMetrics()
    stop = asyncio.Event()
    nvml = NvmlReader()
    async with aiohttp.ClientSession() as session:
        collector = Collector(
            engine_url, session, model=MODEL, gpu_reader=nvml, scrape_timeout_s=2.0, window_s=60.0,
            metrics=metrics,
        )
        hello = HelloInfo(
            replica_id="r-1", pool=MODEL, endpoint="http://10.0.0.9:8000", region="eu", zone="eu-a",
            gpu_indices=(0,), engine_kind="vllm",
        )
        client = StreamClient(
            targets, hello, collector, report_interval_s=interval_s, rng=lambda: 0.5, metrics=metrics,
            initial_backoff_s=0.05, max_backoff_s=0.2, token=token,
        )
        task = asyncio.create_task(client.run(stop))
        try:
            yield client, metrics
        finally:
            stop.set()
            await asyncio.wait_for(task, WAIT_S)
            nvml.close()


async def test_hello_reports_and_reconnect_after_server_restart(engine: FakeEngine) -> None:
    servicer = RecordingTelemetry()
    server, port = await start_server(servicer)
    try:
        async with running_agent([f"127.0.0.1:{port}"], engine.url) as (client, metrics):
            hello = (await servicer.next()).hello  # the very first message is the Hello
            assert hello.replica_id == "r-1"
            assert (hello.pool, hello.endpoint, hello.region, hello.zone) == (
                MODEL, "http://10.0.0.9:8000", "eu", "eu-a",
            )
            assert list(hello.gpu_indices) == [0]
            assert hello.protocol_version == 1 and hello.engine_kind == "vllm"
            assert hello.report_interval_ms == 50 and hello.agent_version

            first = (await servicer.next("report")).report
            second = (await servicer.next("report")).report
            assert second.seq == first.seq + 1
            e = second.engine
            assert e.healthy and e.error == ""
            assert (e.num_requests_running, e.num_requests_waiting) == (7, 3)
            assert e.kv_cache_usage == pytest.approx(0.25)
            assert (e.num_gpu_blocks, e.block_size) == (2000, 16)
            assert e.has_kv_capacity and e.kv_capacity_tokens == 32000 and e.kv_free_tokens == 24000
            assert e.preemptions_total == 2.0 and e.prompt_tokens_total >= 1100.0
            # The window holds only what arrived since the first scrape: 10 TTFTs per scrape,
            # 4 under 100 ms, 5 in (100, 500] ms, 1 above.
            assert e.ttft.count > 0 and e.ttft.count % 10 == 0
            assert e.ttft.p50_ms == pytest.approx(180.0)
            assert e.ttft.p99_ms == pytest.approx(500.0)
            assert e.itl.count == 0  # not exported by this engine: zeros, count 0
            assert e.prompt_tokens_per_s > 0 and e.generation_tokens_per_s > 0
            # No fabricated GPU numbers: either real NVML data or an explicit "unavailable".
            assert not second.simulated_gpu
            if not second.gpu_telemetry_available:
                assert second.gpu_telemetry_error and len(second.gpus) == 0
            else:  # a machine with a driver: GPU 0's real readings travel (hello asked for index 0)
                assert [g.index for g in second.gpus] == [0]
                g = second.gpus[0]
                assert g.uuid.startswith("GPU-") and g.name and not g.lost
                assert 0 < g.memory_used_bytes <= g.memory_total_bytes

            # The control plane goes away and comes back on the same port.
            await server.stop(None)
            server, _ = await start_server(servicer, port)
            while (msg := await servicer.next()).WhichOneof("msg") != "hello":
                pass
            assert msg.hello.replica_id == "r-1"
            after = (await servicer.next("report")).report
            assert after.seq > second.seq  # sequence continues across streams
            assert client.streams_opened >= 2
            assert metrics.stream_reconnects._value.get() >= 1
            assert client.last_ack is not None and client.last_ack.controlplane_id == "test-cp"
    finally:
        await server.stop(None)


async def test_token_travels_as_bearer_metadata_only(engine: FakeEngine) -> None:
    servicer = RecordingTelemetry()
    server, port = await start_server(servicer)
    try:
        with capture_logs() as logs:
            async with running_agent([f"127.0.0.1:{port}"], engine.url, token="s3cret-agent-token"):
                hello = (await servicer.next()).hello
                await servicer.next("report")
        assert servicer.authorizations == ["Bearer s3cret-agent-token"]
        assert "s3cret" not in str(hello) and "s3cret" not in repr(logs)
    finally:
        await server.stop(None)


async def test_fails_over_to_next_address(engine: FakeEngine) -> None:
    servicer = RecordingTelemetry()
    server, port = await start_server(servicer)
    dead = free_port()  # nothing listens there
    try:
        async with running_agent([f"127.0.0.1:{dead}", f"127.0.0.1:{port}"], engine.url) as (client, _):
            assert (await servicer.next()).WhichOneof("msg") == "hello"
            assert (await servicer.next()).WhichOneof("msg") == "report"
            assert client.streams_opened == 1
    finally:
        await server.stop(None)


async def test_directives_interval_and_reconnect_elsewhere(engine: FakeEngine) -> None:
    first = RecordingTelemetry(
        directive_after_first_report=telemetry_pb2.Directive(
            kind=telemetry_pb2.Directive.KIND_SET_REPORT_INTERVAL, report_interval_ms=80
        )
    )
    second = RecordingTelemetry()
    s1, p1 = await start_server(first)
    s2, p2 = await start_server(second)
    try:
        async with running_agent([f"127.0.0.1:{p1}", f"127.0.0.1:{p2}"], engine.url) as (client, _):
            await first.next("report")
            await first.next("report")  # the directive was read before the next reports
            for _ in range(50):
                if client.report_interval_s == pytest.approx(0.08):
                    break
                await first.next("report")
            assert client.report_interval_s == pytest.approx(0.08)
            # Now the first control plane says it is going away.
            first.directive_after_first_report = telemetry_pb2.Directive(
                kind=telemetry_pb2.Directive.KIND_RECONNECT_ELSEWHERE, reason="leader stepping down"
            )
            hello = (await second.next()).hello
            assert hello.replica_id == "r-1"
            assert hello.report_interval_ms == 80  # the new interval is kept
    finally:
        await s1.stop(None)
        await s2.stop(None)


async def test_unhealthy_engine_still_reports(engine: FakeEngine) -> None:
    engine.healthy = False
    servicer = RecordingTelemetry()
    server, port = await start_server(servicer)
    try:
        async with running_agent([f"127.0.0.1:{port}"], engine.url):
            report = (await servicer.next("report")).report
            assert not report.engine.healthy
            assert "HTTP 503" in report.engine.error
    finally:
        await server.stop(None)


async def test_unreachable_engine_still_reports() -> None:
    servicer = RecordingTelemetry()
    server, port = await start_server(servicer)
    try:
        with capture_logs() as logs:
            async with running_agent([f"127.0.0.1:{port}"], f"http://127.0.0.1:{free_port()}"):
                for _ in range(3):
                    report = (await servicer.next("report")).report
                    assert not report.engine.healthy
                    assert "metrics:" in report.engine.error and "health:" in report.engine.error
                    assert report.engine.num_requests_running == 0 and not report.engine.has_kv_capacity
        # Logged when the failure starts, not on every tick.
        assert [e["event"] for e in logs].count("engine_scrape_failed") == 1
    finally:
        await server.stop(None)


AGENT_MAIN = (
    "import argparse, sys, tidegate.agent.main as m; p = argparse.ArgumentParser(); m.configure_parser(p); "
    "sys.exit(m.run(p.parse_args(sys.argv[1:])))"
)


async def test_process_serves_metrics_and_exits_0_on_sigterm(engine: FakeEngine) -> None:
    servicer = RecordingTelemetry()
    server, port = await start_server(servicer)
    metrics_port = free_port()
    repo = Path(__file__).resolve().parents[2]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", AGENT_MAIN,
        "--engine-url", engine.url, "--replica-id", "r-proc", "--model", MODEL,
        "--controlplane", f"127.0.0.1:{port}", "--report-interval-s", "0.05",
        "--metrics-port", str(metrics_port), "--log-json",
        cwd=repo, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONWARNINGS": "error"},
    )
    try:
        assert (await servicer.next()).hello.replica_id == "r-proc"
        await servicer.next("report")
        await servicer.next("report")
        body = await asyncio.to_thread(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read()
        )
        text = body.decode()
        assert "tidegate_agent_reports_sent_total" in text
        assert 'tidegate_agent_scrapes_total{result="ok"}' in text
        assert "tidegate_agent_gpu_reads_total{result=" in text  # "ok" with a driver, else "unavailable"
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), WAIT_S)
        assert proc.returncode == 0, err.decode()
        assert b"stream_opened" in err and b"agent_stopped" in err
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await server.stop(None)


class HungGpu:
    """A GPU source whose read never returns (a wedged driver)."""

    simulated = False

    async def aread(self, indices: tuple[int, ...] = ()) -> GpuTelemetry:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_hung_gpu_read_does_not_hold_back_the_engine_figures(engine: FakeEngine) -> None:
    metrics = AgentMetrics()
    async with aiohttp.ClientSession() as session:
        collector = Collector(engine.url, session, model=MODEL, gpu_reader=HungGpu(), scrape_timeout_s=0.3,
                              metrics=metrics)
        report = await asyncio.wait_for(collector.collect(), 5)
    assert report.engine.healthy and report.engine.num_requests_running == 7
    assert not report.gpu_telemetry_available and len(report.gpus) == 0
    assert report.gpu_telemetry_error == "NVML read timed out after 0.3 s"
    assert metrics.gpu_reads.labels(result="timeout")._value.get() == 1  # what TidegateGpuTelemetryHung reads
