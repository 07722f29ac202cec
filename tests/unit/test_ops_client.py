"""The admin client against a real gRPC server on 127.0.0.1: bearer token, fail-over to the next
address, errors carried with their status (and never the token)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest

from tidegate.ops.client import AdminClient, AdminError
from tidegate.v1 import admin_pb2, admin_pb2_grpc, records_pb2

TOKEN = "s3cret-token-value"


class FakeAdmin(admin_pb2_grpc.AdminServicer):
    def __init__(self) -> None:
        self.seen_auth: list[str] = []

    async def ListReplicas(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        self.seen_auth.append(dict(context.invocation_metadata()).get("authorization", ""))
        if dict(context.invocation_metadata()).get("authorization") != f"Bearer {TOKEN}":
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown token")
        return admin_pb2.ListReplicasResponse(controlplane_id="fake", replicas=[
            admin_pb2.ReplicaSummary(replica_id="replica-0", pool=request.pool)])

    async def DescribeReplica(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        await context.abort(grpc.StatusCode.NOT_FOUND, f"replica {request.replica_id!r} is not known")

    async def WatchEvents(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        for i in range(3):
            yield records_pb2.Event(kind="cordon", replica_id=f"replica-{i}")


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, FakeAdmin]]:
    srv = grpc.aio.server()
    fake = FakeAdmin()
    admin_pb2_grpc.add_AdminServicer_to_server(fake, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    await srv.start()
    try:
        yield f"127.0.0.1:{port}", fake
    finally:
        await srv.stop(None)


def dead_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # closed on exit: nothing listens there


async def test_fails_over_to_the_address_that_answers(server: tuple[str, FakeAdmin]) -> None:
    address, fake = server
    async with AdminClient([dead_address(), address], TOKEN, timeout_s=5) as client:
        resp = await client.list_replicas(pool="m")
        assert resp.controlplane_id == "fake" and resp.replicas[0].pool == "m"
        assert client.address == address
    assert fake.seen_auth == [f"Bearer {TOKEN}"]


async def test_nobody_answers() -> None:
    async with AdminClient([dead_address(), dead_address()], TOKEN, timeout_s=5) as client:
        with pytest.raises(AdminError) as info:
            await client.list_pools()
    assert info.value.code == grpc.StatusCode.UNAVAILABLE and info.value.exit_code == 1
    assert "no control plane answered" in str(info.value)


async def test_server_errors_end_the_call_with_their_status(server: tuple[str, FakeAdmin]) -> None:
    address, _ = server
    async with AdminClient([address], "wrong-token-value", timeout_s=5) as client:
        with pytest.raises(AdminError) as info:
            await client.list_replicas()
        assert info.value.exit_code == 5 and "wrong-token-value" not in str(info.value)
        with pytest.raises(AdminError) as info:
            await client.describe_replica("nope")
        assert info.value.exit_code == 6 and "'nope'" in info.value.details


async def test_unimplemented_is_an_error(server: tuple[str, FakeAdmin]) -> None:
    address, _ = server
    async with AdminClient([address], TOKEN, timeout_s=5) as client:
        with pytest.raises(AdminError) as info:
            await client.list_budgets()
    assert info.value.code == grpc.StatusCode.UNIMPLEMENTED and info.value.exit_code == 1


async def test_watch_events_streams(server: tuple[str, FakeAdmin]) -> None:
    address, _ = server
    got = []
    async with AdminClient([dead_address(), address], TOKEN, timeout_s=5) as client:
        async for e in client.watch_events(retry_s=0.05):
            got.append(e.replica_id)
            if len(got) == 3:
                break
    assert got == ["replica-0", "replica-1", "replica-2"]
