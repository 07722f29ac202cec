"""The agent telemetry stream (`tidegate.v1.Telemetry/Stream`).

First message must be a Hello (protocol_version 1), then Reports, each answered by an Ack
with the replica's current state and weight. While the stream is open this instance keeps a
leased ReplicaPresence under keys.replica(id), so a dead control plane's streams vanish.

Only the leader accepts streams: a standby refuses them with UNAVAILABLE, naming the leader's
address in the trailing metadata `tidegate-leader` when it knows it, and an instance that is
no longer the leader tells its agents to reconnect there (Directive KIND_RECONNECT_ELSEWHERE
with `leader_address`) and ends their streams. Agents go to a named leader at once, so the
fleet state always lives in the instance that publishes the tables.

An instance that led last keeps (and accepts) streams while no other leader is known, e.g.
while etcd is unreachable and nobody can be elected: it must not forget its fleet because
etcd paused. `redirect()` decides: None = serve, "" = refuse (leader unknown), "host:port" =
refuse and name the leader (controlplane.leader.LeaderWatch.redirect).

Every stream is authenticated and bound (controlplane/telemetry_auth.py): the agent's bearer
token names an identity, which must be allowed the Hello's replica id and endpoint, and a
replica id is held by one identity's newest stream (an older stream of the same identity is
superseded and ends with ABORTED). A stream keeps the replica id and endpoint of its Hello.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import NoReturn

import grpc
import grpc.aio
import structlog
from google.protobuf import timestamp_pb2

from tidegate import codec, keys
from tidegate.controlplane.auth import bearer_token
from tidegate.controlplane.fleet import FleetState
from tidegate.controlplane.metrics import Metrics
from tidegate.controlplane.telemetry_auth import ReplicaClaims, TelemetryAccess
from tidegate.errors import AuthError, ReplicaHeldError, UnauthenticatedError
from tidegate.store.lease import LeaseKeeper
from tidegate.v1 import records_pb2, telemetry_pb2, telemetry_pb2_grpc

log = structlog.get_logger(__name__)

PROTOCOL_VERSION = 1
LEADER_METADATA = "tidegate-leader"  # trailing metadata of a standby's refusal: the leader's host:port


def _refusal_code(e: AuthError) -> grpc.StatusCode:
    if isinstance(e, UnauthenticatedError):
        return grpc.StatusCode.UNAUTHENTICATED
    if isinstance(e, ReplicaHeldError):
        return grpc.StatusCode.ALREADY_EXISTS
    return grpc.StatusCode.PERMISSION_DENIED


class TelemetryService(telemetry_pb2_grpc.TelemetryServicer):
    def __init__(
        self,
        fleet: FleetState,
        presence: LeaseKeeper | None,
        controlplane_id: str,
        *,
        access: TelemetryAccess,
        metrics: Metrics | None = None,
        wall_clock: Callable[[], float] = time.time,
        is_leader: Callable[[], bool] = lambda: True,
        redirect: Callable[[], str | None] | None = None,
    ) -> None:
        self._fleet = fleet
        self._presence = presence
        self._id = controlplane_id
        self._metrics = metrics
        self._wall = wall_clock
        self._is_leader = is_leader
        self._redirect = redirect or (lambda: None if is_leader() else "")
        self._access = access
        self._stream_seq = 0
        # replica_id -> the identity and stream holding it; only the holder removes the presence.
        self._claims = ReplicaClaims()
        # A rogue client retrying in a loop must not flood the log: one line per second per code.
        self._refusal_log: dict[grpc.StatusCode, tuple[float, int]] = {}
        self._cleanups: set[asyncio.Task[None]] = set()

    async def Stream(  # noqa: N802 (gRPC method name)
        self,
        request_iterator: AsyncIterator[telemetry_pb2.AgentMessage],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[telemetry_pb2.ControlMessage]:
        first = None
        async for msg in request_iterator:
            first = msg
            break
        if first is None:
            return
        # Checked after reading the first message: refusing while the client's first write is
        # still in flight makes its gRPC library report INTERNAL instead of this status.
        presented = bearer_token(context.invocation_metadata())
        try:
            identity = self._access.identify(presented)
        except AuthError as e:
            await self._refuse(context, e)
        if first.WhichOneof("msg") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "the first message of a telemetry stream must be a Hello")
        hello = first.hello
        if hello.protocol_version != PROTOCOL_VERSION:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"protocol_version {hello.protocol_version} not supported (this control plane speaks "
                f"{PROTOCOL_VERSION})",
            )
        rid = hello.replica_id
        if not rid or not hello.pool:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad hello: replica_id and pool are required")
        try:
            self._access.authorize(identity, rid, hello.endpoint)
        except AuthError as e:
            await self._refuse(context, e, rid)
        leader = self._redirect()
        if leader is not None:
            # The directive first: a refusal status alone races the agent's next write and then
            # reaches it as INTERNAL about a third of the time (grpc.aio, measured); a message
            # sent before the status always arrives.
            yield telemetry_pb2.ControlMessage(directive=telemetry_pb2.Directive(
                kind=telemetry_pb2.Directive.KIND_RECONNECT_ELSEWHERE, leader_address=leader,
                reason=f"control plane {self._id} is standing by"))
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"control plane {self._id} is standing by; stream to the leader"
                                + (f" at {leader}" if leader else " (not known yet)"),
                                trailing_metadata=((LEADER_METADATA, leader),) if leader else ())
        self._stream_seq += 1
        token = self._stream_seq
        try:
            superseded = self._claims.claim(rid, identity.name, token,
                                            remembered=self._fleet.get(rid) is not None)
        except AuthError as e:
            await self._refuse(context, e, rid)
        if superseded is not None:
            log.warning("stream_superseded", replica_id=rid, identity=identity.name,
                        reason="a newer stream of the same identity took over the replica id")
        try:
            self._fleet.on_hello(hello)
        except ValueError as e:
            self._claims.release(rid, token)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad hello: {e}")
        self._fleet.stream_opened(rid)
        if self._metrics:
            self._metrics.streams_open.inc()
        log.info("stream_opened", replica_id=rid, pool=hello.pool, endpoint=hello.endpoint,
                 identity=identity.name, agent_version=hello.agent_version, peer=context.peer())
        try:
            if self._presence is not None:
                await self._presence.put(keys.replica(rid), codec.encode(self._presence_record(hello)))
            async for msg in request_iterator:
                if not self._claims.holds(rid, token):
                    await context.abort(grpc.StatusCode.ABORTED, "superseded by a newer stream for this "
                                        "replica id from the same identity")
                if self._access.revoked(presented):
                    await self._refuse(context, UnauthenticatedError("this stream's token was revoked"), rid)
                kind = msg.WhichOneof("msg")
                if kind == "hello":
                    # A changed identity on an open stream would orphan the old one's state, and a
                    # changed endpoint would move traffic without a new, checked registration.
                    if msg.hello.replica_id != rid:
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                            "a stream carries one replica; replica_id changed")
                    if msg.hello.endpoint != hello.endpoint:
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                            "a stream keeps its endpoint; open a new stream to change it")
                    try:
                        self._fleet.on_hello(msg.hello)
                    except ValueError as e:
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad hello: {e}")
                    hello = msg.hello
                    continue
                if kind != "report":
                    continue
                leader = self._redirect()
                if leader is not None:
                    log.info("stream_handed_off", replica_id=rid, reason="leadership lost", leader=leader)
                    yield telemetry_pb2.ControlMessage(directive=telemetry_pb2.Directive(
                        kind=telemetry_pb2.Directive.KIND_RECONNECT_ELSEWHERE, leader_address=leader,
                        reason=f"control plane {self._id} is no longer the leader"))
                    return
                if self._metrics:
                    self._metrics.reports.inc()
                decision = self._fleet.on_report(hello, msg.report)
                yield telemetry_pb2.ControlMessage(ack=telemetry_pb2.Ack(
                    seq=msg.report.seq, state=decision.state, weight=decision.weight,
                    controlplane_id=self._id))
        finally:
            self._fleet.stream_closed(rid)
            if self._metrics:
                self._metrics.streams_open.dec()
            log.info("stream_closed", replica_id=rid)
            if self._claims.release(rid, token):
                if self._presence is not None:
                    # The handler is usually being cancelled here (the agent went away); a
                    # separate task makes sure the delete is not cancelled with it.
                    task = asyncio.create_task(self._presence.delete(keys.replica(rid)))
                    self._cleanups.add(task)
                    task.add_done_callback(self._cleanups.discard)

    async def _refuse(self, context: grpc.aio.ServicerContext, e: AuthError, replica_id: str = "") -> NoReturn:
        code = _refusal_code(e)
        if self._metrics:
            self._metrics.streams_refused.labels(code.name).inc()
        now = time.monotonic()
        since, suppressed = self._refusal_log.get(code, (-1e9, 0))
        if now - since >= 1.0:
            log.warning("stream_refused", code=code.name, reason=str(e), replica_id=replica_id,
                        peer=context.peer(), suppressed=suppressed)
            self._refusal_log[code] = (now, 0)
        else:
            self._refusal_log[code] = (since, suppressed + 1)
        await context.abort(code, str(e))
        raise AssertionError("unreachable")  # abort raises

    async def drain_cleanups(self) -> None:
        """Waits for pending presence deletes (called on shutdown)."""
        if self._cleanups:
            await asyncio.wait(set(self._cleanups), timeout=2.0)

    def _presence_record(self, hello: telemetry_pb2.Hello) -> records_pb2.ReplicaPresence:
        ts = timestamp_pb2.Timestamp()
        ts.FromNanoseconds(int(self._wall() * 1e9))
        return records_pb2.ReplicaPresence(
            replica_id=hello.replica_id, pool=hello.pool, endpoint=hello.endpoint, region=hello.region,
            zone=hello.zone, controlplane_id=self._id, connected_at=ts)
