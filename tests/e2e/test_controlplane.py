"""The control plane as a real process against a real etcd, with a test gRPC agent."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio
import pytest

from tidegate import codec, keys
from tidegate.controlplane.telemetry_auth import token_digest
from tidegate.store.etcd import EtcdStore
from tidegate.v1 import admin_pb2, admin_pb2_grpc, records_pb2, telemetry_pb2, telemetry_pb2_grpc

pytestmark = pytest.mark.e2e
RS = records_pb2.ReplicaState
TIDEGATE = str(Path(sys.executable).with_name("tidegate"))
T = TypeVar("T")
OPERATOR_TOKEN = "op-secret-1"
VIEWER_TOKEN = "view-secret-1"
OPERATOR_MD = (("authorization", f"Bearer {OPERATOR_TOKEN}"),)
VIEWER_MD = (("authorization", f"Bearer {VIEWER_TOKEN}"),)
# Telemetry identities of every test control plane: `test-agents` may speak for any replica id
# (FakeAgent's default); `node-a` and `node-b` only for ids starting a- and b- (security tests).
AGENT_TOKEN = "agent-secret-1"
NODE_A_TOKEN = "node-a-secret-1"
NODE_B_TOKEN = "node-b-secret-1"


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def write_tokens(tmp: Path) -> Path:
    path = tmp / "tokens.csv"
    path.write_text(f"# token,name,role\n{OPERATOR_TOKEN},alice,operator\n{VIEWER_TOKEN},bob,viewer\n")
    return path


def write_credentials(tmp: Path) -> Path:
    path = tmp / "telemetry-credentials.csv"
    path.write_text("# identity,sha256,patterns\n"
                    f"test-agents,{token_digest(AGENT_TOKEN)},*\n"
                    f"node-a,{token_digest(NODE_A_TOKEN)},a-*\n"
                    f"node-b,{token_digest(NODE_B_TOKEN)},b-*\n")
    return path


class ControlPlaneProc:
    def __init__(self, proc: asyncio.subprocess.Process, cp_id: str, port: int, log: Path) -> None:
        self.proc, self.id, self.port, self.log = proc, cp_id, port, log

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


async def start_cp(etcd: str, cp_id: str, tmp: Path, *extra: str) -> ControlPlaneProc:
    log = tmp / f"{cp_id}.log"
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            TIDEGATE, "controlplane", "--etcd", etcd, "--listen", "127.0.0.1:0", "--id", cp_id,
            "--tick-s", "0.2", "--log-json", "--auth-tokens-file", str(write_tokens(tmp)),
            "--telemetry-credentials-file", str(write_credentials(tmp)), *extra,
            stdout=asyncio.subprocess.PIPE, stderr=err, start_new_session=True)
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 15)
    except TimeoutError:
        proc.kill()
        raise AssertionError("control plane did not print its port: " + log.read_text()[-2000:]) from None
    assert line, "control plane exited: " + log.read_text()[-2000:]
    event = json.loads(line)
    assert event["event"] == "listening" and event["port"] > 0
    return ControlPlaneProc(proc, cp_id, event["port"], log)


async def stop_cp(cp: ControlPlaneProc) -> int:
    if cp.proc.returncode is None:
        cp.proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(cp.proc.wait(), 10)
        except TimeoutError:
            cp.proc.kill()
            await cp.proc.wait()
            raise
    return cp.proc.returncode


@pytest.fixture
async def cps(clean_etcd: str, tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[ControlPlaneProc]]]:
    started: list[ControlPlaneProc] = []

    async def start(cp_id: str, *extra: str) -> ControlPlaneProc:
        cp = await start_cp(clean_etcd, cp_id, tmp_path, *extra)
        started.append(cp)
        return cp

    yield start
    for cp in started:
        if cp.proc.returncode is None:
            cp.proc.kill()
            await cp.proc.wait()


@pytest.fixture
async def store(clean_etcd: str) -> AsyncIterator[EtcdStore]:
    s = EtcdStore([clean_etcd])
    await s.connect()
    yield s
    await s.close()


class FakeAgent:
    """Streams Hello then a report every `interval_s` while `sending` is set; when a stream
    is refused or ends, moves on to the next address (like the real agent)."""

    def __init__(self, address: str | list[str], replica_id: str = "r1", pool: str = "m",
                 interval_s: float = 0.2, token: str | None = AGENT_TOKEN) -> None:
        self.addresses = [address] if isinstance(address, str) else list(address)
        self.channels = [grpc.aio.insecure_channel(a) for a in self.addresses]
        self.refusals: list[grpc.StatusCode] = []
        self.directives: list[telemetry_pb2.Directive] = []
        self.hello = telemetry_pb2.Hello(replica_id=replica_id, pool=pool, endpoint="http://127.0.0.1:9999",
                                         region="eu", zone="eu-1", protocol_version=1, engine_kind="test")
        self.interval_s = interval_s
        self.metadata = bearer(token) if token else None
        self.sending = asyncio.Event()
        self.sending.set()
        self.acks: list[telemetry_pb2.Ack] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _messages(self) -> AsyncIterator[telemetry_pb2.AgentMessage]:
        yield telemetry_pb2.AgentMessage(hello=self.hello)
        seq = 0
        while not self._stop.is_set():
            await self.sending.wait()
            seq += 1
            yield telemetry_pb2.AgentMessage(report=telemetry_pb2.Report(seq=seq, engine=telemetry_pb2.EngineStats(
                healthy=True, num_requests_running=1, kv_capacity_tokens=1000, kv_free_tokens=600,
                has_kv_capacity=True)))
            await asyncio.sleep(self.interval_s)

    async def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            stub = telemetry_pb2_grpc.TelemetryStub(self.channels[i % len(self.channels)])
            try:
                async for msg in stub.Stream(self._messages(), metadata=self.metadata):
                    if msg.WhichOneof("msg") == "ack":
                        self.acks.append(msg.ack)
                    elif msg.WhichOneof("msg") == "directive":
                        self.directives.append(msg.directive)
            except grpc.aio.AioRpcError as e:
                self.refusals.append(e.code())
            i += 1
            await asyncio.sleep(0.05)

    def start(self) -> FakeAgent:
        self._task = asyncio.create_task(self._run())
        return self

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, grpc.aio.AioRpcError):
                pass
        for ch in self.channels:
            await ch.close()


async def eventually(probe: Callable[[], Awaitable[T | None]], timeout_s: float, what: str) -> T:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")


def table_probe(store: EtcdStore, pool: str,
                pred: Callable[[records_pb2.RoutingTable], bool]) -> Callable[[], Awaitable[Any]]:
    async def probe() -> records_pb2.RoutingTable | None:
        kv = await store.get(keys.table(pool))
        if kv is None:
            return None
        t = codec.decode(kv.value, records_pb2.RoutingTable)
        return t if pred(t) else None
    return probe


def entry(t: records_pb2.RoutingTable, rid: str = "r1") -> records_pb2.RouteEntry | None:
    return next((e for e in t.replicas if e.replica_id == rid), None)


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
    await eventually(lambda: _leader_is(store, "cp-a"), 15, "cp-a to lead")
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


async def _leader_is(store: EtcdStore, cp_id: str) -> bool:
    listing = await store.list_prefix(keys.ELECTION)
    return any(codec.decode(kv.value, records_pb2.LeaderRecord).controlplane_id == cp_id
               for kv in listing.items[:1])


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
