"""A cordon (or uncordon) over several replicas that fails midway, through the real Admin gRPC
service on an in-memory store: each replica lands on its own, what landed stays, and the error
says which replicas changed, which one was being written and which were not attempted; running
it again finishes the job."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import grpc.aio
import pytest
from test_fleet_state import FakeClock, hello, report  # type: ignore[import-not-found]

from tidegate import keys
from tidegate.controlplane.admin import AdminService
from tidegate.controlplane.auth import OPERATOR, Authenticator, Principal
from tidegate.controlplane.events import EventLog
from tidegate.controlplane.fleet import FleetState
from tidegate.controlplane.publisher import TablePublisher
from tidegate.errors import StoreError
from tidegate.ops import exitcodes
from tidegate.ops.client import AdminClient, AdminError
from tidegate.policy.weights import WeightPolicyConfig
from tidegate.store.api import Fence
from tidegate.store.memory import InMemoryStore
from tidegate.v1 import admin_pb2, admin_pb2_grpc

MD = (("authorization", "Bearer op-token"),)
IDS = ["r1", "r2", "r3"]
ALL = admin_pb2.Selector(replica_ids=IDS)


class FlakyStore(InMemoryStore):
    """Fails the `fail_at`-th fenced write (1-based) before it lands; 0: never."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_at = 0
        self.writes = 0

    def _maybe_fail(self) -> None:
        self.writes += 1
        if self.writes == self.fail_at:
            raise StoreError("etcd went away")

    async def put_fenced(self, key: str, value: bytes, fence: Fence) -> int:
        self._maybe_fail()
        return await super().put_fenced(key, value, fence)

    async def delete_fenced(self, key: str, fence: Fence) -> bool:
        self._maybe_fail()
        return await super().delete_fenced(key, fence)


@dataclass
class Admin:
    store: FlakyStore
    stub: admin_pb2_grpc.AdminStub
    address: str


@pytest.fixture
async def admin() -> AsyncIterator[Admin]:
    store = FlakyStore()
    await store.put("/fence", b"cp-a")
    fence = Fence("/fence", store.create_revision("/fence"))
    fleet = FleetState(WeightPolicyConfig(), now=FakeClock())
    for rid in IDS:
        fleet.on_report(hello(rid), report())
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    svc = AdminService(fleet, store, TablePublisher(store, "cp-a"), "cp-a", lambda: True,
                       auth=Authenticator({"op-token": Principal("alice", OPERATOR)}), events=EventLog(store, "cp-a"),
                       fence=lambda: fence, on_fenced=lambda _: None)
    admin_pb2_grpc.add_AdminServicer_to_server(svc, server)
    await server.start()
    try:
        yield Admin(store, admin_pb2_grpc.AdminStub(channel), f"127.0.0.1:{port}")
    finally:
        await channel.close()
        await server.stop(None)
        await svc.close()


async def intents(store: InMemoryStore) -> list[str]:
    return [rid for rid in IDS if await store.get(keys.intent(rid)) is not None]


async def test_a_cordon_failing_midway_says_what_landed_and_a_rerun_finishes(admin: Admin) -> None:
    admin.store.fail_at = 2                               # r1 lands, r2's write fails
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await admin.stub.Cordon(admin_pb2.CordonRequest(selector=ALL, force=True), metadata=MD)
    details = err.value.details() or ""
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "etcd went away" in details
    assert "cordoned before the failure (these stand): r1;" in details
    assert "written when it failed, may or may not have landed: r2;" in details
    assert "not attempted: r3;" in details
    assert await intents(admin.store) == ["r1"]           # what the message says is what is stored
    admin.store.fail_at = 0
    out = await admin.stub.Cordon(admin_pb2.CordonRequest(selector=ALL, force=True), metadata=MD)
    assert [(r.replica_id, r.changed, r.message) for r in out.results] == [
        ("r1", False, "already cordoned"), ("r2", True, "cordoned"), ("r3", True, "cordoned")]
    assert await intents(admin.store) == IDS


async def test_an_uncordon_failing_midway_names_the_unchanged_and_untried(admin: Admin) -> None:
    await admin.stub.Cordon(admin_pb2.CordonRequest(selector=admin_pb2.Selector(replica_ids=["r2", "r3"]),
                                                    force=True), metadata=MD)
    admin.store.writes, admin.store.fail_at = 0, 2        # r1 unchanged, r2 uncordoned, r3's delete fails
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await admin.stub.Uncordon(admin_pb2.UncordonRequest(selector=ALL), metadata=MD)
    details = err.value.details() or ""
    assert ("[partial uncordon: uncordoned before the failure (these stand): r2; left as they were: r1; "
            "written when it failed, may or may not have landed: r3; running it again is safe]") in details
    assert await intents(admin.store) == ["r3"]


async def test_a_failure_before_any_write_says_none_landed(admin: Admin) -> None:
    admin.store.fail_at = 1
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await admin.stub.Cordon(admin_pb2.CordonRequest(selector=ALL, force=True), metadata=MD)
    details = err.value.details() or ""
    assert "cordoned before the failure (these stand): none;" in details and "not attempted: r2, r3;" in details
    assert await intents(admin.store) == []


async def test_the_cli_client_shows_the_partial_result(admin: Admin) -> None:
    """What `tidegate cordon r1 r2 r3` prints and exits with (tidegate.ops.commands.base.execute
    prints str(AdminError)): UNAVAILABLE makes the client try its other addresses, so the partial
    result must survive in the message it gives up with."""
    admin.store.fail_at = 3
    async with AdminClient([admin.address], "op-token") as client:
        with pytest.raises(AdminError) as err:
            await client.cordon(ALL, "", False, True)
    assert err.value.exit_code == exitcodes.ERROR
    assert ("[partial cordon: cordoned before the failure (these stand): r1, r2; written when it failed, "
            "may or may not have landed: r3; running it again is safe]") in str(err.value)
