"""The router as a real process: real etcd, real HTTP engines on 127.0.0.1, the openai client."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest
from aiohttp import web

from tidegate import codec, keys
from tidegate.store.etcd import EtcdStore
from tidegate.v1.records_pb2 import RouteEntry, RouterPresence, RoutingTable

pytestmark = pytest.mark.e2e

TIDEGATE = Path(sys.executable).with_name("tidegate")
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


class Engine:
    """A tiny OpenAI-ish engine that counts requests and records client disconnects."""

    def __init__(self, name: str, chunks: int = 3, chunk_delay_s: float = 0.01) -> None:
        self.name = name
        self.chunks = chunks
        self.chunk_delay_s = chunk_delay_s
        self.count = 0
        self.disconnected = asyncio.Event()
        self.port = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.count += 1
        if not body.get("stream"):
            return web.json_response({
                "id": "cmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": f"from {self.name}"}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
            })
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for i in range(self.chunks):
                chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": body["model"],
                         "choices": [{"index": 0, "delta": {"content": f"{self.name}-{i} "},
                                      "finish_reason": None}]}
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
                await asyncio.sleep(self.chunk_delay_s)
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            self.disconnected.set()
            raise
        return resp

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        self.runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
async def engines() -> AsyncIterator[list[Engine]]:
    es = [Engine("e1"), Engine("e2")]
    for e in es:
        await e.start()
    yield es
    for e in es:
        await e.runner.cleanup()


async def put_table(endpoint: str, pool: str, replicas: list[tuple[str, str, float]], generation: int) -> None:
    t = RoutingTable(pool=pool, generation=generation, schema_version=1)
    t.computed_at.GetCurrentTime()
    for rid, url, w in replicas:
        t.replicas.append(RouteEntry(replica_id=rid, endpoint=url, weight=w, state=2))
    store = EtcdStore([endpoint])
    await store.connect()
    try:
        await store.put(keys.table(pool), codec.encode(t))
    finally:
        await store.close()




class RouterProc:
    def __init__(self, etcd: str, tmp: Path, *extra: str) -> None:
        self.log = open(tmp / "router.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [str(TIDEGATE), "router", "--etcd", etcd, "--port", "0", "--log-json", "--seed", "1",
             "--shutdown-grace-s", "1", *extra],
            stdout=subprocess.PIPE, stderr=self.log, start_new_session=True,
        )
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise AssertionError("router exited: " + (tmp / "router.log").read_text()[-2000:])
        event = json.loads(line)
        assert event["event"] == "listening"
        self.url = f"http://127.0.0.1:{event['port']}"

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(10)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.log.close()


@pytest.fixture
def start_router(tmp_path):
    procs: list[RouterProc] = []

    def start(etcd: str, *extra: str) -> RouterProc:
        r = RouterProc(etcd, tmp_path, *extra)
        procs.append(r)
        return r

    yield start
    for r in procs:
        assert r.stop() == 0


async def wait_for(cond, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if await cond():
            return
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


async def health(http: aiohttp.ClientSession, router: RouterProc) -> tuple[int, dict]:
    async with http.get(router.url + "/health") as r:
        return r.status, await r.json()


async def wait_generation(http: aiohttp.ClientSession, router: RouterProc, pool: str, gen: int) -> None:
    async def ok() -> bool:
        status, body = await health(http, router)
        return status == 200 and body["pools"].get(pool, {}).get("generation") == gen
    await wait_for(ok)


async def inflight_total(http: aiohttp.ClientSession, router: RouterProc) -> float:
    async with http.get(router.url + "/metrics") as r:
        text = await r.text()
    for line in text.splitlines():
        if line.startswith("tidegate_router_inflight_requests "):
            return float(line.split()[1])
    raise AssertionError("no in-flight metric")


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
async def test_passthrough_openai_client_and_errors(clean_etcd, engines, start_router, tmp_path, loop):
    await put_table(clean_etcd, "m", [("r1", engines[0].url, 1.0), ("r2", engines[1].url, 1.0)], 1)
    router = start_router(clean_etcd, *(["--no-uvloop"] if loop == "asyncio" else []))
    async with aiohttp.ClientSession() as http:
        await wait_generation(http, router, "m", 1)
        listening = [json.loads(line) for line in (tmp_path / "router.log").read_text().splitlines()
                     if '"router_listening"' in line]
        assert listening[0]["event_loop"] == loop  # uvloop by default, asyncio's own with --no-uvloop
        async with http.post(router.url + "/v1/chat/completions", json=CHAT) as r:
            assert r.status == 200
            body = await r.json()
            assert body["choices"][0]["message"]["content"] in {"from e1", "from e2"}
        async with http.post(router.url + "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
            assert r.status == 200 and r.content_type == "text/event-stream"
            chunks = [c async for c in r.content.iter_any()]
        assert len(chunks) >= 2  # streamed as it came, not buffered
        assert b"".join(chunks).endswith(b"data: [DONE]\n\n")

        async with http.post(router.url + "/v1/chat/completions", json={**CHAT, "model": "nope"}) as r:
            assert r.status == 404
            err = (await r.json())["error"]
            assert err["code"] == "model_not_found" and err["type"] == "invalid_request_error"
        async with http.post(router.url + "/v1/chat/completions", data=b"{nope",
                             headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400 and (await r.json())["error"]["type"] == "invalid_request_error"

        client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
        try:
            done = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            assert done.choices[0].message.content in {"from e1", "from e2"}
            stream = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
            parts = [c.choices[0].delta.content async for c in stream if c.choices]
            assert len(parts) == 3
            models = await client.models.list()
            assert [m.id for m in models.data] == ["m"]
            with pytest.raises(openai.NotFoundError):
                await client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
        finally:
            await client.close()
        assert await inflight_total(http, router) == 0

    # presence: a leased record that reports the table generations it routes with (every ~2 s)
    store = EtcdStore([clean_etcd])
    await store.connect()
    try:
        async def presence_seen() -> bool:
            listing = await store.list_prefix(keys.ROUTERS)
            assert len(listing.items) == 1 and listing.items[0].lease != 0
            rec = codec.decode(listing.items[0].value, RouterPresence)
            return rec.table_generation_by_pool.get("m") == 1
        await wait_for(presence_seen)
    finally:
        await store.close()


async def test_weight_zero_and_refused_replica(refused_port, clean_etcd, engines, start_router):
    await put_table(clean_etcd, "m", [("r1", engines[0].url, 1.0), ("r2", engines[1].url, 1.0)], 1)
    router = start_router(clean_etcd)
    async with aiohttp.ClientSession() as http:
        await wait_generation(http, router, "m", 1)
        await put_table(clean_etcd, "m", [("r1", engines[0].url, 0.0), ("r2", engines[1].url, 1.0)], 2)
        await wait_generation(http, router, "m", 2)
        before = engines[0].count
        served = Counter()
        for _ in range(20):
            async with http.post(router.url + "/v1/chat/completions", json=CHAT) as r:
                assert r.status == 200
                served[r.headers["X-Tidegate-Replica"]] += 1
        assert served == {"r2": 20} and engines[0].count == before

        # a replica that refuses connections: every request still succeeds on the other one
        dead = f"http://127.0.0.1:{refused_port()}"
        await put_table(clean_etcd, "m", [("dead", dead, 5.0), ("r2", engines[1].url, 1.0)], 3)
        await wait_generation(http, router, "m", 3)
        for _ in range(5):
            async with http.post(router.url + "/v1/chat/completions", json=CHAT) as r:
                assert r.status == 200 and r.headers["X-Tidegate-Replica"] == "r2"
        async with http.get(router.url + "/metrics") as r:
            text = await r.text()
        assert 'tidegate_router_retries_total{model="m",reason="connect"}' in text


async def test_client_disconnect_reaches_engine(clean_etcd, start_router):
    slow = Engine("slow", chunks=200, chunk_delay_s=0.05)
    await slow.start()
    try:
        await put_table(clean_etcd, "m", [("s", slow.url, 1.0)], 1)
        router = start_router(clean_etcd)
        async with aiohttp.ClientSession() as http:
            await wait_generation(http, router, "m", 1)
            async with aiohttp.ClientSession() as doomed:
                r = await doomed.post(router.url + "/v1/chat/completions", json={**CHAT, "stream": True})
                assert r.status == 200
                first = await r.content.readany()
                assert first.startswith(b"data: ")
                assert await inflight_total(http, router) == 1
                r.close()  # the client goes away mid-stream
            await asyncio.wait_for(slow.disconnected.wait(), 10)

            async def drained() -> bool:
                return await inflight_total(http, router) == 0
            await wait_for(drained)
    finally:
        await slow.runner.cleanup()


async def test_keeps_routing_when_etcd_stops(fresh_etcd, engines, start_router):
    await put_table(fresh_etcd.endpoint, "m", [("r1", engines[0].url, 1.0)], 1)
    router = start_router(fresh_etcd.endpoint)
    async with aiohttp.ClientSession() as http:
        await wait_generation(http, router, "m", 1)
        fresh_etcd.stop()

        async def unhealthy() -> bool:
            status, body = await health(http, router)
            return status == 200 and body["etcd_healthy"] is False
        await wait_for(unhealthy, 20)
        for _ in range(3):
            async with http.post(router.url + "/v1/chat/completions", json=CHAT) as r:
                assert r.status == 200 and r.headers["X-Tidegate-Replica"] == "r1"


async def test_starts_without_etcd(refused_port, start_router):
    dead = f"127.0.0.1:{refused_port()}"
    router = start_router(dead)
    async with aiohttp.ClientSession() as http:
        status, body = await health(http, router)
        assert status == 503 and body["synced"] is False
        async with http.post(router.url + "/v1/chat/completions", json=CHAT) as r:
            assert r.status == 503 and r.headers["Retry-After"] == "1"
            assert (await r.json())["error"]["type"] == "service_unavailable"


def test_etcd_is_required():
    out = subprocess.run([str(TIDEGATE), "router", "--port", "0"], capture_output=True, text=True, timeout=30,
                         env={k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")})
    assert out.returncode == 2 and "router.etcd" in out.stderr
