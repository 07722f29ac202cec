"""WatchCache over InMemoryStore: list, follow, survive outages and compactions."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest
import structlog

from tidegate.store.api import KeyValue
from tidegate.store.lease import LeaseKeeper
from tidegate.store.memory import InMemoryStore
from tidegate.store.watchcache import WatchCache, full_jitter

P = "/tidegate/v1/tables/"


class FakeSleep:
    """Records requested sleeps and returns at once (no wall-clock time in unit tests)."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        await asyncio.sleep(0)


async def until(cond: Callable[[], bool], steps: int = 2000) -> None:
    for _ in range(steps):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


def snapshot(cache: WatchCache) -> dict[str, bytes]:
    return {k: kv.value for k, kv in cache.items().items()}


def state(store: InMemoryStore) -> dict[str, bytes]:
    return {k: kv.value for k, kv in store.items().items() if k.startswith(P)}


@pytest.fixture
def changes() -> list[tuple[str, bytes | None]]:
    return []


def make_cache(store: InMemoryStore, changes: list[tuple[str, bytes | None]],
               sleep: FakeSleep | None = None) -> WatchCache:
    def on_change(key: str, kv: KeyValue | None) -> None:
        changes.append((key, kv.value if kv else None))

    return WatchCache(store, P, on_change=on_change, rng=random.Random(1), sleep=sleep or FakeSleep())


async def test_initial_list_then_puts_and_deletes(changes: list[tuple[str, bytes | None]]) -> None:
    store = InMemoryStore()
    await store.put(P + "a", b"1")
    await store.put("/other/x", b"x")
    cache = make_cache(store, changes)
    task = asyncio.create_task(cache.run())
    await cache.synced.wait()
    assert snapshot(cache) == {P + "a": b"1"}
    assert cache.healthy
    await store.put(P + "b", b"2")
    await store.put(P + "a", b"3")
    await store.delete(P + "b")
    await until(lambda: cache.revision == store.revision)
    assert snapshot(cache) == {P + "a": b"3"}
    assert changes == [(P + "a", b"1"), (P + "b", b"2"), (P + "a", b"3"), (P + "b", None)]
    with pytest.raises(TypeError):
        cache.items()[P + "z"] = KeyValue(P + "z", b"", 0)  # type: ignore[index]
    task.cancel()


async def test_outage_keeps_state_and_resumes_without_loss_or_duplicates(
        changes: list[tuple[str, bytes | None]]) -> None:
    store = InMemoryStore()
    await store.put(P + "a", b"1")
    sleep = FakeSleep()
    cache = make_cache(store, changes, sleep)
    task = asyncio.create_task(cache.run())
    await cache.synced.wait()
    await until(lambda: store.calls >= 2)  # list + watch
    store.down = True
    await until(lambda: not cache.healthy)
    assert snapshot(cache) == {P + "a": b"1"}  # last-known state still served
    assert cache.last_error
    await until(lambda: len(sleep.calls) >= 3)  # it keeps retrying with backoff
    store.down = False
    # Writes made while the cache was disconnected must arrive through the resumed watch.
    await store.put(P + "b", b"2")
    await store.delete(P + "a")
    lists_before = cache.relists
    await until(lambda: cache.healthy and cache.revision == store.revision)
    assert snapshot(cache) == state(store) == {P + "b": b"2"}
    assert cache.relists == lists_before == 1  # resumed, not re-listed
    assert changes == [(P + "a", b"1"), (P + "b", b"2"), (P + "a", None)]
    task.cancel()


async def test_outage_is_logged_once(changes: list[tuple[str, bytes | None]]) -> None:
    store = InMemoryStore()
    sleep = FakeSleep()
    cache = make_cache(store, changes, sleep)
    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(cache.run())
        await cache.synced.wait()
        await until(lambda: store.calls >= 2)
        store.down = True
        await until(lambda: len(sleep.calls) >= 5)
        store.down = False
        await until(lambda: cache.healthy)
        task.cancel()
    events = [e["event"] for e in logs]
    assert events.count("watch_broken") == 1
    assert events.count("watch_resumed") == 1


async def test_compaction_during_outage_relists_and_converges(
        changes: list[tuple[str, bytes | None]]) -> None:
    store = InMemoryStore()
    await store.put(P + "a", b"1")
    await store.put(P + "b", b"1")
    cache = make_cache(store, changes)
    task = asyncio.create_task(cache.run())
    await cache.synced.wait()
    await until(lambda: store.calls >= 2)
    store.down = True
    await until(lambda: not cache.healthy)
    store.down = False
    # No await between here and the compaction: the cache cannot run in between.
    changes.clear()
    await store.delete(P + "a")
    await store.put(P + "b", b"2")
    await store.put(P + "c", b"3")
    store.compact(store.revision)
    await until(lambda: cache.healthy and cache.revision == store.revision)
    assert snapshot(cache) == state(store) == {P + "b": b"2", P + "c": b"3"}
    assert cache.relists == 2
    assert sorted(changes, key=lambda c: c[0]) == [(P + "a", None), (P + "b", b"2"), (P + "c", b"3")]
    task.cancel()


async def test_list_failure_backs_off_then_syncs(changes: list[tuple[str, bytes | None]]) -> None:
    store = InMemoryStore()
    await store.put(P + "a", b"1")
    store.fail_next(3)
    sleep = FakeSleep()
    cache = make_cache(store, changes, sleep)
    task = asyncio.create_task(cache.run())
    await cache.synced.wait()
    assert snapshot(cache) == {P + "a": b"1"}
    assert len(sleep.calls) == 3
    task.cancel()


def test_full_jitter_is_bounded() -> None:
    rng = random.Random(0)
    for attempt in range(40):
        d = full_jitter(attempt, 0.2, 5.0, rng)
        assert 0.0 <= d <= min(5.0, 0.2 * 2**attempt)


async def test_lease_keeper_regrants_and_reputs_after_lease_loss() -> None:
    store = InMemoryStore()
    keeper = LeaseKeeper(store, ttl_s=3, rng=random.Random(0), sleep=FakeSleep())
    await keeper.put("/tidegate/v1/routers/r1", b"me")  # before run: remembered
    task = asyncio.create_task(keeper.run())
    await until(lambda: "/tidegate/v1/routers/r1" in store.items())
    first = keeper.lease_id
    assert store.items()["/tidegate/v1/routers/r1"].lease == first
    store.expire_lease(first)
    assert "/tidegate/v1/routers/r1" not in store.items()
    await until(lambda: keeper.lease_id not in (0, first) and "/tidegate/v1/routers/r1" in store.items())
    assert store.items()["/tidegate/v1/routers/r1"].lease == keeper.lease_id
    store.down = True
    await until(lambda: store.calls > 20)
    store.down = False
    await keeper.delete("/tidegate/v1/routers/r1")
    assert "/tidegate/v1/routers/r1" not in store.items()
    await keeper.put("/tidegate/v1/routers/r2", b"me")
    await keeper.close()
    await until(task.done)
    assert store.leases == {} and store.items() == {}
