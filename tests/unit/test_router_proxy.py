"""The proxy's request parsing, error mapping, pass-through and retries, over real HTTP on
127.0.0.1 (aiohttp test servers as engines), with hand-fed routing tables."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from router_serve import RouterClient  # type: ignore[import-not-found]

from tidegate import codec, keys
from tidegate.router.app import build_app, make_session
from tidegate.router.budget import RetryBudget
from tidegate.router.inflight import InflightCounter
from tidegate.router.metrics import RouterMetrics
from tidegate.router.parse import BadRequest, parse_request
from tidegate.router.proxy import Proxy, ProxySettings, _Deadline, _DeadlineClock, forward_request_headers
from tidegate.router.tables import RoutingTables
from tidegate.store.api import KeyValue
from tidegate.v1.records_pb2 import RouteEntry, RoutingTable

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}


class Engine:
    """A tiny engine: records what it received; behaviour set per test."""

    def __init__(self, name: str, mode: str = "ok") -> None:
        self.name = name
        self.mode = mode
        self.seen: list[dict] = []
        self.headers: list = []
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.chat)
        self.server = TestServer(app, host="127.0.0.1")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append(body)
        self.headers.append(request.headers.copy())
        if self.mode == "500":
            return web.json_response({"error": {"message": "boom", "type": "server_error"}}, status=500)
        if self.mode == "slow":
            await asyncio.sleep(5)
        if self.mode == "400":
            return web.json_response({"error": {"message": "bad", "type": "invalid_request_error"}}, status=400)
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for i in range(3):
                await resp.write(f"data: {json.dumps({'i': i, 'by': self.name})}\n\n".encode())
                await asyncio.sleep(0.01)
            if self.mode == "break":
                request.transport.close()
                return resp
            await resp.write(b"data: [DONE]\n\n")
            return resp
        return web.json_response({"object": "chat.completion", "by": self.name}, headers={"X-Engine": self.name})




class Router:
    def __init__(self, tables: RoutingTables, **settings) -> None:
        self.tables = tables
        self.inflight = InflightCounter()
        self.metrics = RouterMetrics(tables, self.inflight, wall=time.time)
        self.max_body = settings.pop("max_body_bytes", 4 * 1024 * 1024)
        self.settings = ProxySettings(**settings)
        self.budget = RetryBudget(time.monotonic)

    async def __aenter__(self) -> RouterClient:
        self.session = make_session(1.0)
        proxy = self.proxy = Proxy(self.tables, self.session, self.inflight, self.budget, self.metrics,
                                   random.Random(1), self.settings)
        app = build_app(proxy, self.tables, self.metrics, "r-test", self.max_body)
        self.client = RouterClient(app)
        await self.client.start_server()
        return self.client

    async def __aexit__(self, *exc) -> None:
        await self.client.close()
        await self.session.close()


def set_table(tables: RoutingTables, pool: str, entries: list[tuple[str, str, float]], rev: int = 2) -> None:
    t = RoutingTable(pool=pool, generation=rev)
    for rid, url, w in entries:
        t.replicas.append(RouteEntry(replica_id=rid, endpoint=url, weight=w))
    tables.on_change(keys.table(pool), KeyValue(keys.table(pool), codec.encode(t), rev))
    tables.mark_synced()


@pytest.fixture
async def engines():
    es = [Engine("e1"), Engine("e2")]
    for e in es:
        await e.server.start_server()
    yield es
    for e in es:
        await e.server.close()


# -------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        pytest.param("/v1/chat/completions", b"{nope", None, id="malformed"),
        pytest.param("/v1/chat/completions", b"[1,2]", None, id="not-object"),
        pytest.param("/v1/chat/completions", b'{"messages": [{"role":"user","content":"x"}]}', "model", id="no-model"),
        pytest.param("/v1/chat/completions", b'{"model": 3, "messages": []}', "model", id="model-not-str"),
        pytest.param("/v1/chat/completions", b'{"model": "m"}', "messages", id="no-messages"),
        pytest.param("/v1/chat/completions", b'{"model": "m", "messages": [{"content": 5}]}', "messages",
                     id="bad-content"),
        pytest.param("/v1/completions", b'{"model": "m"}', "prompt", id="no-prompt"),
        pytest.param("/v1/completions", b'{"model": "m", "prompt": {"a": 1}}', "prompt", id="bad-prompt"),
    ],
)
def test_parse_rejects(path, body, param):
    with pytest.raises(BadRequest) as info:
        parse_request(path, body)
    assert info.value.param == param


def test_parse_features():
    _, f = parse_request("/v1/chat/completions", json.dumps({**CHAT, "stream": True}).encode())
    assert f.model == "m" and f.stream and f.max_tokens == 4 and f.prompt_tokens > 4
    _, f = parse_request("/v1/completions", b'{"model": "m", "prompt": [1, 2, 3], "max_tokens": true}')
    assert f.prompt_tokens == 3 and f.max_tokens is None and not f.stream


def test_request_headers_filtered():
    from multidict import CIMultiDict
    h = CIMultiDict({"Authorization": "Bearer s3cret", "Connection": "keep-alive, X-Hop", "X-Hop": "1",
                     "Keep-Alive": "5", "Host": "x", "Content-Type": "application/json", "X-Request-Id": "q"})
    out = forward_request_headers(h)
    assert dict(out) == {"Content-Type": "application/json", "X-Request-Id": "q"}


# -------------------------------------------------------------------------- error mapping


async def test_error_mapping(engines):
    tables = RoutingTables()
    async with Router(tables, max_body_bytes=1000) as client:
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status == 503 and r.headers["Retry-After"] == "1"
        assert (await r.json())["error"]["code"] == "tables_not_synced"

        set_table(tables, "m", [("a", engines[0].url, 0.0)])
        set_table(tables, "empty", [])
        r = await client.post("/v1/chat/completions", data=b"{oops")
        err = (await r.json())["error"]
        assert r.status == 400 and err["type"] == "invalid_request_error" and set(err) == {
            "message", "type", "param", "code"}
        r = await client.post("/v1/chat/completions", json={"messages": []})
        assert r.status == 400 and (await r.json())["error"]["param"] == "model"
        r = await client.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
        assert r.status == 404 and (await r.json())["error"]["code"] == "model_not_found"
        r = await client.post("/v1/chat/completions", json=CHAT)  # only a weight-0 replica
        assert r.status == 503 and r.headers["Retry-After"] == "1"
        assert (await r.json())["error"]["type"] == "service_unavailable"
        r = await client.post("/v1/chat/completions", data=b"x" * 2000)
        assert r.status == 413 and "error" in await r.json()
        r = await client.get("/v1/nothing")
        assert r.status == 404 and "error" in await r.json()
        r = await client.get("/v1/models")
        assert [m["id"] for m in (await r.json())["data"]] == ["m"]  # "empty" has no replica
        r = await client.get("/health")
        body = await r.json()
        assert r.status == 200 and body["synced"] and set(body["pools"]) == {"m", "empty"}
    assert engines[0].seen == []


async def test_health_unsynced():
    async with Router(RoutingTables()) as client:
        r = await client.get("/health")
        assert r.status == 503 and (await r.json())["synced"] is False


# -------------------------------------------------------------------------- pass-through


async def test_non_streaming_passthrough_and_headers(engines):
    tables = RoutingTables()
    set_table(tables, "m", [("a", engines[0].url, 1.0)])
    async with Router(tables) as client:
        r = await client.post("/v1/chat/completions", json=CHAT,
                              headers={"Authorization": "Bearer s3cret", "X-Request-Id": "abc"})
        assert r.status == 200
        assert await r.json() == {"object": "chat.completion", "by": "e1"}
        assert r.headers["X-Engine"] == "e1" and r.headers["X-Tidegate-Replica"] == "a"
    assert engines[0].seen == [CHAT]
    assert "Authorization" not in engines[0].headers[0] and engines[0].headers[0]["X-Request-Id"] == "abc"


async def test_streaming_passthrough_chunks(engines):
    tables = RoutingTables()
    set_table(tables, "m", [("a", engines[0].url, 1.0)])
    async with Router(tables) as client:
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert r.status == 200 and r.content_type == "text/event-stream"
        chunks = [c async for c in r.content.iter_any()]
        text = b"".join(chunks).decode()
        assert text.count("data: ") == 4 and text.endswith("data: [DONE]\n\n")
        metrics = await (await client.get("/metrics")).text()
    assert 'tidegate_router_requests_total{model="m",status="200"} 1.0' in metrics
    assert "tidegate_router_inflight_requests 0.0" in metrics


class BigEngine:
    """Answers with `pieces` pieces of 64 KiB (an SSE stream, or one JSON body of that length)
    and notes when it has written them all."""

    def __init__(self, pieces: int, sse: bool) -> None:
        self.pieces, self.sse = pieces, sse
        self.finished = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        self.server = TestServer(app, host="127.0.0.1")

    def body(self) -> bytes:
        return b"".join(self.piece(i) for i in range(self.pieces))

    def piece(self, i: int) -> bytes:
        return b"data: " + bytes([65 + i % 26]) * (65536 - 8) + b"\n\n"

    async def chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        if self.sse:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        else:
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.content_length = 65536 * self.pieces
        await resp.prepare(request)
        for i in range(self.pieces):
            await resp.write(self.piece(i))
        await resp.write_eof()
        self.finished.set()
        return resp


@contextlib.asynccontextmanager
async def big_engine_router(pieces: int, sse: bool):
    engine = BigEngine(pieces, sse)
    await engine.server.start_server()
    tables = RoutingTables()
    set_table(tables, "m", [("a", f"http://127.0.0.1:{engine.server.port}", 1.0)])
    try:
        async with Router(tables) as client:
            yield engine, client
    finally:
        await engine.server.close()


@pytest.mark.parametrize("sse", [True, False], ids=["sse", "content-length"])
async def test_large_answer_relayed_intact(sse):
    async with big_engine_router(64, sse) as (engine, client):  # 4 MiB
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": sse})
        assert r.status == 200
        assert (r.headers.get("Transfer-Encoding") == "chunked") is sse
        assert await r.read() == engine.body()
        r = await client.post("/v1/chat/completions", json=CHAT)  # the connection is fine after
        assert r.status == 200 and len(await r.read()) == 65536 * 64


async def test_http10_client_gets_a_streamed_answer_unframed_until_close():
    async with big_engine_router(8, True) as (engine, client):
        body = json.dumps({**CHAT, "stream": True}).encode()
        reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
        writer.write(b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        raw = await asyncio.wait_for(reader.read(), 10)  # HTTP/1.0 without a length: until close
        writer.close()
        head, _, got = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.") and b" 200 " in head.split(b"\r\n")[0]
        assert b"transfer-encoding" not in head.lower()  # no chunking for an HTTP/1.0 client
        assert got == engine.body()


async def test_slow_client_slows_its_engine_instead_of_filling_the_router():
    # 32 MiB: more than the loopback buffers of both hops hold
    async with big_engine_router(512, True) as (engine, client):
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        got = [await r.content.readexactly(1 << 20)]
        await asyncio.sleep(0.3)  # the client reads nothing: the engine must not get far
        assert not engine.finished.is_set()
        got.append(await r.read())
        assert b"".join(got) == engine.body()
        assert engine.finished.is_set()


async def test_upstream_4xx_passed_through_not_retried(engines):
    engines[0].mode = engines[1].mode = "400"
    tables = RoutingTables()
    set_table(tables, "m", [("a", engines[0].url, 1.0), ("b", engines[1].url, 1.0)])
    async with Router(tables) as client:
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status == 400
    assert len(engines[0].seen) + len(engines[1].seen) == 1


# -------------------------------------------------------------------------- retries and failures


async def test_connection_refused_retried_elsewhere(refused_port, engines):
    tables = RoutingTables()
    set_table(tables, "m", [("dead", f"http://127.0.0.1:{refused_port()}", 100.0), ("b", engines[1].url, 1.0)])
    router = Router(tables)
    async with router as client:
        for _ in range(5):
            r = await client.post("/v1/chat/completions", json=CHAT)
            assert r.status == 200 and (await r.json())["by"] == "e2"
        metrics = await (await client.get("/metrics")).text()
    assert 'tidegate_router_retries_total{model="m",reason="connect"}' in metrics
    assert router.inflight.total == 0


async def test_5xx_retried_then_passed_through(engines):
    engines[0].mode = "500"
    tables = RoutingTables()
    set_table(tables, "m", [("a", engines[0].url, 1.0), ("b", engines[1].url, 1.0)])
    async with Router(tables) as client:
        for _ in range(4):
            r = await client.post("/v1/chat/completions", json=CHAT)
            assert r.status == 200 and (await r.json())["by"] == "e2"
    engines[1].mode = "500"
    async with Router(tables) as client:
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status == 500 and (await r.json())["error"]["message"] == "boom"


async def test_all_refused_gives_502_and_no_retries_without_budget(refused_port):
    tables = RoutingTables()
    set_table(tables, "m", [(f"d{i}", f"http://127.0.0.1:{refused_port()}", 1.0) for i in range(5)])
    router = Router(tables, max_retries=2)
    async with router as client:
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status == 502 and (await r.json())["error"]["code"] == "upstream_connect"
        m = await (await client.get("/metrics")).text()
        assert 'tidegate_router_retries_total{model="m",reason="connect"} 2.0' in m  # max_retries
        router.budget._tokens = 0.0  # an exhausted budget: no retry at all
        router.budget.min_per_s = 0.0
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status == 502
        m = await (await client.get("/metrics")).text()
        assert 'tidegate_router_retries_total{model="m",reason="connect"} 2.0' in m
        assert "tidegate_router_retry_budget_exhausted_total 1.0" in m
        assert router.inflight.total == 0


async def test_first_byte_timeout_gives_504_without_retry(engines):
    engines[0].mode = engines[1].mode = "slow"
    tables = RoutingTables()
    set_table(tables, "m", [("a", engines[0].url, 1.0), ("b", engines[1].url, 1.0)])
    router = Router(tables, first_byte_timeout_s=0.2)
    async with router as client:
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status == 504 and (await r.json())["error"]["code"] == "first_byte_timeout"
        assert router.inflight.total == 0
    assert len(engines[0].seen) + len(engines[1].seen) == 1


async def test_midstream_break_emits_sse_error(engines):
    engines[0].mode = "break"
    tables = RoutingTables()
    set_table(tables, "m", [("a", engines[0].url, 1.0)])
    router = Router(tables)
    async with router as client:
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        text = (await r.read()).decode()
        events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
        assert [e.get("i") for e in events[:3]] == [0, 1, 2]
        assert events[-1]["error"]["code"] == "upstream_stream_broken"
        assert router.inflight.total == 0


def test_prefix_hashes_share_ids_for_a_shared_prefix():
    from tidegate.router.parse import request_prefix_hashes
    from tidegate.tokens import PREFIX_BLOCK_BYTES

    system = "s" * (PREFIX_BLOCK_BYTES * 4)
    a = request_prefix_hashes("/v1/completions", {"prompt": system + "question one " * 20})
    b = request_prefix_hashes("/v1/completions", {"prompt": system + "another question " * 20})
    assert len(a) > 4 and len(b) > 4
    assert a[:4] == b[:4] and a[4] != b[4]          # chained: equal up to where the prompts differ
    assert request_prefix_hashes("/v1/completions", {"prompt": "short"}) == ()  # no full block
    chat = request_prefix_hashes("/v1/chat/completions", {"messages": [{"role": "system", "content": system}]})
    assert len(chat) == 4


def test_only_prefix_aware_policies_get_prefix_hashes():
    from tidegate.policy import registry

    aware = {n for n in registry.names() if getattr(registry.create(n), "uses_prefix_hashes", False)}
    assert aware == {"tidegate", "llmd", "llmd_table", "sglang_cache_aware"}


class FakeHookPolicy:
    """Picks the first candidate; records the hooks the router calls, in order."""

    name = "fake_hooks"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def pick(self, snapshot, request, rng):
        from tidegate.policy import registry

        cands = snapshot.candidates()
        return registry.make_pick(cands[0], "first", 0.0, len(cands)) if cands else None

    def on_dispatch(self, request, replica_id):
        self.calls.append(("dispatch", replica_id))

    def on_first_token(self, request, replica_id):
        self.calls.append(("first_token", replica_id))

    def on_complete(self, request, replica_id):
        self.calls.append(("complete", replica_id))


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("broken", ["refused", "invalid_url"])
async def test_router_feeds_every_policy_hook(engines, monkeypatch, refused_port, stream, broken):
    from tidegate.policy import registry

    fake = FakeHookPolicy()
    monkeypatch.setattr(registry, "create", lambda name: fake)
    tables = RoutingTables()
    # "a" cannot be reached (it refuses connections, or its endpoint is no URL the router can use:
    # the engine client fails before it sends anything): dispatch + complete without a first
    # token, then "b" serves it.
    a = f"http://127.0.0.1:{refused_port()}" if broken == "refused" else "ftp://nowhere"
    set_table(tables, "m", [("a", a, 1.0), ("b", engines[0].url, 1.0)])
    async with Router(tables) as client:
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
        assert r.status == 200
        await r.read()
    assert fake.calls == [("dispatch", "a"), ("complete", "a"),
                          ("dispatch", "b"), ("first_token", "b"), ("complete", "b")]


class FakeSloPolicy(FakeHookPolicy):
    def __init__(self) -> None:
        super().__init__()
        self.slos: list = []

    def pick(self, snapshot, request, rng):
        self.slos.append(snapshot.slo)
        return super().pick(snapshot, request, rng)


async def test_pools_without_an_slo_get_the_routers_default(engines, monkeypatch):
    from tidegate.policy import registry
    from tidegate.policy.registry import SloTargets

    fake = FakeSloPolicy()
    monkeypatch.setattr(registry, "create", lambda name: fake)
    tables = RoutingTables()
    set_table(tables, "m", [("a", engines[0].url, 1.0)])
    default = SloTargets(ttft_s=0.5, tpot_s=0.05)
    async with Router(tables, default_slo=default) as client:
        assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
    assert fake.slos == [default]


@contextlib.asynccontextmanager
async def sim_engine(model: str = "m"):  # noqa: ANN201
    """A real simulated vLLM replica (tiny-h100, 50x speed) on loopback; yields its base URL."""
    from tidegate.simulator.engine import Engine as SimEngine
    from tidegate.simulator.profiles import get_profile
    from tidegate.simulator.server import create_app

    sim = web.AppRunner(create_app(SimEngine(get_profile("tiny-h100"), random.Random(0)), model, speedup=50.0))
    await sim.setup()
    try:
        await web.TCPSite(sim, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{sim.addresses[0][1]}"
    finally:
        await sim.cleanup()


class FakeOutputPolicy(FakeHookPolicy):
    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[tuple[str, int]] = []

    def on_output(self, request, replica_id, output_tokens):
        self.outputs.append((replica_id, output_tokens))


@pytest.mark.parametrize(("path", "payload"), [
    ("/v1/chat/completions", {**CHAT, "max_tokens": 12}),
    ("/v1/completions", {"model": "m", "prompt": "hello there", "max_tokens": 12}),
])
async def test_finished_answers_teach_the_policy_their_output_length(monkeypatch, path, payload):
    from tidegate.policy import registry

    fake = FakeOutputPolicy()
    monkeypatch.setattr(registry, "create", lambda name: fake)
    tables = RoutingTables()
    async with sim_engine() as url, Router(tables) as client:
        set_table(tables, "m", [("a", url, 1.0)])
        for extra in ({}, {"stream": True, "stream_options": {"include_usage": True}},
                      {"stream": True}):  # a stream without usage: the count is unknown, nothing is said
            r = await client.post(path, json={**payload, **extra})
            assert r.status == 200
            await r.read()
    # The simulated engine writes exactly max_tokens and reports it in usage.
    assert fake.outputs == [("a", 12), ("a", 12)]


class FakeTpotPolicy(FakeOutputPolicy):
    """Hooks plus predictions that always dispatch at once (so admission applies to it)."""

    def __init__(self) -> None:
        super().__init__()
        self.tpots: list[tuple[str, float]] = []
        self.early: list[float | None] = []

    def predictions(self, snapshot, request):
        from tidegate.policy.predict import Prediction

        return [Prediction(e.replica_id, 0, request.prompt_tokens, 0.01, 0.01, 0.0, 0.0, 0.1, 0.0, 1e9, 1e9)
                for e in snapshot.candidates()]

    tpot_margin = 1.25

    def on_tpot(self, request, replica_id, tpot_s, early_tpot_s=None):
        self.tpots.append((replica_id, tpot_s))
        self.early.append(early_tpot_s)
        self.calls.append(("tpot", replica_id))


def _tpot_router(monkeypatch) -> tuple[FakeTpotPolicy, RoutingTables, Router]:
    """A router whose every pool runs one FakeTpotPolicy."""
    from tidegate.policy import registry

    fake = FakeTpotPolicy()
    monkeypatch.setattr(registry, "create", lambda name: fake)
    tables = RoutingTables()
    return fake, tables, Router(tables)


def _small_gate():
    """An admission gate holding up to 4 requests per class (it enforces the policy's TPOT plan)."""
    from prometheus_client import CollectorRegistry

    from tidegate.policy.admission import AdmissionConfig, ClassLimits
    from tidegate.router.admission import AdmissionMetrics, Gate

    limits = {c: ClassLimits(4, 30.0) for c in ("critical", "standard", "sheddable")}
    return Gate(AdmissionConfig(limits), time.monotonic, AdmissionMetrics(CollectorRegistry()))


@pytest.mark.parametrize("admission", [True, False])
async def test_realized_tpot_reaches_the_policy_only_under_admission(monkeypatch, admission):
    """A streamed answer with usage: (end - first chunk) / (tokens - 1), before on_complete, and
    only when admission enforces the policy's plan; a stream without usage or a non-streamed
    answer says nothing (no token count, no first-token time)."""
    fake, tables, router = _tpot_router(monkeypatch)
    async with sim_engine() as url, router as client:
        set_table(tables, "m", [("a", url, 1.0)])
        if admission:
            router.proxy.gate = _small_gate()
        for extra in ({"stream": True, "stream_options": {"include_usage": True}}, {"stream": True}, {}):
            r = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 12, **extra})
            assert r.status == 200
            await r.read()
    if admission:
        assert [rid for rid, _ in fake.tpots] == ["a"]
        assert 0 < fake.tpots[0][1] < 1.0
        calls = [c for c, _ in fake.calls]
        assert calls.index("tpot") < len(calls) and calls[calls.index("tpot") + 1] == "complete"
        assert router.metrics.registry.get_sample_value("tidegate_router_tpot_plan_margin", {"model": "m"}) == 1.25
    else:
        assert fake.tpots == []
        assert router.metrics.registry.get_sample_value("tidegate_router_tpot_plan_margin", {"model": "m"}) is None


async def test_the_early_tpot_is_timed_on_answers_longer_than_its_window(monkeypatch):
    """Under admission a streamed answer longer than EARLY_TOKENS tokens also reports the TPOT of
    its first EARLY_TOKENS gaps, timed on its SSE events; a shorter one reports none (its whole
    TPOT stands in: tpot_plan.TpotPlan.observe)."""
    from tidegate.policy.tpot_plan import EARLY_TOKENS

    fake, tables, router = _tpot_router(monkeypatch)
    async with sim_engine() as url, router as client:
        set_table(tables, "m", [("a", url, 1.0)])
        router.proxy.gate = _small_gate()
        for max_tokens in (EARLY_TOKENS, 3 * EARLY_TOKENS):
            r = await client.post("/v1/chat/completions", json={
                **CHAT, "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}})
            assert r.status == 200
            await r.read()
    assert len(fake.tpots) == 2
    short, long_ = fake.early
    assert short is None
    assert long_ is not None and 0 < long_ < 1.0
    # The first EARLY_TOKENS gaps of an answer three times as long: about its TPOT, not its whole length.
    assert long_ < 2.5 * fake.tpots[1][1]


def deadline_clock(tick_s: float = 0.01) -> _DeadlineClock:
    return _DeadlineClock(asyncio.get_running_loop(), tick_s)


async def test_deadline_that_fires_is_a_timeout_and_withdraws_its_cancel():
    deadline = _Deadline(deadline_clock(), 3600)
    deadline.fire()  # as the clock would
    with pytest.raises(asyncio.CancelledError):
        await asyncio.sleep(0)
    assert deadline.close()
    assert asyncio.current_task().cancelling() == 0  # the task goes on as if never cancelled
    await asyncio.sleep(0)


async def test_deadline_closed_in_time_never_cancels():
    deadline = _Deadline(deadline_clock(0.001), 0.001)
    assert not deadline.close()
    await asyncio.sleep(0.01)  # past the deadline: nothing fires


async def test_deadlines_fire_within_a_tick_in_arming_order():
    clock = deadline_clock(0.01)
    loop = asyncio.get_running_loop()
    fired: list[tuple[str, float]] = []

    async def attempt(name: str, delay_s: float) -> None:
        deadline = _Deadline(clock, delay_s)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            assert deadline.close()  # the deadline's own cancel: a timeout
            fired.append((name, loop.time() - start))

    start = loop.time()
    tasks = [asyncio.create_task(attempt("a", 0.05)), asyncio.create_task(attempt("b", 0.1))]
    await asyncio.wait_for(asyncio.gather(*tasks), 2)
    assert [n for n, _ in fired] == ["a", "b"]
    assert 0.05 <= fired[0][1] < 0.5 and 0.1 <= fired[1][1] < 0.6  # late only by a tick (and a busy machine)


async def test_a_cancel_from_elsewhere_stays_a_cancel_even_when_the_deadline_fired():
    async def attempt() -> bool:
        deadline = _Deadline(deadline_clock(), 3600)
        deadline.fire()
        asyncio.current_task().cancel()  # the client went away too
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            assert not deadline.close()
            raise
        return True

    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(attempt())



async def test_streamed_first_tokens_teach_admission_its_ttft_margin(monkeypatch):
    """Under admission, a streamed answer's first token reports its TTFT from the send against the
    TTFT its dispatch counted on (the gate's TTFT margin); a non-streamed answer has no first-token
    time and says nothing."""
    from prometheus_client import CollectorRegistry

    from tidegate.policy import registry
    from tidegate.policy.admission import AdmissionConfig, ClassLimits
    from tidegate.router.admission import AdmissionMetrics, Gate

    seen: list[tuple[str, float, float]] = []

    class RecordingGate(Gate):
        def observe_ttft(self, pool, predicted_s, realized_s):
            seen.append((pool, predicted_s, realized_s))
            super().observe_ttft(pool, predicted_s, realized_s)

    monkeypatch.setattr(registry, "create", lambda name: FakeTpotPolicy())
    tables = RoutingTables()
    router = Router(tables)
    async with sim_engine() as url, router as client:
        set_table(tables, "m", [("a", url, 1.0)])
        limits = {c: ClassLimits(4, 30.0) for c in ("critical", "standard", "sheddable")}
        metrics = AdmissionMetrics(CollectorRegistry())
        router.proxy.gate = RecordingGate(AdmissionConfig(limits), time.monotonic, metrics)
        for extra in ({"stream": True}, {}, {"stream": True}):
            r = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4, **extra})
            assert r.status == 200
            await r.read()
    assert [(pool, predicted) for pool, predicted, _ in seen] == [("m", 0.01), ("m", 0.01)]
    assert all(0 < realized < 5.0 for _, _, realized in seen)
