"""The control plane as a real process against a real etcd, with a test gRPC agent."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest
from cpkit import (  # type: ignore[import-not-found]
    AGENT_TOKEN,
    OPERATOR_MD,
    VIEWER_MD,
    FakeAgent,
    bearer,
    entry,
    eventually,
    leader_is,
    stop_cp,
    table_probe,
)

from tidegate import codec, keys
from tidegate.store.etcd import EtcdStore
from tidegate.v1 import admin_pb2, admin_pb2_grpc, records_pb2, telemetry_pb2, telemetry_pb2_grpc

pytestmark = pytest.mark.e2e
RS = records_pb2.ReplicaState


async def test_report_publishes_table_then_goes_stale(cps: Any, store: EtcdStore) -> None:
    cp = await cps("cp-a", "--stale-after-s", "1")
    agent = FakeAgent(cp.address).start()
    try:
        table = await eventually(table_probe(store, "m", lambda t: bool(
            (e := entry(t)) and e.weight > 0 and e.state == RS.REPLICA_STATE_READY)), 15, "a READY entry")
        assert table.leader_id == "cp-a" and table.schema_version == 1 and table.generation >= 1
        e = entry(table)
        assert e is not None and (e.endpoint, e.region, e.kv_free_tokens) == ("http://127.0.0.1:9999", "eu", 600)
        raw = json.loads((await store.get(keys.table("m"))).value)  # type: ignore[union-attr]
        assert raw["pool"] == "m" and raw["replicas"][0]["replicaId"] == "r1"
        assert agent.acks and agent.acks[-1].controlplane_id == "cp-a" and agent.acks[-1].weight == e.weight
        presence = await store.get(keys.replica("r1"))
        assert presence is not None
        assert codec.decode(presence.value, records_pb2.ReplicaPresence).controlplane_id == "cp-a"

        agent.sending.clear()  # stream stays open, reports stop
        gen = table.generation
        stale = await eventually(table_probe(store, "m", lambda t: bool(
            (e := entry(t)) and e.state == RS.REPLICA_STATE_STALE)), 10, "a STALE entry")
        assert entry(stale).weight == 0 and stale.generation > gen  # type: ignore[union-attr]
    finally:
        await agent.close()
    # Stream closed: the presence key goes away.
    await eventually(lambda: _absent(store, keys.replica("r1")), 10, "presence deleted")
    assert await stop_cp(cp) == 0


async def _absent(store: EtcdStore, key: str) -> bool:
    return await store.get(key) is None


async def test_stream_must_start_with_a_supported_hello(cps: Any) -> None:
    cp = await cps("cp-a")
    async with grpc.aio.insecure_channel(cp.address) as ch:
        stub = telemetry_pb2_grpc.TelemetryStub(ch)

        async def first_report() -> AsyncIterator[telemetry_pb2.AgentMessage]:
            yield telemetry_pb2.AgentMessage(report=telemetry_pb2.Report(seq=1))

        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stub.Stream(first_report(), metadata=bearer(AGENT_TOKEN)):
                pass
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Hello" in (err.value.details() or "")

        async def future_hello() -> AsyncIterator[telemetry_pb2.AgentMessage]:
            yield telemetry_pb2.AgentMessage(hello=telemetry_pb2.Hello(replica_id="x", pool="m",
                                                                       protocol_version=2))

        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stub.Stream(future_hello(), metadata=bearer(AGENT_TOKEN)):
                pass
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_cordon_via_admin_zeroes_weight(cps: Any, store: EtcdStore) -> None:
    cp = await cps("cp-a")
    agent = FakeAgent(cp.address).start()
    try:
        await eventually(table_probe(store, "m", lambda t: bool((e := entry(t)) and e.weight > 0)), 15, "ready")
        async with grpc.aio.insecure_channel(cp.address) as ch:
            admin = admin_pb2_grpc.AdminStub(ch)
            sel = admin_pb2.Selector(replica_ids=["r1"])
            r = await admin.Cordon(admin_pb2.CordonRequest(selector=sel, reason="test"), metadata=OPERATOR_MD)
            assert [(x.changed, x.message) for x in r.results] == [(True, "cordoned")]
            r = await admin.Cordon(admin_pb2.CordonRequest(selector=sel), metadata=OPERATOR_MD)
            assert [(x.changed, x.message) for x in r.results] == [(False, "already cordoned")]
            t = await eventually(table_probe(store, "m", lambda t: bool(
                (e := entry(t)) and e.state == RS.REPLICA_STATE_CORDONED)), 10, "CORDONED entry")
            assert entry(t).weight == 0  # type: ignore[union-attr]
            listed = await admin.ListReplicas(admin_pb2.ListReplicasRequest(pool="m"), metadata=VIEWER_MD)
            assert listed.leader and [s.state for s in listed.replicas] == [RS.REPLICA_STATE_CORDONED]
            r = await admin.Uncordon(admin_pb2.UncordonRequest(selector=sel), metadata=OPERATOR_MD)
            assert [x.message for x in r.results] == ["uncordoned"]
            await eventually(table_probe(store, "m", lambda t: bool((e := entry(t)) and e.weight > 0)), 10,
                             "routable again")
    finally:
        await agent.close()


async def test_standby_refuses_streams(cps: Any, store: EtcdStore) -> None:
    a = await cps("cp-a", "--election-ttl-s", "2")
    await eventually(lambda: leader_is(store, "cp-a"), 15, "cp-a to lead")
    b = await cps("cp-b", "--election-ttl-s", "2")
    async with grpc.aio.insecure_channel(b.address) as ch:
        stub = telemetry_pb2_grpc.TelemetryStub(ch)

        async def hello() -> AsyncIterator[telemetry_pb2.AgentMessage]:
            yield telemetry_pb2.AgentMessage(hello=telemetry_pb2.Hello(
                replica_id="x", pool="m", endpoint="http://127.0.0.1:9999", protocol_version=1))
            await asyncio.sleep(5)

        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stub.Stream(hello(), metadata=bearer(AGENT_TOKEN)):
                pass
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "standing by" in (err.value.details() or "")
    assert await stop_cp(a) == 0


async def test_only_leader_publishes_and_standby_takes_over(cps: Any, store: EtcdStore) -> None:
    a = await cps("cp-a", "--election-ttl-s", "2")
    b = await cps("cp-b", "--election-ttl-s", "2")
    # The agent knows both addresses; the standby refuses its stream, so it streams to the leader.
    agents = [FakeAgent([a.address, b.address]).start()]
    try:
        t = await eventually(table_probe(store, "m", lambda t: bool((e := entry(t)) and e.weight > 0)), 15,
                             "a table")
        leader = {"cp-a": a, "cp-b": b}[t.leader_id]
        standby = b if leader is a else a
        # The standby never writes while the leader lives.
        for _ in range(10):
            await asyncio.sleep(0.1)
            kv = await store.get(keys.table("m"))
            assert codec.decode(kv.value, records_pb2.RoutingTable).leader_id == leader.id  # type: ignore[union-attr]
        gen = codec.decode((await store.get(keys.table("m"))).value,  # type: ignore[union-attr]
                           records_pb2.RoutingTable).generation
        os.killpg(leader.proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        t2 = await eventually(table_probe(store, "m", lambda t: t.leader_id == standby.id), 15,
                              "the standby's table")
        print(f"failover: standby published {time.monotonic() - killed:.2f}s after kill -9 of the leader")
        assert t2.generation > gen
        # The agent reconnects to the new leader, which makes the replica routable again.
        t3 = await eventually(table_probe(store, "m", lambda t: bool(
            t.leader_id == standby.id and (e := entry(t)) and e.weight > 0)), 15, "a routable entry")
        assert entry(t3) is not None
        if leader is b:  # the agent tried cp-a first and was refused
            assert agents[0].refusals[0] == grpc.StatusCode.UNAVAILABLE
    finally:
        for ag in agents:
            await ag.close()
    assert await stop_cp(standby) == 0
