"""What the control-plane end-to-end tests share: control-plane processes on ephemeral ports with
test credentials (operator and viewer tokens, telemetry identities), a gRPC agent that speaks the
real protocol (`FakeAgent`: no engine behind it), and bounded waits on etcd.

The fixtures built on it (`cps`, `store`) are in conftest.py."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio

from tidegate import codec, keys
from tidegate.controlplane.telemetry_auth import token_digest
from tidegate.store.etcd import EtcdStore
from tidegate.v1 import records_pb2, telemetry_pb2, telemetry_pb2_grpc

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


async def kill_and_reap(proc: asyncio.subprocess.Process, timeout_s: float = 10.0) -> None:
    """SIGKILL `proc` if it still runs and wait for it, bounded: an unreaped child stays a zombie
    and, until it is gone, its port may still be taken when the next test binds."""
    if proc.returncode is None:
        try:
            proc.kill()
        except ProcessLookupError:  # it exited between the check and the kill
            pass
    try:
        await asyncio.wait_for(proc.wait(), timeout_s)
    except TimeoutError:
        raise AssertionError(f"process {proc.pid} did not exit {timeout_s} s after SIGKILL") from None


async def start_cp(etcd: str, cp_id: str, tmp: Path, *extra: str, ready_s: float = 15.0) -> ControlPlaneProc:
    log = tmp / f"{cp_id}.log"
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            TIDEGATE, "controlplane", "--etcd", etcd, "--listen", "127.0.0.1:0", "--id", cp_id,
            "--tick-s", "0.2", "--log-json", "--auth-tokens-file", str(write_tokens(tmp)),
            "--telemetry-credentials-file", str(write_credentials(tmp)), *extra,
            stdout=asyncio.subprocess.PIPE, stderr=err, start_new_session=True)
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), ready_s)
    except TimeoutError:
        await kill_and_reap(proc)
        raise AssertionError("control plane did not print its port: " + log.read_text()[-2000:]) from None
    if not line:
        await kill_and_reap(proc)
        raise AssertionError("control plane exited: " + log.read_text()[-2000:])
    event = json.loads(line)
    assert event["event"] == "listening" and event["port"] > 0
    return ControlPlaneProc(proc, cp_id, event["port"], log)


async def stop_cp(cp: ControlPlaneProc) -> int:
    if cp.proc.returncode is None:
        cp.proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(cp.proc.wait(), 10)
        except TimeoutError:
            await kill_and_reap(cp.proc)
            raise AssertionError(f"control plane {cp.id} did not exit 10 s after SIGTERM; its log ends: "
                                 + cp.log.read_text()[-3000:]) from None
    return cp.proc.returncode


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


async def leader_is(store: EtcdStore, cp_id: str) -> bool:
    """Whether the election record names `cp_id` (it may not serve as leader yet: its campaign
    returns a moment later)."""
    listing = await store.list_prefix(keys.ELECTION)
    return any(codec.decode(kv.value, records_pb2.LeaderRecord).controlplane_id == cp_id
               for kv in listing.items[:1])
