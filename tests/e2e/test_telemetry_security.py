"""Telemetry authentication and replica-id binding against a real control plane, real etcd and
real gRPC: rogue clients (no token, a wrong token, another identity's token; claiming a new id
and an existing one) are refused and etcd never lists their endpoint; a hijack leaves the
replica's endpoint alone; the legitimate agent restarting takes its id over."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from cpkit import (  # type: ignore[import-not-found]
    AGENT_TOKEN,
    NODE_A_TOKEN,
    NODE_B_TOKEN,
    FakeAgent,
    bearer,
    entry,
    eventually,
    leader_is,
    start_cp,
    stop_cp,
    table_probe,
)

from tidegate import codec, keys
from tidegate.store.etcd import EtcdStore
from tidegate.v1 import records_pb2, telemetry_pb2, telemetry_pb2_grpc

pytestmark = pytest.mark.e2e
RS = records_pb2.ReplicaState

LEGIT = "http://127.0.0.1:9001"
RESTARTED = "http://127.0.0.1:9002"
ROGUE = "http://127.0.0.1:6666"  # inside the allowed networks: only authentication stands in the way
C = grpc.StatusCode
SETTLE_S = 2.0


class EtcdRecorder:
    """Every value written under /tidegate/v1/ while it runs (a watch from the start revision)."""

    def __init__(self, etcd: EtcdStore) -> None:
        self.values: list[bytes] = []
        self._etcd = etcd
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> EtcdRecorder:
        start = (await self._etcd.list_prefix(keys.PREFIX)).revision + 1
        established = asyncio.Event()

        async def run() -> None:
            async for batch in self._etcd.watch_prefix(keys.PREFIX, start):
                established.set()
                self.values.extend(ev.value for ev in batch if ev.value is not None)

        self._task = asyncio.create_task(run())
        await asyncio.wait_for(established.wait(), 10)
        return self

    def mentions(self, text: str) -> bool:
        return any(text.encode() in v for v in self.values)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def hello(replica_id: str, endpoint: str) -> telemetry_pb2.Hello:
    return telemetry_pb2.Hello(replica_id=replica_id, pool="m", endpoint=endpoint, region="eu", zone="eu-1",
                               protocol_version=1, engine_kind="test")


async def one_stream(address: str, token: str | None, h: telemetry_pb2.Hello, seconds: float = 1.0) -> C:
    """Hello, then healthy reports for `seconds`, one at a time, each after the previous one's Ack;
    the status the stream ended with (OK when the server kept it open all along).

    Nothing is written while a refusal may be on its way (after the Hello the client waits up to
    `SETTLE_S` for one): a write racing the server's end of the call makes the gRPC client report
    INTERNAL instead of the server's status."""
    async with grpc.aio.insecure_channel(address) as ch:
        call = telemetry_pb2_grpc.TelemetryStub(ch).Stream(metadata=bearer(token) if token else None)
        pending: asyncio.Future[Any] | None = None
        try:
            await call.write(telemetry_pb2.AgentMessage(hello=h))
            pending = asyncio.ensure_future(call.read())
            done, _ = await asyncio.wait({pending}, timeout=SETTLE_S)
            if done:
                pending.result()  # raises the refusal
            else:
                for seq in range(1, int(seconds / 0.1) + 1):
                    await call.write(telemetry_pb2.AgentMessage(report=telemetry_pb2.Report(
                        seq=seq, engine=telemetry_pb2.EngineStats(
                            healthy=True, kv_capacity_tokens=1000, kv_free_tokens=1000, has_kv_capacity=True))))
                    msg = await pending
                    if msg is grpc.aio.EOF:
                        break
                    pending = asyncio.ensure_future(call.read())
                    await asyncio.sleep(0.1)
                await call.done_writing()
                while await pending is not grpc.aio.EOF:
                    pending = asyncio.ensure_future(call.read())
        except grpc.aio.AioRpcError:
            pass  # the call's own status says why
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
        return await call.code()


async def leading(etcd: EtcdStore, cp_id: str) -> None:
    await eventually(lambda: leader_is(etcd, cp_id), 15, f"{cp_id} to lead")


async def endpoint_of(etcd: EtcdStore, rid: str, endpoint: str) -> None:
    await eventually(table_probe(etcd, "m", lambda t: bool(
        (e := entry(t, rid)) and e.endpoint == endpoint and e.state == RS.REPLICA_STATE_READY)), 15,
        f"{rid} READY at {endpoint}")


async def test_rogue_clients_are_refused_and_never_listed(cps: Any, store: EtcdStore) -> None:
    cp = await cps("cp-a")
    await leading(store, "cp-a")
    legit = FakeAgent(cp.address, replica_id="a-1", token=NODE_A_TOKEN, interval_s=0.1)
    legit.hello.endpoint = LEGIT
    legit.start()
    recorder = await EtcdRecorder(store).start()
    try:
        await endpoint_of(store, "a-1", LEGIT)
        attempts = [
            # (token, replica id, endpoint, expected code)
            (None, "a-new", ROGUE, C.UNAUTHENTICATED),
            ("not-a-token", "a-new", ROGUE, C.UNAUTHENTICATED),
            (None, "a-1", ROGUE, C.UNAUTHENTICATED),
            ("not-a-token", "a-1", ROGUE, C.UNAUTHENTICATED),
            (NODE_B_TOKEN, "a-new", ROGUE, C.PERMISSION_DENIED),   # a valid token for other ids
            (NODE_B_TOKEN, "a-1", ROGUE, C.PERMISSION_DENIED),
            (AGENT_TOKEN, "a-1", ROGUE, C.ALREADY_EXISTS),         # permitted id, but held by node-a
            (NODE_A_TOKEN, "a-2", "http://203.0.113.7:8000", C.PERMISSION_DENIED),  # outside the networks
        ]
        codes = await asyncio.gather(*(one_stream(cp.address, tok, hello(rid, ep)) for tok, rid, ep, _ in attempts))
        assert list(codes) == [want for *_, want in attempts]
        await asyncio.sleep(1.0)  # a few ticks: a rogue entry would have been published by now
        await endpoint_of(store, "a-1", LEGIT)
        kv = await store.get(keys.table("m"))
        assert kv is not None and [e.replica_id for e in codec.decode(
            kv.value, records_pb2.RoutingTable).replicas] == ["a-1"]
        assert await store.get(keys.replica("a-new")) is None
        assert not recorder.mentions(ROGUE) and not recorder.mentions("203.0.113.7")
        assert legit.refusals == []  # the legitimate stream was never disturbed
        metrics_log = cp.log.read_text()
        assert "stream_refused" in metrics_log
        assert "not-a-token" not in metrics_log and NODE_B_TOKEN not in metrics_log  # tokens are never logged
    finally:
        await recorder.stop()
        await legit.close()


async def test_hijack_keeps_endpoint_and_the_restarted_agent_takes_over(cps: Any, store: EtcdStore) -> None:
    cp = await cps("cp-a", "--stale-after-s", "2")
    await leading(store, "cp-a")
    recorder = await EtcdRecorder(store).start()
    # The legitimate agent's first life: one long stream.
    first = asyncio.create_task(one_stream(cp.address, NODE_A_TOKEN, hello("a-1", LEGIT), seconds=60))
    restarted: FakeAgent | None = None
    try:
        await endpoint_of(store, "a-1", LEGIT)
        # Another identity permitted the id by its patterns cannot take it while it is held...
        assert await one_stream(cp.address, AGENT_TOKEN, hello("a-1", ROGUE), 0.5) == C.ALREADY_EXISTS
        await endpoint_of(store, "a-1", LEGIT)

        # The agent restarts (same identity, new endpoint) while its old stream still looks open:
        # the new stream takes over, the old one is superseded.
        restarted = FakeAgent(cp.address, replica_id="a-1", token=NODE_A_TOKEN, interval_s=0.1)
        restarted.hello.endpoint = RESTARTED
        restarted.start()
        assert await asyncio.wait_for(first, 15) == C.ABORTED
        await endpoint_of(store, "a-1", RESTARTED)
        assert restarted.refusals == []

        # After the agent stopped, the control plane still remembers a-1: another identity may not
        # re-register it (and so cannot change its endpoint) even though its patterns allow it.
        await restarted.close()
        restarted = None
        await eventually(table_probe(store, "m", lambda t: bool(
            (e := entry(t, "a-1")) and e.state == RS.REPLICA_STATE_STALE)), 15, "a-1 STALE")
        assert await one_stream(cp.address, AGENT_TOKEN, hello("a-1", ROGUE), 1.0) == C.PERMISSION_DENIED
        e = entry(codec.decode((await store.get(keys.table("m"))).value,  # type: ignore[union-attr]
                                   records_pb2.RoutingTable), "a-1")
        assert e is not None and e.endpoint == RESTARTED
        assert not recorder.mentions(ROGUE)
        # The identity that registered it comes back and is READY again.
        assert await one_stream(cp.address, NODE_A_TOKEN, hello("a-1", LEGIT), 1.5) == C.OK
    finally:
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        if restarted is not None:
            await restarted.close()
        await recorder.stop()


async def test_stream_may_not_switch_endpoint(cps: Any, store: EtcdStore) -> None:
    cp = await cps("cp-a")
    await leading(store, "cp-a")

    async def switch() -> AsyncIterator[telemetry_pb2.AgentMessage]:
        yield telemetry_pb2.AgentMessage(hello=hello("a-1", LEGIT))
        yield telemetry_pb2.AgentMessage(report=telemetry_pb2.Report(seq=1))
        yield telemetry_pb2.AgentMessage(hello=hello("a-1", ROGUE))
        await asyncio.sleep(5)

    async with grpc.aio.insecure_channel(cp.address) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in telemetry_pb2_grpc.TelemetryStub(ch).Stream(switch(), metadata=bearer(NODE_A_TOKEN)):
                pass
    assert err.value.code() == C.INVALID_ARGUMENT and "endpoint" in (err.value.details() or "")


async def test_without_credentials_every_stream_is_refused(store: EtcdStore, clean_etcd: str,
                                                           tmp_path: Path) -> None:
    cp = await start_cp(clean_etcd, "cp-bare", tmp_path, "--telemetry-credentials-file", "")
    try:
        code = await one_stream(cp.address, AGENT_TOKEN, hello("a-1", LEGIT), 0.5)
        assert code == C.UNAUTHENTICATED
        assert "telemetry_auth_unconfigured" in cp.log.read_text()
        await leading(store, "cp-bare")  # stop it as a running instance, not mid-campaign
    finally:
        assert await stop_cp(cp) == 0


async def test_insecure_mode_is_explicit_and_still_checks_endpoints(store: EtcdStore, clean_etcd: str,
                                                                    tmp_path: Path) -> None:
    cp = await start_cp(clean_etcd, "cp-dev", tmp_path, "--telemetry-insecure")
    try:
        await leading(store, "cp-dev")
        assert await one_stream(cp.address, None, hello("x-1", "http://198.51.100.1:80"), 0.5) == C.PERMISSION_DENIED
        assert await one_stream(cp.address, None, hello("x-1", LEGIT), 0.5) == C.OK
        assert "telemetry_insecure" in cp.log.read_text()
    finally:
        assert await stop_cp(cp) == 0


async def test_revoked_token_ends_its_stream(cps: Any, store: EtcdStore, tmp_path: Path) -> None:
    cp = await cps("cp-a", "--stale-after-s", "1")
    await leading(store, "cp-a")
    agent = FakeAgent(cp.address, replica_id="a-1", token=NODE_A_TOKEN, interval_s=0.1)
    agent.hello.endpoint = LEGIT
    agent.start()
    try:
        await endpoint_of(store, "a-1", LEGIT)
        creds = tmp_path / "telemetry-credentials.csv"  # what the cps fixture gave the control plane
        kept = [line for line in creds.read_text().splitlines() if not line.startswith("node-a,")]
        creds.write_text("\n".join(kept) + "\n")

        async def cut() -> bool:
            return bool(agent.refusals)

        await eventually(cut, 10, "the open stream to end")
        # No report is accepted any more, reconnecting or not: the replica goes stale.
        await eventually(table_probe(store, "m", lambda t: bool(
            (e := entry(t, "a-1")) and e.state == RS.REPLICA_STATE_STALE)), 15, "a-1 STALE")
        assert await one_stream(cp.address, NODE_A_TOKEN, hello("a-1", LEGIT), 0.3) == C.UNAUTHENTICATED
        assert "telemetry_credentials_reloaded" in cp.log.read_text()
    finally:
        await agent.close()
