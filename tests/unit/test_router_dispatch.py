"""router.app's routes on the router's own HTTP server (as `tidegate router` serves): the proxied
routes reach the engine, other methods and paths get OpenAI errors, a handler's bug is a 500."""

from __future__ import annotations

import random
import time

import aiohttp
import pytest
from router_serve import RouterClient  # type: ignore[import-not-found]
from test_router_proxy import CHAT, Engine, set_table  # type: ignore[import-not-found]

from tidegate.router.app import build_app, make_session
from tidegate.router.budget import RetryBudget
from tidegate.router.http1 import Answer, Request
from tidegate.router.inflight import InflightCounter
from tidegate.router.metrics import RouterMetrics
from tidegate.router.proxy import Proxy, ProxySettings
from tidegate.router.tables import RoutingTables


class _Served:
    """The app built from `proxy`, served by the router's HTTP server on 127.0.0.1."""

    def __init__(self, proxy, tables: RoutingTables, metrics: RouterMetrics) -> None:
        self.client = RouterClient(build_app(proxy, tables, metrics, "r-test", 1 << 20))

    async def __aenter__(self) -> str:
        await self.client.start_server()
        return self.client.url

    async def __aexit__(self, *exc) -> None:
        await self.client.close()


@pytest.fixture
async def served():
    engine = Engine("e1")
    await engine.server.start_server()
    tables = RoutingTables()
    set_table(tables, "m", [("r1", engine.url, 1.0)])
    inflight = InflightCounter()
    metrics = RouterMetrics(tables, inflight, wall=time.time)
    session = make_session(1.0)
    proxy = Proxy(tables, session, inflight, RetryBudget(time.monotonic), metrics, random.Random(1), ProxySettings())
    async with _Served(proxy, tables, metrics) as url, aiohttp.ClientSession() as http:
        yield url, http, engine, metrics
    await session.close()
    await engine.server.close()


async def test_proxied_routes_reach_the_engine(served):
    url, http, engine, metrics = served
    for path in ("/v1/chat/completions", "/v1/completions"):
        body = CHAT if path.endswith("chat/completions") else {"model": "m", "prompt": "hi", "max_tokens": 2}
        async with http.post(url + path, json=body) as r:
            assert r.status == 200
            assert (await r.json())["by"] == "e1"
            assert r.headers["X-Tidegate-Replica"] == "r1"
    assert len(engine.seen) == 2
    assert metrics.registry.get_sample_value("tidegate_router_requests_total", {"model": "m", "status": "200"}) == 2


async def test_other_methods_and_paths_answer_as_the_application_does(served):
    url, http, _, _ = served
    async with http.get(url + "/v1/chat/completions") as r:
        assert r.status == 405
        assert (await r.json())["error"]["type"] == "invalid_request_error"
    async with http.post(url + "/v1/chat/completions/") as r:
        assert r.status == 404
        assert "error" in await r.json()
    async with http.get(url + "/health") as r:
        assert r.status == 200


async def test_expect_continue_is_answered(served):
    url, http, engine, _ = served
    async with http.post(url + "/v1/chat/completions", json=CHAT, expect100=True) as r:
        assert r.status == 200
    assert len(engine.seen) == 1
    assert "Expect" not in engine.headers[0]


class _FailingProxy:
    """A stand-in whose handler has a bug: the direct route keeps the error middleware."""

    async def handle(self, request: Request) -> Answer:
        raise RuntimeError("bug")


async def test_a_handler_bug_is_a_500_in_the_openai_envelope():
    tables = RoutingTables()
    metrics = RouterMetrics(tables, InflightCounter(), wall=time.time)
    async with _Served(_FailingProxy(), tables, metrics) as url, aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/chat/completions", json=CHAT) as r:
            assert r.status == 500
            assert (await r.json())["error"]["code"] == "internal_error"
