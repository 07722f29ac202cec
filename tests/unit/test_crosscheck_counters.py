"""The cross-check's prefix-cache counters (tidegate.fleet.crosscheck.prefix_counters) against
real HTTP servers on 127.0.0.1: summed over the engines; a slow, failing or absent engine is a
CountersError naming it within the timeout, never a hang or a partial sum."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tidegate.fleet import crosscheck as xc

METRICS = ("# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total {q}\n"
           "# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total {h}\n")


@pytest.fixture
async def engine() -> AsyncIterator[Callable[..., Awaitable[str]]]:
    servers: list[TestServer] = []

    async def start(queries: float = 0.0, hits: float = 0.0, delay_s: float = 0.0, status: int = 200) -> str:
        async def metrics(_: web.Request) -> web.Response:
            await asyncio.sleep(delay_s)
            return web.Response(text=METRICS.format(q=queries, h=hits), status=status)

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        return str(server.make_url("")).rstrip("/")

    yield start
    for s in servers:
        await s.close()


async def test_counters_are_summed_over_the_engines(engine) -> None:  # noqa: ANN001
    urls = [await engine(100, 40), await engine(50, 5)]
    assert await xc.prefix_counters(urls) == (150.0, 45.0)


async def test_a_slow_engine_is_an_error_naming_it_within_the_timeout(engine) -> None:  # noqa: ANN001
    fast, slow = await engine(1, 1), await engine(1, 1, delay_s=5.0)
    t0 = time.monotonic()
    with pytest.raises(xc.CountersError, match=rf"{slow}/metrics: no answer within 0.3 s"):
        await xc.prefix_counters([fast, slow], timeout_s=0.3)
    assert time.monotonic() - t0 < 2.0


async def test_an_error_status_or_a_closed_port_is_an_error_naming_the_engine(engine) -> None:  # noqa: ANN001
    broken = await engine(1, 1, status=500)
    with pytest.raises(xc.CountersError, match=rf"{broken}/metrics: 500"):
        await xc.prefix_counters([broken])
    with pytest.raises(xc.CountersError, match=r"http://127.0.0.1:1/metrics"):
        await xc.prefix_counters(["http://127.0.0.1:1"])
