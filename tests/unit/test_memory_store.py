"""InMemoryStore keeps the etcd semantics that the logic under test relies on."""

from __future__ import annotations

import pytest

from tidegate.errors import CompactedError, StoreError
from tidegate.store.api import LeaseNotFoundError, WatchEvent
from tidegate.store.memory import InMemoryStore


async def test_put_get_list_delete_and_revisions() -> None:
    s = InMemoryStore()
    r1 = await s.put("/p/a", b"1")
    r2 = await s.put("/p/b", b"2")
    await s.put("/q/c", b"3")
    assert r2 == r1 + 1
    kv = await s.get("/p/a")
    assert kv is not None and kv.value == b"1" and kv.mod_revision == r1
    listing = await s.list_prefix("/p/")
    assert [kv.key for kv in listing.items] == ["/p/a", "/p/b"]
    assert listing.revision == s.revision
    assert await s.delete("/p/a") is True
    assert await s.delete("/p/a") is False
    assert await s.get("/p/a") is None


async def test_watch_replays_from_start_revision_then_follows() -> None:
    s = InMemoryStore()
    r1 = await s.put("/p/a", b"1")
    await s.put("/q/x", b"x")
    w = s.watch_prefix("/p/", r1)
    assert await w.__anext__() == []  # established
    assert await w.__anext__() == [WatchEvent("/p/a", b"1", r1)]
    r3 = await s.put("/p/b", b"2")
    assert await w.__anext__() == [WatchEvent("/p/b", b"2", r3)]
    await w.aclose()


async def test_lease_expiry_deletes_keys_in_one_revision() -> None:
    s = InMemoryStore()
    lease = await s.grant_lease(5)
    await s.put("/p/a", b"1", lease=lease)
    await s.put("/p/b", b"2", lease=lease)
    w = s.watch_prefix("/p/", s.revision + 1)
    await w.__anext__()
    s.expire_lease(lease)
    batch = await w.__anext__()
    assert {e.key for e in batch} == {"/p/a", "/p/b"} and all(e.value is None for e in batch)
    assert len({e.mod_revision for e in batch}) == 1
    with pytest.raises(LeaseNotFoundError):
        await s.refresh_lease(lease)
    with pytest.raises(LeaseNotFoundError):
        await s.put("/p/c", b"3", lease=lease)
    await w.aclose()


async def test_compacted_start_revision_raises() -> None:
    s = InMemoryStore()
    r1 = await s.put("/p/a", b"1")
    r2 = await s.put("/p/a", b"2")
    s.compact(r2)
    with pytest.raises(CompactedError) as ei:
        await s.watch_prefix("/p/", r1).__anext__()
    assert ei.value.compact_revision == r2


async def test_down_and_fail_next() -> None:
    s = InMemoryStore()
    w = s.watch_prefix("/p/", 1)
    await w.__anext__()
    s.down = True
    with pytest.raises(StoreError):
        await w.__anext__()
    with pytest.raises(StoreError):
        await s.get("/p/a")
    s.down = False
    s.fail_next(1)
    with pytest.raises(StoreError):
        await s.get("/p/a")
    assert await s.get("/p/a") is None
