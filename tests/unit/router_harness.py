"""One router (a real Proxy behind the router's own HTTP server on 127.0.0.1) in front of one engine URL,
with a hand-fed routing table: for tests of what the router sends to engines."""

from __future__ import annotations

import random
import time
from typing import Any

from router_serve import RouterClient  # type: ignore[import-not-found]

from tidegate import codec, keys
from tidegate.router.app import build_app, make_session
from tidegate.router.budget import RetryBudget
from tidegate.router.inflight import InflightCounter
from tidegate.router.metrics import RouterMetrics
from tidegate.router.proxy import Proxy, ProxySettings
from tidegate.router.tables import RoutingTables
from tidegate.store.api import KeyValue
from tidegate.v1.records_pb2 import RouteEntry, RoutingTable


async def post_through_router(engine_url: str, settings: ProxySettings, path: str, payload: dict[str, Any],
                              headers: dict[str, str] | None = None, pool: str = "m") -> int:
    """POST `payload` to the router's `path`; the HTTP status the client gets."""
    tables = RoutingTables()
    table = RoutingTable(pool=pool, generation=2)
    table.replicas.append(RouteEntry(replica_id="r1", endpoint=engine_url, weight=1.0))
    tables.on_change(keys.table(pool), KeyValue(keys.table(pool), codec.encode(table), 2))
    tables.mark_synced()
    inflight = InflightCounter()
    metrics = RouterMetrics(tables, inflight, wall=time.time)
    session = make_session(1.0)
    proxy = Proxy(tables, session, inflight, RetryBudget(time.monotonic), metrics, random.Random(1), settings)
    client = RouterClient(build_app(proxy, tables, metrics, "r-test", 1 << 20))
    await client.start_server()
    try:
        async with client.post(path, json=payload, headers=headers or {}) as r:
            await r.read()
            return r.status
    finally:
        await client.close()
        await session.close()
