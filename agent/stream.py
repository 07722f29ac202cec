"""The agent's telemetry stream to the control plane (`tidegate.v1.Telemetry/Stream`, grpc.aio).

One long-lived bidirectional stream: Hello first, then one Report per interval; Acks and
Directives are read concurrently. On any failure (connect refused, stream cut, keepalive
timeout) the agent moves to the next control-plane address after a full-jitter exponential
backoff, and sends a fresh Hello. A control plane that names the leader (a standby's refusal,
or KIND_RECONNECT_ELSEWHERE with leader_address) sends the agent there at once; a standby that
does not know the leader yet (an election under way) is retried within a second rather than
after a growing backoff. See `next_target`.

Backoff (AWS "full jitter"): delay = U(0, min(cap, initial * 2**attempt)); the attempt counter
resets when a stream stayed up longer than `stable_s`, so one cut after hours of service
reconnects fast, while a control plane that keeps refusing is not hammered.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import structlog

import tidegate
from tidegate.agent.collector import Collector
from tidegate.agent.metrics import AgentMetrics
from tidegate.aio import cancel_and_wait
from tidegate.v1 import telemetry_pb2, telemetry_pb2_grpc

log = structlog.get_logger(__name__)

PROTOCOL_VERSION = 1
MIN_INTERVAL_S = 0.05
MAX_INTERVAL_S = 60.0

# Keepalive pings detect a frozen or partitioned control plane in ~15 s instead of minutes.
# The control plane's server must allow pings this often (grpc.http2.min_ping_interval_without_data_ms).
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 10_000),
)


def backoff_delay(
    attempt: int, rng: Callable[[], float], initial_s: float = 0.2, max_s: float = 10.0
) -> float:
    """Full-jitter exponential backoff for the `attempt`-th consecutive failure (0-based).

    `rng()` returns a float in [0, 1).
    """
    ceiling = min(max_s, initial_s * (2 ** min(max(attempt, 0), 32)))
    return rng() * ceiling


@dataclass(frozen=True)
class HelloInfo:
    replica_id: str
    pool: str
    endpoint: str
    region: str = "local"
    zone: str = "local-a"
    gpu_indices: tuple[int, ...] = ()
    engine_kind: str = "vllm"
    capabilities: tuple[str, ...] = field(default=("histograms", "kv_capacity"))
    rate_prior: tuple[float, ...] = ()  # (prefill tokens/s, step base ms, step ms per sequence) or ()

    def message(self, report_interval_s: float) -> telemetry_pb2.AgentMessage:
        prefill, base, per_seq = self.rate_prior if len(self.rate_prior) == 3 else (0.0, 0.0, 0.0)
        return telemetry_pb2.AgentMessage(
            hello=telemetry_pb2.Hello(
                replica_id=self.replica_id,
                pool=self.pool,
                endpoint=self.endpoint,
                region=self.region,
                zone=self.zone,
                gpu_indices=list(self.gpu_indices),
                engine_kind=self.engine_kind,
                agent_version=tidegate.__version__,
                protocol_version=PROTOCOL_VERSION,
                capabilities=list(self.capabilities),
                report_interval_ms=int(round(report_interval_s * 1000)),
                prior_prefill_tokens_per_s=prefill,
                prior_decode_step_base_ms=base,
                prior_decode_step_per_seq_ms=per_seq,
            )
        )


class _Reconnect(Exception):
    """The control plane asked us to go elsewhere."""


LEADER_METADATA = "tidegate-leader"  # trailing metadata of a standby's refusal (controlplane.telemetry)
DEAD_S = 5.0  # a target that failed to answer this recently is not worth a hint's immediate retry


@dataclass(frozen=True)
class Ended:
    """How a stream ended, as far as choosing the next target goes."""

    leader_hint: str = ""      # the leader's host:port, as a control plane told us
    standby: bool = False      # a live control plane refused us: it stands by


def next_target(targets: Sequence[str], current: str, ended: Ended, failed_at: Mapping[str, float],
                now: float, dead_s: float = DEAD_S) -> tuple[str, str]:
    """Where to stream next, and how: ("leader", at once), ("standby", retry the same live
    control plane soon: the election is under way), ("failover", back off and move on). Pure.

    A named leader wins unless it failed to answer within `dead_s` (a standby names the dead
    leader until its lease lapses: going back there would only grow the backoff). Failing
    over prefers a target that has not failed within `dead_s`."""
    if ended.leader_hint and now - failed_at.get(ended.leader_hint, -math.inf) > dead_s:
        return ended.leader_hint, "leader"
    if ended.standby:
        return current, "standby"
    i = targets.index(current) if current in targets else -1
    order = [targets[(i + k) % len(targets)] for k in range(1, len(targets) + 1)]
    alive = [t for t in order if t != current and now - failed_at.get(t, -math.inf) > dead_s]
    return (alive[0] if alive else order[0]), "failover"


class StreamClient:
    def __init__(
        self,
        targets: Sequence[str],
        hello: HelloInfo,
        collector: Collector,
        *,
        report_interval_s: float = 1.0,
        rng: Callable[[], float],
        clock: Callable[[], float] = time.monotonic,
        metrics: AgentMetrics | None = None,
        initial_backoff_s: float = 0.2,
        max_backoff_s: float = 10.0,
        stable_s: float = 10.0,
        token: str | None = None,
    ) -> None:
        if not targets:
            raise ValueError("at least one control-plane address is required")
        self._targets = list(targets)
        self._hello = hello
        self._collector = collector
        self.report_interval_s = report_interval_s
        self._rng = rng
        self._clock = clock
        self._metrics = metrics
        self._initial = initial_backoff_s
        self._max = max_backoff_s
        self._stable_s = stable_s
        # Sent as call metadata only; never logged.
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self._interval_changed = asyncio.Event()
        self.streams_opened = 0
        self._ended = Ended()
        self.last_ack: telemetry_pb2.Ack | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Keep a stream open until `stop` is set."""
        attempt = 0
        target = self._targets[0]
        failed_at: dict[str, float] = {}
        hopped = False  # the last stream was opened on a hint and ended without serving
        while not stop.is_set():
            started = self._clock()
            self._ended = Ended()
            reason = await self._one_stream(target, stop)
            if stop.is_set():
                break
            now = self._clock()
            if now - started > self._stable_s:
                attempt = 0
            nxt, how = next_target(self._targets, target, self._ended, failed_at, now)
            if now - started > 1.0:
                hopped = False  # that stream served: whatever named it was right
            if how == "leader" and not hopped:
                delay = self._rng() * 0.05  # a hint reaches every agent at once: spread them a little
            elif how == "leader":
                # Two control planes naming each other (their views of etcd a poll apart): follow
                # the hint, but not in a tight loop.
                delay = backoff_delay(min(attempt, 1), self._rng, self._initial, self._max)
                attempt += 1
            elif how == "standby":
                # Not a failure of ours: the election is under way. Retry soon, without growing
                # the backoff (a few per second per agent, for one election TTL at most).
                delay = backoff_delay(min(attempt, 1), self._rng, self._initial, self._max)
            else:
                failed_at[target] = now
                delay = backoff_delay(attempt, self._rng, self._initial, self._max)
                attempt += 1
            log.warning("stream_closed", target=target, reason=reason, next_target=nxt, how=how,
                        retry_in_s=round(delay, 3))
            target, hopped = nxt, how == "leader"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)

    async def _one_stream(self, target: str, stop: asyncio.Event) -> str:
        """Run one stream to its end; returns why it ended."""
        async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
            stub = telemetry_pb2_grpc.TelemetryStub(channel)
            call = stub.Stream(metadata=self._metadata)
            tasks = [
                asyncio.create_task(self._send(call, target), name="agent-send"),
                asyncio.create_task(self._receive(call), name="agent-receive"),
                asyncio.create_task(stop.wait(), name="agent-stop"),
            ]
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                call.cancel()
                await cancel_and_wait(tasks)
                if self._metrics is not None:
                    self._metrics.stream_up.set(0)
            if stop.is_set():
                log.info("stream_stopped", target=target)
                return "stopped"
            refusal = await _standby_refusal(call)
            if refusal is not None:
                self._ended = refusal
            return _describe(done)

    async def _send(self, call: grpc.aio.StreamStreamCall, target: str) -> None:
        await call.write(self._hello.message(self.report_interval_s))
        self.streams_opened += 1
        if self._metrics is not None:
            if self.streams_opened > 1:
                self._metrics.stream_reconnects.inc()
            self._metrics.stream_up.set(1)
        log.info("stream_opened", target=target, replica_id=self._hello.replica_id)
        while True:
            started = self._clock()
            report = await self._collector.collect()
            await call.write(telemetry_pb2.AgentMessage(report=report))
            if self._metrics is not None:
                self._metrics.reports_sent.inc()
            remaining = self.report_interval_s - (self._clock() - started)
            self._interval_changed.clear()
            if remaining > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._interval_changed.wait(), timeout=remaining)

    async def _receive(self, call: grpc.aio.StreamStreamCall) -> None:
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                return
            kind = msg.WhichOneof("msg")
            if kind == "ack":
                self.last_ack = msg.ack
            elif kind == "directive":
                self._apply(msg.directive)

    def _apply(self, d: telemetry_pb2.Directive) -> None:
        if d.kind == telemetry_pb2.Directive.KIND_SET_REPORT_INTERVAL:
            if d.report_interval_ms <= 0:
                return
            new = min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, d.report_interval_ms / 1000.0))
            log.info("report_interval_set", interval_s=new, reason=d.reason)
            self.report_interval_s = new
            self._interval_changed.set()
        elif d.kind == telemetry_pb2.Directive.KIND_RECONNECT_ELSEWHERE:
            log.info("reconnect_requested", reason=d.reason, leader=d.leader_address)
            # A standby (or one that names the leader) is alive: if the leader it names is
            # unusable, retry it soon. Without either, it is going away: move on.
            self._ended = Ended(leader_hint=d.leader_address,
                                standby=bool(d.leader_address) or "standing by" in d.reason)
            raise _Reconnect(d.reason or "control plane asked to reconnect elsewhere")


async def _standby_refusal(call: grpc.aio.StreamStreamCall) -> Ended | None:
    """A standby's UNAVAILABLE refusal, with the leader it named (controlplane.telemetry). Read
    from the finished call, not from the task that failed first: a refusal that arrives while
    we write shows there as "RPC already finished"."""
    try:
        code = await asyncio.wait_for(call.code(), 1.0)
        if code != grpc.StatusCode.UNAVAILABLE or "standing by" not in (await call.details() or ""):
            return None
        metadata = await call.trailing_metadata()
    except (TimeoutError, grpc.RpcError):
        return None
    hint = next((str(v) for k, v in (metadata or ()) if k == LEADER_METADATA), "")
    return Ended(leader_hint=hint, standby=True)


def _describe(done: set[asyncio.Task[Any]]) -> str:
    for t in done:
        if t.cancelled():
            continue
        exc = t.exception()
        if isinstance(exc, grpc.aio.AioRpcError):
            return f"{exc.code().name}: {exc.details() or ''}".rstrip(": ")
        if isinstance(exc, _Reconnect):
            return f"reconnect requested: {exc}"
        if exc is not None:
            return f"{type(exc).__name__}: {exc}"
        if t.get_name() == "agent-receive":
            return "server closed the stream"
    return "stream ended"
