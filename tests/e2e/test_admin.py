"""Admin API end to end: real control-plane processes, real etcd, real gRPC with tokens."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from cpkit import (  # type: ignore[import-not-found]
    OPERATOR_MD,
    TIDEGATE,
    VIEWER_MD,
    FakeAgent,
    entry,
    eventually,
    leader_is,
    stop_cp,
    table_probe,
)

from tidegate import codec, keys
from tidegate.store.etcd import EtcdStore
from tidegate.v1 import admin_pb2, admin_pb2_grpc, records_pb2, telemetry_pb2

pytestmark = pytest.mark.e2e
RS = records_pb2.ReplicaState


class Agent(FakeAgent):
    """A FakeAgent (reconnecting across addresses) whose reports carry `running`, `waiting` and
    `xids` (sent once)."""

    def __init__(self, addresses: list[str], replica_id: str, pool: str = "m", region: str = "eu") -> None:
        super().__init__(addresses, replica_id=replica_id, pool=pool, interval_s=0.1)
        self.hello = telemetry_pb2.Hello(replica_id=replica_id, pool=pool, endpoint=f"http://127.0.0.1:1/{replica_id}",
                                         region=region, zone=f"{region}-1", protocol_version=1)
        self.running = 0
        self.waiting = 0
        self.xids: list[int] = []

    async def _messages(self) -> AsyncIterator[telemetry_pb2.AgentMessage]:
        yield telemetry_pb2.AgentMessage(hello=self.hello)
        seq = 0
        while not self._stop.is_set():
            seq += 1
            r = telemetry_pb2.Report(seq=seq, gpu_telemetry_available=True, engine=telemetry_pb2.EngineStats(
                healthy=True, num_requests_running=self.running, num_requests_waiting=self.waiting,
                kv_capacity_tokens=1000, kv_free_tokens=600, has_kv_capacity=True))
            g = r.gpus.add(index=0, memory_total_bytes=80 << 30)
            if self.xids:
                g.xid_events.extend(self.xids)
                self.xids = []
            yield telemetry_pb2.AgentMessage(report=r)
            await asyncio.sleep(self.interval_s)


def sel(*ids: str) -> admin_pb2.Selector:
    return admin_pb2.Selector(replica_ids=list(ids))


async def routable(etcd: EtcdStore, *ids: str) -> None:
    await eventually(table_probe(etcd, "m", lambda t: all(
        (e := entry(t, rid)) is not None and e.weight > 0 for rid in ids)), 15, f"{ids} routable")


async def table_entry(etcd: EtcdStore, rid: str) -> records_pb2.RouteEntry:
    kv = await etcd.get(keys.table("m"))
    assert kv is not None
    e = entry(codec.decode(kv.value, records_pb2.RoutingTable), rid)
    assert e is not None
    return e


def drain_progress(admin: Any, rid: str, pred: Any) -> Any:
    async def probe() -> admin_pb2.DrainProgress | None:
        r = await admin.DrainStatus(admin_pb2.DrainStatusRequest(replica_ids=[rid]), metadata=VIEWER_MD)
        return r.replicas[0] if pred(r.replicas[0]) else None
    return probe


async def kinds(admin: Any, rid: str = "") -> list[str]:
    r = await admin.ListEvents(admin_pb2.ListEventsRequest(replica_id=rid), metadata=VIEWER_MD)
    return [e.kind for e in r.events]


async def test_tokens_roles_and_bad_token_file(cps: Any, store: EtcdStore, tmp_path: Path) -> None:
    cp = await cps("cp-a")
    async with grpc.aio.insecure_channel(cp.address) as ch:
        admin = admin_pb2_grpc.AdminStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await admin.ListReplicas(admin_pb2.ListReplicasRequest())
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await admin.ListReplicas(admin_pb2.ListReplicasRequest(), metadata=(("authorization", "Bearer nope"),))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        await eventually(lambda: leader_is(store, "cp-a"), 15, "cp-a leads")
        # The election record names cp-a a moment before cp-a's campaign returns; in between it
        # answers UNAVAILABLE ("retry"), as a client is told to.
        await eventually(_serves(admin), 10, "cp-a serves as leader")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await admin.Cordon(admin_pb2.CordonRequest(selector=sel("r1")), metadata=VIEWER_MD)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await admin.SetBudget(admin_pb2.SetBudgetRequest(budget=records_pb2.DisruptionBudget(
                scope="pool:m", min_available="1")), metadata=VIEWER_MD)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    bad = tmp_path / "bad.csv"
    bad.write_text("# ok\ntok,alice,operator\ntok2,bob,admin\n")
    proc = await asyncio.create_subprocess_exec(
        TIDEGATE, "controlplane", "--etcd", "127.0.0.1:1", "--auth-tokens-file", str(bad),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err_text = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert b"line 3" in err_text and b"admin" in err_text and b"tok2" not in err_text


async def test_cordon_is_immediate_budget_refuses_force_overrides(cps: Any, store: EtcdStore) -> None:
    cp = await cps("cp-a")
    agents = [Agent([cp.address], rid).start() for rid in ("r1", "r2")]
    try:
        await routable(store, "r1", "r2")
        async with grpc.aio.insecure_channel(cp.address) as ch:
            admin = admin_pb2_grpc.AdminStub(ch)
            b = await admin.SetBudget(admin_pb2.SetBudgetRequest(budget=records_pb2.DisruptionBudget(
                scope="pool:m", min_available="100%")), metadata=OPERATOR_MD)
            assert b.budget.actor == "sre:alice"
            listed = await admin.ListBudgets(admin_pb2.ListBudgetsRequest(), metadata=VIEWER_MD)
            assert [x.scope for x in listed.budgets] == ["pool:m"]
            r = await admin.Cordon(admin_pb2.CordonRequest(selector=sel("r1"), reason="maint"), metadata=OPERATOR_MD)
            assert r.results[0].refused and not r.results[0].changed
            assert "pool:m min_available=100% would be violated (1 of 2 would remain available" in r.results[0].message
            assert (await table_entry(store, "r1")).weight > 0
            dry = await admin.Cordon(admin_pb2.CordonRequest(selector=sel("r1"), force=True, dry_run=True),
                                     metadata=OPERATOR_MD)
            assert dry.results[0].message == "would be cordoned (dry run)"
            assert await store.get(keys.intent("r1")) is None
            r = await admin.Cordon(admin_pb2.CordonRequest(selector=sel("r1"), reason="maint", force=True),
                                   metadata=OPERATOR_MD)
            assert [(x.changed, x.message) for x in r.results] == [(True, "cordoned")]
            # Published before the RPC returned: read etcd right away.
            e = await table_entry(store, "r1")
            assert (e.state, e.weight) == (RS.REPLICA_STATE_CORDONED, 0)
            intent = codec.decode((await store.get(keys.intent("r1"))).value,  # type: ignore[union-attr]
                                  records_pb2.ReplicaIntent)
            assert (intent.actor, intent.reason) == ("sre:alice", "maint")
            pools = await admin.ListPools(admin_pb2.ListPoolsRequest(), metadata=VIEWER_MD)
            p = pools.pools[0]
            assert (p.pool, p.available, dict(p.replicas_by_state)) == ("m", 1, {"cordoned": 1, "ready": 1})
            # No pool SLO: no scale recommendation (not a guess), and the summary says why.
            assert p.budgets[0].min_available == "100%" and p.recommended_replicas == 0
            assert not p.HasField("slo") and "no SLO" in p.scale.reason
            assert p.slo_attainment == -1
            r = await admin.Uncordon(admin_pb2.UncordonRequest(selector=sel("r1")), metadata=OPERATOR_MD)
            assert r.results[0].message == "uncordoned"
            assert (await table_entry(store, "r1")).weight > 0
            ev = await admin.ListEvents(admin_pb2.ListEventsRequest(), metadata=VIEWER_MD)
            got = [(e.kind, e.replica_id, e.actor) for e in ev.events if e.kind != "leader"]
            assert got == [("budget_changed", "", "sre:alice"), ("cordon", "r1", "sre:alice"),
                           ("uncordon", "r1", "sre:alice")]
    finally:
        for a in agents:
            await a.close()


async def test_drain_waits_for_engine_and_routers(cps: Any, store: EtcdStore) -> None:
    cp = await cps("cp-a")
    agent = Agent([cp.address], "r1")
    agent.running = 1
    agent.start()
    try:
        await routable(store, "r1")
        presence = records_pb2.RouterPresence(router_id="rt1", inflight_by_replica={"r1": 2})
        await store.put(keys.router("rt1"), codec.encode(presence))
        async with grpc.aio.insecure_channel(cp.address) as ch:
            admin = admin_pb2_grpc.AdminStub(ch)
            r = await admin.Drain(admin_pb2.DrainRequest(selector=sel("r1"), timeout_s=60, reason="kernel"),
                                  metadata=OPERATOR_MD)
            assert [(x.changed, x.message) for x in r.results] == [(True, "draining")]
            e = await table_entry(store, "r1")
            assert (e.state, e.weight) == (RS.REPLICA_STATE_DRAINING, 0)
            agent.running = 0
            p = await eventually(drain_progress(admin, "r1", lambda p: p.running == 0 and p.router_inflight == 2),
                                 10, "engine idle, routers busy")
            assert p.state == RS.REPLICA_STATE_DRAINING and not p.done and p.deadline.seconds > time.time()
            await store.delete(keys.router("rt1"))
            p = await eventually(drain_progress(admin, "r1", lambda p: p.done), 10, "drained")
            assert p.state == RS.REPLICA_STATE_DRAINED
            assert "drain_complete" in await eventually(lambda: _has(admin, "r1", "drain_complete"), 10, "event")
            d = await admin.DescribeReplica(admin_pb2.DescribeReplicaRequest(replica_id="r1"), metadata=VIEWER_MD)
            assert d.intent.draining and any("draining by sre:alice (kernel)" in x for x in d.reasons)
            assert [x.kind for x in d.events][:2] == ["drain", "drain_complete"]
    finally:
        await agent.close()


async def _has(admin: Any, rid: str, kind: str) -> list[str] | None:
    got = await kinds(admin, rid)
    return got if kind in got else None


async def test_drain_timeout_then_force(cps: Any, store: EtcdStore) -> None:
    cp = await cps("cp-a")
    agents = {rid: Agent([cp.address], rid) for rid in ("r1", "r2")}
    for a in agents.values():
        a.running = 1  # a request that outlives the deadline
        a.start()
    try:
        await routable(store, "r1", "r2")
        async with grpc.aio.insecure_channel(cp.address) as ch:
            admin = admin_pb2_grpc.AdminStub(ch)
            await admin.Drain(admin_pb2.DrainRequest(selector=sel("r1"), timeout_s=1), metadata=OPERATOR_MD)
            await admin.Drain(admin_pb2.DrainRequest(selector=sel("r2"), timeout_s=1, force=True),
                              metadata=OPERATOR_MD)
            await eventually(lambda: _has(admin, "r1", "drain_timeout"), 10, "drain_timeout event")
            r = await admin.DrainStatus(admin_pb2.DrainStatusRequest(replica_ids=["r1", "r2"]), metadata=VIEWER_MD)
            p1, _ = r.replicas
            assert (p1.state, p1.done, p1.running) == (RS.REPLICA_STATE_DRAINING, False, 1)
            assert p1.deadline.ToNanoseconds() / 1e9 <= time.time()
            p2 = await eventually(drain_progress(admin, "r2", lambda p: p.done), 10, "forced drain")
            assert p2.state == RS.REPLICA_STATE_DRAINED and p2.running == 1
            assert "drain_forced" in await kinds(admin, "r2")
    finally:
        for a in agents.values():
            await a.close()


async def test_restart_mid_drain_keeps_intent(cps: Any, store: EtcdStore) -> None:
    a = await cps("cp-a", "--election-ttl-s", "2")
    agent = Agent([a.address], "r1")
    agent.running = 1
    agent.start()
    try:
        await routable(store, "r1")
        async with grpc.aio.insecure_channel(a.address) as ch:
            admin = admin_pb2_grpc.AdminStub(ch)
            await admin.Drain(admin_pb2.DrainRequest(selector=sel("r1"), timeout_s=120), metadata=OPERATOR_MD)
        assert await stop_cp(a) == 0
        b = await cps("cp-b", "--election-ttl-s", "2")
        await eventually(lambda: leader_is(store, "cp-b"), 15, "cp-b leads")
        agent.channels.append(grpc.aio.insecure_channel(b.address))
        intent = await store.get(keys.intent("r1"))
        assert intent is not None and codec.decode(intent.value, records_pb2.ReplicaIntent).draining
        async with grpc.aio.insecure_channel(b.address) as ch:
            admin = admin_pb2_grpc.AdminStub(ch)
            p = await eventually(drain_progress(admin, "r1", lambda p: p.state == RS.REPLICA_STATE_DRAINING), 20,
                                 "cp-b sees the drain")
            assert not p.done
            agent.running = 0
            await eventually(drain_progress(admin, "r1", lambda p: p.done), 10, "drained on cp-b")
            t = await eventually(table_probe(store, "m", lambda t: t.leader_id == "cp-b"), 10, "cp-b's table")
            assert entry(t).state in (RS.REPLICA_STATE_DRAINING, RS.REPLICA_STATE_DRAINED)  # type: ignore[union-attr]
    finally:
        await agent.close()


async def test_standby_forwards_to_leader(cps: Any, store: EtcdStore) -> None:
    a = await cps("cp-a", "--election-ttl-s", "2")
    await eventually(lambda: leader_is(store, "cp-a"), 15, "cp-a leads")
    b = await cps("cp-b", "--election-ttl-s", "2")
    agent = Agent([a.address], "r1").start()
    try:
        await routable(store, "r1")
        async with grpc.aio.insecure_channel(b.address) as ch:
            admin = admin_pb2_grpc.AdminStub(ch)
            listed = await admin.ListReplicas(admin_pb2.ListReplicasRequest(), metadata=VIEWER_MD)
            assert listed.controlplane_id == "cp-a" and [s.replica_id for s in listed.replicas] == ["r1"]
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await admin.Cordon(admin_pb2.CordonRequest(selector=sel("r1")), metadata=VIEWER_MD)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            r = await admin.Cordon(admin_pb2.CordonRequest(selector=sel("r1")), metadata=OPERATOR_MD)
            assert r.results[0].message == "cordoned"
            assert (await table_entry(store, "r1")).weight == 0
    finally:
        await agent.close()


def _serves(admin: Any) -> Any:
    async def probe() -> bool:
        try:
            await admin.ListReplicas(admin_pb2.ListReplicasRequest(), metadata=VIEWER_MD)
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return False
        return True
    return probe


async def test_xid_ejects_and_events_stream(cps: Any, store: EtcdStore) -> None:
    cp = await cps("cp-a")
    agent = Agent([cp.address], "r1").start()
    try:
        await routable(store, "r1")
        async with grpc.aio.insecure_channel(cp.address) as ch:
            admin = admin_pb2_grpc.AdminStub(ch)
            watch = admin.WatchEvents(admin_pb2.WatchEventsRequest(replica_id="r1"), metadata=VIEWER_MD)
            await asyncio.sleep(0.3)  # the watch is registered before the fault
            agent.xids = [79]
            ev = await asyncio.wait_for(watch.read(), 10)
            assert ev.kind == "eject" and "critical Xid 79" in ev.reason and "not recoverable" in ev.reason
            assert ev.actor == "controlplane:cp-a"
            watch.cancel()
            t = await eventually(table_probe(store, "m", lambda t: bool(
                (e := entry(t)) and e.state == RS.REPLICA_STATE_EJECTED)), 10, "EJECTED entry")
            assert entry(t).weight == 0  # type: ignore[union-attr]
            d = await admin.DescribeReplica(admin_pb2.DescribeReplicaRequest(replica_id="r1"), metadata=VIEWER_MD)
            assert d.summary.state == RS.REPLICA_STATE_EJECTED
            assert any("Xid 79" in x for x in d.reasons) and [e.kind for e in d.events] == ["eject"]
            assert (await kinds(admin))[-1] == "eject"
    finally:
        await agent.close()
