"""RoutingTables: decoding, keeping the last good table, deletes; and the retry budget."""

from __future__ import annotations

import asyncio

from tidegate import codec, keys
from tidegate.router.budget import RetryBudget
from tidegate.router.tables import RoutingTables
from tidegate.store.api import KeyValue
from tidegate.store.memory import InMemoryStore
from tidegate.store.watchcache import WatchCache
from tidegate.v1.records_pb2 import RouteEntry, RoutingTable


def table_kv(pool: str, rev: int, *entries: tuple[str, float], generation: int = 1) -> KeyValue:
    t = RoutingTable(pool=pool, generation=generation, schema_version=1)
    for rid, w in entries:
        t.replicas.append(RouteEntry(replica_id=rid, endpoint=f"http://{rid}/", weight=w))
    return KeyValue(keys.table(pool), codec.encode(t), rev)


def test_decode_and_snapshot():
    rt = RoutingTables()
    rt.on_change(keys.table("m"), table_kv("m", 5, ("a", 1.0), ("b", 0.0)))
    t = rt.get("m")
    assert t is not None and t.generation == 1 and t.mod_revision == 5
    assert [(e.replica_id, e.endpoint, e.weight) for e in t.entries] == [("a", "http://a", 1.0), ("b", "http://b", 0.0)]
    assert set(rt.pools()) == {"m"} and rt.get("other") is None


def test_pool_names_may_contain_slashes():
    # Hugging Face model names such as "meta-llama/Llama-3.1-8B-Instruct" are pool names.
    rt = RoutingTables()
    name = "meta-llama/Llama-3.1-8B-Instruct"
    rt.on_change(keys.table(name), table_kv(name, 3, ("a", 1.0)))
    t = rt.get(name)
    assert t is not None and t.entries[0].replica_id == "a"


def test_bad_value_keeps_previous_table():
    rt = RoutingTables()
    rt.on_change(keys.table("m"), table_kv("m", 5, ("a", 1.0)))
    before = rt.pools()
    rt.on_change(keys.table("m"), KeyValue(keys.table("m"), b"{not json", 6))
    rt.on_change(keys.table("m"), KeyValue(keys.table("m"), b'{"replicas": 3}', 7))
    assert rt.get("m") is before["m"]
    assert before["m"].entries[0].replica_id == "a"  # snapshots are immutable views


def test_delete_removes_pool_and_ignores_foreign_keys():
    rt = RoutingTables()
    rt.on_change(keys.table("m"), table_kv("m", 5, ("a", 1.0)))
    rt.on_change(keys.router("r1"), KeyValue(keys.router("r1"), b"x", 6))
    rt.on_change(keys.table("m"), None)
    assert rt.get("m") is None and dict(rt.pools()) == {}


async def test_fed_by_watch_cache_and_survives_outage():
    store = InMemoryStore()
    await store.put(keys.table("m"), table_kv("m", 0, ("a", 1.0)).value)
    rt = RoutingTables()
    cache = WatchCache(store, keys.TABLES, on_change=rt.on_change, backoff_initial_s=0.01, backoff_max_s=0.02)
    task = asyncio.create_task(cache.run())
    try:
        await asyncio.wait_for(cache.synced.wait(), 5)
        assert rt.get("m") is not None
        await store.put(keys.table("m"), table_kv("m", 0, ("a", 1.0), ("b", 2.0), generation=2).value)
        for _ in range(100):
            if rt.get("m").generation == 2:
                break
            await asyncio.sleep(0.01)
        assert [e.replica_id for e in rt.get("m").entries] == ["a", "b"]
        store.down = True
        await asyncio.sleep(0.05)
        assert not cache.healthy
        assert rt.get("m").generation == 2  # last good table kept through the outage
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_retry_budget_token_bucket():
    now = [0.0]
    b = RetryBudget(lambda: now[0], ratio=0.2, min_per_s=0.0, capacity=2.0)
    assert b.try_spend() and b.try_spend()
    assert not b.try_spend()  # empty
    for _ in range(4):
        b.on_request()
    assert not b.try_spend()  # 0.8 tokens
    b.on_request()
    assert b.try_spend()  # 1.0 token after 5 requests: retries <= 20% of requests
    timed = RetryBudget(lambda: now[0], ratio=0.0, min_per_s=1.0, capacity=3.0)
    for _ in range(3):
        assert timed.try_spend()
    assert not timed.try_spend()
    now[0] += 1.0
    assert timed.try_spend()
    now[0] += 100.0
    assert timed.tokens == 3.0  # capped


async def test_presence_record_written_with_lease():
    from tidegate.router.inflight import InflightCounter
    from tidegate.router.presence import PresencePublisher
    from tidegate.store.lease import LeaseKeeper
    from tidegate.v1.records_pb2 import RouterPresence

    store = InMemoryStore()
    rt = RoutingTables()
    rt.on_change(keys.table("m"), table_kv("m", 5, ("a", 1.0), generation=7))
    inflight = InflightCounter()
    inflight.acquire("a")
    inflight.acquire("b")
    inflight.release("b")
    keeper = LeaseKeeper(store, 10)
    tasks = [asyncio.create_task(keeper.run()),
             asyncio.create_task(PresencePublisher(keeper, "r1", "eu", "http://x", inflight, rt,
                                                   interval_s=0.01, wall=lambda: 100.0).run())]
    try:
        for _ in range(200):
            kv = await store.get(keys.router("r1"))
            if kv is not None and kv.lease:
                break
            await asyncio.sleep(0.01)
        assert kv is not None and kv.lease == keeper.lease_id
        rec = codec.decode(kv.value, RouterPresence)
        assert rec.router_id == "r1" and rec.region == "eu" and dict(rec.inflight_by_replica) == {"a": 1}
        assert dict(rec.table_generation_by_pool) == {"m": 7} and rec.updated_at.seconds == 100
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await keeper.close()
    assert await store.get(keys.router("r1")) is None  # revoked with the lease
