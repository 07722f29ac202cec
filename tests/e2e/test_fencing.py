"""Fenced leader writes against a real etcd: a deposed leader's write does not land."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry

from tidegate import codec, keys
from tidegate.controlplane.admission_budgets import BudgetPublisher
from tidegate.controlplane.fleet import FleetState
from tidegate.controlplane.publisher import TablePublisher
from tidegate.controlplane.slo import ScaleReporter
from tidegate.policy.weights import WeightPolicyConfig
from tidegate.store.api import Fence, FencedError
from tidegate.store.election import Election
from tidegate.store.etcd import EtcdStore
from tidegate.v1 import records_pb2

pytestmark = pytest.mark.e2e

NAME = "/tidegate/v1/election/fence-test"


def _entry(rid: str) -> records_pb2.RouteEntry:
    return records_pb2.RouteEntry(replica_id=rid, endpoint=f"http://{rid}", weight=10,
                                  state=records_pb2.ReplicaState.REPLICA_STATE_READY,
                                  kv_capacity_tokens=100_000, prefill_tokens_per_s=10_000,
                                  decode_step_base_ms=20, decode_step_per_seq_ms=0.5)


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
        # Deletes too (fault records, intents): the deposed leader's leaves the key in place.
        with pytest.raises(FencedError):
            await store.delete_fenced(keys.table("m"), fence_a)
        assert (await store.get(keys.table("m"))).value == b"from-b"  # type: ignore[union-attr]
        assert await store.delete_fenced(keys.table("m"), b.fence)
        assert await store.get(keys.table("m")) is None
        assert not await store.delete_fenced(keys.table("m"), b.fence)
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


async def test_deposed_leaders_scale_and_budget_records_do_not_land(clean_etcd: str, store: EtcdStore) -> None:
    a = Election([clean_etcd], NAME, b"a", ttl_s=1)
    b = Election([clean_etcd], NAME, b"b", ttl_s=1)
    reasons: list[str] = []
    tables = {"m": [_entry("r1"), _entry("r2")]}
    slos = {"m": records_pb2.PoolSlo(pool="m", ttft_s=2.0, tpot_s=0.1)}
    fleet = FleetState(WeightPolicyConfig(), now=time.monotonic)

    def writers(cp: str) -> tuple[ScaleReporter, BudgetPublisher]:
        scale = ScaleReporter(store, cp, registry=CollectorRegistry(), on_fenced=reasons.append)
        budgets = BudgetPublisher(store, cp, on_fenced=reasons.append)
        scale.compute(tables, fleet, slos)
        budgets.compute(tables, fleet, slos, {f"router-of-{cp}"}, {})
        return scale, budgets

    async def leaders() -> tuple[str, str]:
        scale_kv, budget_kv = await store.get(keys.scale("m")), await store.get(keys.admission("m"))
        assert scale_kv is not None and budget_kv is not None
        return (codec.decode(scale_kv.value, records_pb2.ScaleRecommendation).leader_id,
                codec.decode(budget_kv.value, records_pb2.AdmissionBudget).leader_id)

    try:
        await asyncio.wait_for(a.campaign(), 10)
        stale_fence = a.fence
        a_scale, a_budgets = writers("cp-a")
        assert await a_scale.publish(lambda: stale_fence) == ["m"]
        assert await a_budgets.publish(lambda: stale_fence) == ["m"]

        b_campaign = asyncio.create_task(b.campaign())
        await a.close()
        await asyncio.wait_for(b_campaign, 10)
        b_scale, b_budgets = writers("cp-b")
        assert await b_scale.publish(lambda: b.fence) == ["m"]
        assert await b_budgets.publish(lambda: b.fence) == ["m"]
        assert await leaders() == ("cp-b", "cp-b")

        # The deposed leader still believes it leads, and its records are due (as at a refresh).
        a_scale.reset()
        a_budgets.reset()
        assert await a_scale.publish(lambda: stale_fence) == []
        assert await a_budgets.publish(lambda: stale_fence) == []
        assert len(reasons) == 2 and all("no longer holds" in r for r in reasons)
        assert await leaders() == ("cp-b", "cp-b")
    finally:
        await a.close()
        await b.close()
