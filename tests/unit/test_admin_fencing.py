"""Intent changes (cordon, uncordon) are leader-only writes fenced by the leader's term, through
the real Admin gRPC service on an in-memory store: a deposed leader that still believes it leads
lands nothing, ends its term and answers UNAVAILABLE; the current leader's change lands."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import grpc.aio
import pytest
from test_fleet_state import FakeClock, hello, report  # type: ignore[import-not-found]

from tidegate import codec, keys
from tidegate.controlplane.admin import AdminService
from tidegate.controlplane.auth import OPERATOR, Authenticator, Principal
from tidegate.controlplane.events import EventLog
from tidegate.controlplane.fleet import FleetState
from tidegate.controlplane.publisher import TablePublisher
from tidegate.policy.weights import WeightPolicyConfig
from tidegate.store.api import Fence
from tidegate.store.memory import InMemoryStore
from tidegate.v1 import admin_pb2, admin_pb2_grpc, records_pb2

FENCE_KEY = "/tidegate/v1/election/controlplane/1"
MD = (("authorization", "Bearer op-token"),)
R1 = admin_pb2.Selector(replica_ids=["r1"])


@dataclass
class Admin:
    store: InMemoryStore
    stub: admin_pb2_grpc.AdminStub
    fence: Fence | None = None
    reasons: list[str] = field(default_factory=list)


async def term(store: InMemoryStore, holder: bytes) -> Fence:
    """A new term: the election key (re)created, its fence."""
    await store.delete(FENCE_KEY)
    await store.put(FENCE_KEY, holder)
    return Fence(FENCE_KEY, store.create_revision(FENCE_KEY))


@pytest.fixture
async def admin() -> AsyncIterator[Admin]:
    store = InMemoryStore()
    fleet = FleetState(WeightPolicyConfig(), now=FakeClock())
    fleet.on_report(hello("r1"), report())
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    a = Admin(store, admin_pb2_grpc.AdminStub(channel))
    svc = AdminService(fleet, store, TablePublisher(store, "cp-a"), "cp-a", lambda: True,
                       auth=Authenticator({"op-token": Principal("alice", OPERATOR)}), events=EventLog(store, "cp-a"),
                       fence=lambda: a.fence, on_fenced=a.reasons.append)
    admin_pb2_grpc.add_AdminServicer_to_server(svc, server)
    await server.start()
    try:
        yield a
    finally:
        await channel.close()
        await server.stop(None)
        await svc.close()


async def test_a_deposed_leaders_cordon_does_not_land_and_ends_its_term(admin: Admin) -> None:
    admin.fence = await term(admin.store, b"cp-a")
    await term(admin.store, b"cp-b")                      # a successor leads; cp-a has not noticed
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await admin.stub.Cordon(admin_pb2.CordonRequest(selector=R1, force=True), metadata=MD)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "no longer the leader" in (err.value.details() or "")
    assert await admin.store.get(keys.intent("r1")) is None
    assert len(admin.reasons) == 1 and "no longer holds" in admin.reasons[0]


async def test_a_deposed_leaders_uncordon_keeps_its_successors_intent(admin: Admin) -> None:
    admin.fence = await term(admin.store, b"cp-a")
    theirs = codec.encode(records_pb2.ReplicaIntent(replica_id="r1", cordoned=True, actor="sre:bob"))
    await term(admin.store, b"cp-b")
    await admin.store.put(keys.intent("r1"), theirs)     # the successor cordoned r1
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await admin.stub.Uncordon(admin_pb2.UncordonRequest(selector=R1), metadata=MD)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert (await admin.store.get(keys.intent("r1"))).value == theirs  # type: ignore[union-attr]
    assert admin.reasons


async def test_not_leading_writes_nothing_and_the_leaders_change_lands(admin: Admin) -> None:
    admin.fence = None                                    # between terms
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await admin.stub.Cordon(admin_pb2.CordonRequest(selector=R1, force=True), metadata=MD)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert await admin.store.get(keys.intent("r1")) is None
    admin.fence = await term(admin.store, b"cp-a")
    out = await admin.stub.Cordon(admin_pb2.CordonRequest(selector=R1, force=True), metadata=MD)
    assert [(r.replica_id, r.changed) for r in out.results] == [("r1", True)]
    kv = await admin.store.get(keys.intent("r1"))
    assert kv is not None and codec.decode(kv.value, records_pb2.ReplicaIntent).cordoned
    out = await admin.stub.Uncordon(admin_pb2.UncordonRequest(selector=R1), metadata=MD)
    assert [(r.replica_id, r.changed) for r in out.results] == [("r1", True)]
    assert await admin.store.get(keys.intent("r1")) is None
    assert admin.reasons == []
