"""The agent's collector scraping real engines' /metrics pages over real HTTP (127.0.0.1).

Each page of tests/fixtures/metrics is served twice: as is, then with every histogram sample
doubled, so the second report's windowed percentiles cover exactly the page's own observations.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tidegate.agent.collector import Collector
from tidegate.agent.histograms import summarize
from tidegate.engine_metrics import parse_metrics

pytestmark = pytest.mark.e2e

PAGES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
HIST_LINE = re.compile(r"^(\S+_(?:bucket|count|sum)(?:\{[^}]*\})?) (\S+)$", re.M)


def doubled(text: str) -> str:
    """The same page after as many observations again (histogram samples x2, gauges unchanged)."""
    return HIST_LINE.sub(lambda m: f"{m.group(1)} {float(m.group(2)) * 2!r}", text)


@dataclass
class PageEngine:
    """A real HTTP server answering /metrics with the next of its pages and /health with 200."""

    pages: list[str]
    served: int = 0
    runner: web.AppRunner | None = None
    url: str = ""
    log: list[str] = field(default_factory=list)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        host, port = self.runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    async def _metrics(self, _: web.Request) -> web.Response:
        text = self.pages[min(self.served, len(self.pages) - 1)]
        self.served += 1
        return web.Response(text=text, content_type="text/plain")

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(status=200)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.mark.parametrize("name", sorted(p.name for p in PAGES.glob("*.txt")))
async def test_collector_reports_engine_stats_from_page(name: str, session: aiohttp.ClientSession) -> None:
    text = (PAGES / name).read_text()
    sample = parse_metrics(text)
    engine = PageEngine([text, doubled(text)])
    await engine.start()
    t = [100.0]
    try:
        collector = Collector(engine.url, session, window_s=60.0, clock=lambda: t[0])
        first = await collector.collect()
        t[0] += 2.0
        second = await collector.collect()
    finally:
        assert engine.runner is not None
        await engine.runner.cleanup()

    for report in (first, second):
        e = report.engine
        assert e.healthy and not e.error
        assert (e.num_requests_running, e.num_requests_waiting) == (sample.running, sample.waiting)
        # TGI exports no KV figures; this SGLang capture predates sglang:max_total_num_tokens.
        assert e.has_kv_capacity == (sample.engine == "vllm")
        if e.has_kv_capacity:
            assert e.kv_capacity_tokens == sample.kv_capacity_tokens
            assert e.kv_free_tokens == int(sample.kv_capacity_tokens * (1.0 - (sample.kv_usage or 0.0)))
        else:
            assert e.kv_capacity_tokens == 0 and e.kv_free_tokens == 0
    # The first scrape is the histograms' baseline; the second's increment is the page itself.
    assert first.engine.ttft.count == first.engine.itl.count == 0
    e = second.engine
    for got, buckets in ((e.ttft, sample.ttft), (e.itl, sample.itl), (e.e2e, sample.e2e)):
        want = summarize(buckets)
        assert (got.count, got.p50_ms, got.p99_ms) == pytest.approx((want.count, want.p50_ms, want.p99_ms))
    if sample.engine == "tgi":
        # TGI's token totals are histogram sums, so doubling the histograms doubles them.
        assert e.prompt_tokens_per_s == pytest.approx((sample.prompt_tokens_total or 0) / 2.0)
        assert e.work.itl_sum_s == 0.0 and e.work.steps == 0.0 and e.work.interval_s == 2.0


@pytest.mark.parametrize("name", sorted(p.name for p in PAGES.glob("*.txt")))
async def test_collector_reports_seats_and_finished_requests(name: str, session: aiohttp.ClientSession) -> None:
    """The admission budget's seat inputs: the operator's --engine-max-num-seqs (no page here
    exports seats), and the requests finished between two scrapes (the E2E histogram's count)."""
    text = (PAGES / name).read_text()
    sample = parse_metrics(text)
    reports = []
    for seats in (0, 64):
        engine = PageEngine([text, doubled(text)])
        await engine.start()
        ticks = iter((100.0, 102.0))
        try:
            collector = Collector(engine.url, session, window_s=60.0, clock=lambda it=ticks: next(it),
                                  max_num_seqs=seats)
            await collector.collect()
            reports.append(await collector.collect())
        finally:
            assert engine.runner is not None
            await engine.runner.cleanup()
    assert [r.engine.max_num_seqs for r in reports] == [0, 64]
    # Doubling the page's histograms finishes as many requests again as it counts.
    assert reports[1].engine.work.finished_requests == pytest.approx(sample.finished_total or 0.0)
    assert (sample.finished_total or 0.0) > 0
