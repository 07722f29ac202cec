"""The pool's SLO travels inside its routing table (TablePublisher): one record, one revision;
a changed target is a routing change; nothing is written before the SLOs were read."""

from __future__ import annotations

from tidegate import codec, keys
from tidegate.controlplane.publisher import TablePublisher
from tidegate.store.api import Fence
from tidegate.store.memory import InMemoryStore
from tidegate.v1 import records_pb2

RS = records_pb2.ReplicaState
SLO = records_pb2.PoolSlo(pool="m", ttft_s=2.0, tpot_s=0.1)


def entry(rid: str) -> records_pb2.RouteEntry:
    return records_pb2.RouteEntry(replica_id=rid, endpoint="http://x", state=RS.REPLICA_STATE_READY, weight=1.0)


async def test_slo_travels_in_the_table_and_is_a_change() -> None:
    store = InMemoryStore()
    await store.put("/lead", b"cp-0")
    fence = Fence("/lead", store.create_revision("/lead"))
    pub = TablePublisher(store, "cp-0")
    tables = {"m": [entry("r0")]}

    async def table() -> records_pb2.RoutingTable:
        return codec.decode((await store.get(keys.table("m"))).value, records_pb2.RoutingTable)

    assert await pub.publish(tables, lambda: fence, slos=None) == []   # SLOs not read yet: wait
    assert await pub.publish(tables, lambda: fence, slos={}) == ["m"]
    assert not (await table()).HasField("slo")
    assert await pub.publish(tables, lambda: fence, slos={"m": SLO}) == ["m"]
    t = await table()
    assert (t.generation, t.slo.ttft_s, t.slo.tpot_s) == (2, 2.0, 0.1)
    assert await pub.publish(tables, lambda: fence, slos={"m": SLO}) == []
    tighter = records_pb2.PoolSlo(pool="m", ttft_s=1.0, tpot_s=0.1)
    assert await pub.publish(tables, lambda: fence, slos={"m": tighter}) == ["m"]
    assert (await table()).slo.ttft_s == 1.0
    assert await pub.publish(tables, lambda: fence, slos={}) == ["m"]
    assert not (await table()).HasField("slo")


