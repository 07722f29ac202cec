"""EtcdStore, WatchCache, LeaseKeeper and Election against a real etcd process."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest

from tidegate.errors import CompactedError, StoreError
from tidegate.etcd_server import EmbeddedEtcd
from tidegate.store.api import LeaseNotFoundError
from tidegate.store.election import Election
from tidegate.store.etcd import EtcdStore
from tidegate.store.lease import LeaseKeeper
from tidegate.store.watchcache import WatchCache

pytestmark = pytest.mark.e2e

P = "/tidegate/v1/tables/"


async def until(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    async def poll() -> None:
        while not cond():
            await asyncio.sleep(0.02)
    await asyncio.wait_for(poll(), timeout_s)


async def test_put_get_list_delete(store: EtcdStore) -> None:
    r1 = await store.put(P + "a", b"1")
    r2 = await store.put(P + "b", b"2")
    assert r2 == r1 + 1
    kv = await store.get(P + "a")
    assert kv is not None and kv.value == b"1" and kv.mod_revision == r1
    listing = await store.list_prefix(P)
    assert [(k.key, k.value) for k in listing.items] == [(P + "a", b"1"), (P + "b", b"2")]
    assert listing.revision >= r2
    assert await store.delete(P + "a") is True
    assert await store.delete(P + "a") is False
    assert await store.get(P + "a") is None


async def test_lease_expiry_removes_keys(store: EtcdStore) -> None:
    lease = await store.grant_lease(1)
    await store.put(P + "leased", b"x", lease=lease)
    assert (await store.get(P + "leased")).lease == lease  # type: ignore[union-attr]
    for _ in range(200):
        if await store.get(P + "leased") is None:
            break
        await asyncio.sleep(0.05)
    assert await store.get(P + "leased") is None
    with pytest.raises(LeaseNotFoundError):
        await store.refresh_lease(lease)
    await store.revoke_lease(lease)  # idempotent


async def test_unreachable_etcd_raises_store_error_quickly() -> None:
    s = EtcdStore(["127.0.0.1:1"], timeout_s=0.5)
    await s.connect()
    with pytest.raises(StoreError):
        await s.get("/x")
    with pytest.raises(StoreError):
        await s.watch_prefix("/x", 1).__anext__()
    await s.close()


async def test_watch_breaks_and_cache_resumes_after_restart(fresh_etcd: EmbeddedEtcd) -> None:
    s = EtcdStore([fresh_etcd.endpoint], timeout_s=1.0)
    await s.connect()
    seen: list[tuple[str, bytes | None]] = []
    cache = WatchCache(s, P, on_change=lambda k, kv: seen.append((k, kv.value if kv else None)),
                       backoff_initial_s=0.05, backoff_max_s=0.3)
    task = asyncio.create_task(cache.run())
    await s.put(P + "a", b"1")
    await cache.synced.wait()
    await until(lambda: P + "a" in cache.items())

    fresh_etcd.kill()
    await until(lambda: not cache.healthy)
    assert cache.items()[P + "a"].value == b"1"  # last-known state kept
    fresh_etcd.start()

    writer = EtcdStore([fresh_etcd.endpoint])
    await writer.connect()
    await writer.put(P + "b", b"2")
    await writer.delete(P + "a")
    await until(lambda: cache.healthy and P + "b" in cache.items() and P + "a" not in cache.items())
    assert cache.relists == 1  # resumed from the last revision, no re-list
    assert seen == [(P + "a", b"1"), (P + "b", b"2"), (P + "a", None)]
    task.cancel()
    await writer.close()
    await s.close()


async def test_compaction_raises_and_cache_relists(store: EtcdStore) -> None:
    r1 = await store.put(P + "a", b"1")
    await store.put(P + "a", b"2")
    r3 = await store.put(P + "b", b"3")
    await store.compact(r3)
    with pytest.raises(CompactedError) as ei:
        await store.watch_prefix(P, r1).__anext__()
    assert ei.value.compact_revision == r3

    # A cache that was behind (its revision compacted away) re-lists and converges.
    cache = WatchCache(store, P)
    cache.revision = r1  # as if it had been disconnected since r1
    cache._items[P + "gone"] = (await store.get(P + "a"))  # type: ignore[assignment]
    task = asyncio.create_task(cache.run())
    await cache.synced.wait()
    await store.put(P + "c", b"4")
    await until(lambda: P + "c" in cache.items())
    assert {k: kv.value for k, kv in cache.items().items()} == {P + "a": b"2", P + "b": b"3", P + "c": b"4"}
    task.cancel()


async def test_lease_keeper_keeps_key_alive_then_close_removes_it(store: EtcdStore) -> None:
    keeper = LeaseKeeper(store, ttl_s=1)
    task = asyncio.create_task(keeper.run())
    await keeper.put(P + "presence", b"me")
    await until(lambda: keeper.lease_id != 0)
    await asyncio.sleep(2.5)  # > 2 TTLs: only the refreshes keep it
    kv = await store.get(P + "presence")
    assert kv is not None and kv.lease == keeper.lease_id
    assert keeper.grants == 1
    await keeper.close()
    await until(task.done)
    assert await store.get(P + "presence") is None


async def test_election_takeover_after_lapse_and_after_resign(clean_etcd: str) -> None:
    name = "/tidegate/v1/election/test-" + str(random.getrandbits(32))
    a = Election([clean_etcd], name, b"a", ttl_s=2)
    b = Election([clean_etcd], name, b"b", ttl_s=2)
    c = Election([clean_etcd], name, b"c", ttl_s=2)
    assert await a.leader() is None
    await a.campaign()
    assert a.is_leader and await a.leader() == b"a"
    b_task = asyncio.create_task(b.campaign())
    await asyncio.sleep(0.5)
    assert not b_task.done() and not b.is_leader

    # a "crashes": its keep-alive stops, its lease lapses, b takes over.
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await a.close()
    await asyncio.wait_for(b_task, 10)
    takeover_s = loop.time() - t0
    print(f"election takeover after lease lapse (ttl 2 s): {takeover_s:.2f} s")
    assert b.is_leader and await b.leader() == b"b"

    # A clean resign hands over at once.
    c_task = asyncio.create_task(c.campaign())
    await asyncio.sleep(0.3)
    assert not c_task.done()
    await b.resign()
    await asyncio.wait_for(c_task, 5)
    assert c.is_leader and await c.leader() == b"c"
    assert not b.lost.is_set()
    await c.resign()
    assert await c.leader() is None
    await b.close()
    await c.close()


async def test_election_leader_steps_down_when_etcd_is_gone(fresh_etcd: EmbeddedEtcd) -> None:
    e = Election([fresh_etcd.endpoint], "/tidegate/v1/election/x", b"a", ttl_s=1, timeout_s=0.5)
    await e.campaign()
    assert e.is_leader
    fresh_etcd.kill()
    await asyncio.wait_for(e.lost.wait(), 5)
    assert not e.is_leader
    await e.close()


async def test_store_opened_after_outage_connects_at_once(fresh_etcd: EmbeddedEtcd) -> None:
    # gRPC's process-wide subchannel pool used to hand a new store the reconnect backoff
    # of an older store that had been knocking on the dead port (CI, stop 14).
    old = EtcdStore([fresh_etcd.endpoint], timeout_s=0.5)
    await old.connect()
    await old.put(P + "a", b"1")
    fresh_etcd.kill()
    loop = asyncio.get_running_loop()
    end = loop.time() + 3.0
    while loop.time() < end:  # each failed connect grows the old channel's backoff
        with pytest.raises(StoreError):
            await old.get(P + "a")
        await asyncio.sleep(0.1)
    fresh_etcd.start()
    new = EtcdStore([fresh_etcd.endpoint], timeout_s=2.0)
    await new.connect()
    await new.put(P + "b", b"2")
    assert (await new.get(P + "a")) is not None
    await new.close()
    await old.close()
