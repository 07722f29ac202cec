"""TablePublisher writes every changed pool of a tick at once: a pool whose write fails stays
unpublished (and is retried next time) without holding back the others."""

from __future__ import annotations

from tidegate import keys
from tidegate.controlplane.publisher import TablePublisher
from tidegate.errors import StoreError
from tidegate.store.api import Fence
from tidegate.store.memory import InMemoryStore
from tidegate.v1 import records_pb2

RS = records_pb2.ReplicaState


class FlakyStore(InMemoryStore):
    """Refuses table writes for the pools in `failing`."""

    def __init__(self) -> None:
        super().__init__()
        self.failing: set[str] = set()

    async def put_fenced(self, key: str, value: bytes, fence: Fence) -> int:
        if any(key == keys.table(p) for p in self.failing):
            raise StoreError("etcd unavailable")
        return await super().put_fenced(key, value, fence)


def tables(weight: float) -> dict[str, list[records_pb2.RouteEntry]]:
    return {p: [records_pb2.RouteEntry(replica_id=f"{p}-r0", endpoint="http://127.0.0.1:1",
                                       state=RS.REPLICA_STATE_READY, weight=weight)] for p in ("a", "b", "c")}


async def test_failed_pool_is_retried_and_others_are_written() -> None:
    store = FlakyStore()
    await store.put("/lead", b"cp-0")
    fence = Fence("/lead", store.create_revision("/lead"))
    pub = TablePublisher(store, "cp-0")
    store.failing = {"b"}
    assert await pub.publish(tables(10.0), lambda: fence) == ["a", "c"]
    assert (pub.generation("a"), pub.generation("b"), pub.generation("c")) == (1, 0, 1)
    store.failing = set()
    assert await pub.publish(tables(10.0), lambda: fence) == ["b"]       # only what was left
    assert await pub.publish(tables(20.0), lambda: fence) == ["a", "b", "c"]
    assert (pub.generation("a"), pub.generation("b"), pub.generation("c")) == (2, 2, 2)


async def test_nothing_is_written_without_a_fence() -> None:
    store = FlakyStore()
    pub = TablePublisher(store, "cp-0")
    assert await pub.publish(tables(10.0), lambda: None) == []
    assert not (await store.list_prefix(keys.TABLES)).items


async def test_only_the_given_pools_are_looked_at() -> None:
    store = FlakyStore()
    await store.put("/lead", b"cp-0")
    fence = Fence("/lead", store.create_revision("/lead"))
    pub = TablePublisher(store, "cp-0")
    assert await pub.publish(tables(10.0), lambda: fence) == ["a", "b", "c"]
    # Pools missing from `tables` but outside `only` are not emptied (a partial republish).
    assert await pub.publish({"b": tables(30.0)["b"]}, lambda: fence, only={"b"}) == ["b"]
    assert (pub.generation("a"), pub.generation("b"), pub.generation("c")) == (1, 2, 1)
    assert await pub.publish({}, lambda: fence, only={"c"}) == ["c"]   # inside `only`, missing = empty
    assert pub.previous()["c"] == ()


async def test_tables_from_older_views_never_overwrite_newer_ones() -> None:
    store = FlakyStore()
    await store.put("/lead", b"cp-0")
    fence = Fence("/lead", store.create_revision("/lead"))
    pub = TablePublisher(store, "cp-0")
    # An urgent republish of pool b from views taken at t=2 lands before a tick's tables from t=1.
    assert await pub.publish({"b": tables(30.0)["b"]}, lambda: fence, only={"b"}, computed_at=2.0) == ["b"]
    assert await pub.publish(tables(10.0), lambda: fence, computed_at=1.0) == ["a", "c"]
    assert pub.previous()["b"][0].weight == 30.0
    assert await pub.publish(tables(10.0), lambda: fence, computed_at=3.0) == ["b"]
