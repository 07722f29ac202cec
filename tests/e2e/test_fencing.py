"""Fenced leader writes against a real etcd: a deposed leader's write does not land."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from tidegate.controlplane.publisher import TablePublisher

from tidegate import codec, keys
from tidegate.store.api import Fence, FencedError
from tidegate.store.election import Election
from tidegate.store.etcd import EtcdStore
from tidegate.v1 import records_pb2

pytestmark = pytest.mark.e2e

NAME = "/tidegate/v1/election/fence-test"


@pytest.fixture
async def store(clean_etcd: str) -> AsyncIterator[EtcdStore]:
    async with EtcdStore([clean_etcd]) as s:
        yield s


def _entry(rid: str) -> records_pb2.RouteEntry:
    return records_pb2.RouteEntry(replica_id=rid, endpoint=f"http://{rid}", weight=10,
                                  state=records_pb2.ReplicaState.REPLICA_STATE_READY)


async def test_fenced_put_lands_only_while_the_election_key_holds(clean_etcd: str, store: EtcdStore) -> None:
    a = Election([clean_etcd], NAME, b"a", ttl_s=1)
    b = Election([clean_etcd], NAME, b"b", ttl_s=1)
    try:
        await asyncio.wait_for(a.campaign(), 10)
        fence_a = a.fence
        assert fence_a is not None and fence_a.key.startswith(NAME)
        await store.put_fenced(keys.table("m"), b"from-a", fence_a)
        assert (await store.get(keys.table("m"))).value == b"from-a"  # type: ignore[union-attr]

        # a freezes (stops refreshing, as a paused process would); its lease lapses and b leads.
        b_campaign = asyncio.create_task(b.campaign())
        await a.close()
        await asyncio.wait_for(b_campaign, 10)
        assert b.fence is not None and b.fence != fence_a

        with pytest.raises(FencedError):
            await store.put_fenced(keys.table("m"), b"from-deposed-a", fence_a)
        await store.put_fenced(keys.table("m"), b"from-b", b.fence)
        assert (await store.get(keys.table("m"))).value == b"from-b"  # type: ignore[union-attr]
        # A fence naming a key that never existed fails too.
        with pytest.raises(FencedError):
            await store.put_fenced(keys.table("m"), b"x", Fence(NAME + "/nope", 1))
    finally:
        await a.close()
        await b.close()


async def test_deposed_publisher_writes_nothing_and_steps_down(clean_etcd: str, store: EtcdStore) -> None:
    a = Election([clean_etcd], NAME, b"a", ttl_s=1)
    b = Election([clean_etcd], NAME, b"b", ttl_s=1)
    reasons: list[str] = []
    try:
        await asyncio.wait_for(a.campaign(), 10)
        stale_fence = a.fence
        publisher = TablePublisher(store, "cp-a", on_fenced=reasons.append)
        assert await publisher.publish({"m": [_entry("r1")]}, lambda: stale_fence) == ["m"]

        b_campaign = asyncio.create_task(b.campaign())
        await a.close()
        await asyncio.wait_for(b_campaign, 10)
        b_pub = TablePublisher(store, "cp-b")
        assert await b_pub.publish({"m": [_entry("r1"), _entry("r2")]}, lambda: b.fence) == ["m"]

        # The deposed leader still believes it leads (it never saw its lease lapse).
        assert await publisher.publish({"m": []}, lambda: stale_fence) == []
        assert reasons and "no longer holds" in reasons[0]
        kv = await store.get(keys.table("m"))
        table = codec.decode(kv.value, records_pb2.RoutingTable)  # type: ignore[union-attr]
        assert table.leader_id == "cp-b" and [r.replica_id for r in table.replicas] == ["r1", "r2"]
    finally:
        await a.close()
        await b.close()


async def test_step_down_ends_the_term(clean_etcd: str) -> None:
    a = Election([clean_etcd], NAME, b"a", ttl_s=2)
    try:
        await asyncio.wait_for(a.campaign(), 10)
        a.step_down("fenced")
        assert not a.is_leader and a.lost.is_set() and a.fence is None
    finally:
        await a.close()
