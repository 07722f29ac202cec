"""The proxy: from one OpenAI request to one engine replica and back, streaming.

Per request: read the body (size-limited), parse it, look up the pool's table, pick a
replica, forward the body unchanged and stream the answer back chunk by chunk.

Retries happen only before the client has received anything: connection refused or
reset, or an engine 5xx, before the first body chunk. At most `max_retries`, each to a
replica not tried yet, each paid from the router-wide `RetryBudget`. A first-byte timeout
is not retried (the engine may still be working on it) and maps to 504. After the first
byte an upstream failure ends the response (SSE: an OpenAI-style error event first).
A client that goes away cancels the handler (router/http1.py); closing the
upstream response then closes its connection, which is how the engine learns to abort.

The in-flight count of a replica is held from just before the attempt to the end of
the streamed answer and released in `finally`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import structlog

from tidegate.policy import registry
from tidegate.policy.admission_budget import Hold, Tokens
from tidegate.policy.pick import RequestFeatures
from tidegate.policy.registry import SloTargets
from tidegate.policy.tpot_plan import EARLY_TOKENS
from tidegate.router.admission import Gate, Rejected, rejection_response
from tidegate.router.admission_budgets import AdmissionBudgets
from tidegate.router.budget import RetryBudget
from tidegate.router.credentials import NO_CREDENTIALS, EngineCredentials
from tidegate.router.engine_client import ConnectFailed, EngineClient, EngineError, EngineResponse
from tidegate.router.http1 import Answer, Request, RequestTooLarge, Response, StreamResponse
from tidegate.router.inflight import InflightCounter
from tidegate.router.metrics import RouterMetrics
from tidegate.router.parse import DEFAULT_MAX_JSON_DEPTH, BadRequest, error_body, parse_request, request_prefix_hashes
from tidegate.router.prompt_tokens import ESTIMATE, PromptCounter
from tidegate.router.ratelog import LogRateLimiter
from tidegate.router.refusals import ConnectRefusals
from tidegate.router.reqclass import BadHeader, RequestClass, classify
from tidegate.router.tables import PoolTable, RoutingTables
from tidegate.tokens import PREFIX_BLOCK_TOKENS

log = structlog.get_logger(__name__)

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade",
})
# Engines here are unauthenticated: never pass client credentials on. Accept-Encoding is
# dropped so engines answer identity-encoded and SSE chunks flush as they come.
_DROP_REQUEST = HOP_BY_HOP | {
    "host", "content-length", "authorization", "cookie", "accept-encoding", "expect",
}
_DROP_RESPONSE = HOP_BY_HOP | {"content-length", "server", "date"}
REPLICA_HEADER = "X-Tidegate-Replica"
REJECT_HEADER = "X-Tidegate-Reject-Reason"     # why a 429 (budget_exhausted; the queue's reasons)
BUDGET_EXHAUSTED = "budget_exhausted"
_USAGE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


class _Exchange:
    """What the proxy notes of one request on its way, read back at its end (metrics, hooks):
    attributes with defaults instead of optional keys in the request's mapping, whose misses
    raise and catch a KeyError each (a few per request on the hot path)."""

    __slots__ = ("pool", "status", "cls", "hold", "output_tokens", "tpot_s", "early_tpot_s", "predicted_ttft_s",
                 "sent_s", "plans_tpot")

    def __init__(self) -> None:
        self.pool: str | None = None        # the pool, once the model is known to be one
        self.status: str | None = None      # metric status when it differs from the HTTP one
        self.cls = "unknown"                # the priority class, once read
        self.hold: Hold | None = None       # what the request holds of the admission budget
        # The engine's own count of output tokens (`usage.completion_tokens`), read from the end of
        # a response that finished normally: always in a plain JSON answer, in a stream when the
        # client asked for usage. It teaches the policy how long outputs really are. SSE events
        # are not counted instead: engines coalesce several tokens into one event when the client
        # reads slowly (vLLM's stream interval).
        self.output_tokens: int | None = None
        # Seconds per output token after the first, of a streamed answer with its usage (the
        # policy's TPOT plan learns from it under admission: registry.notify_tpot).
        self.tpot_s: float | None = None
        # The same over its first EARLY_TOKENS gaps, timed on SSE events (_ClientSink), when the
        # answer is longer than that (tpot_plan.py: critical requests plan on it).
        self.early_tpot_s: float | None = None
        # Under admission: the TTFT its dispatch counted on, and when its last attempt was sent
        # (a streamed answer's first token teaches the gate its TTFT margin: Gate.observe_ttft).
        self.predicted_ttft_s: float | None = None
        self.sent_s = 0.0
        # Whether the pick's TPOT plan learns from this request (admission enforces it for a policy
        # it applies to): else the TPOTs, early or whole, are not worth timing.
        self.plans_tpot = False


@dataclass(frozen=True)
class ProxySettings:
    max_retries: int = 2
    first_byte_timeout_s: float = 60.0
    policy: str = "tidegate"        # a name in tidegate.policy.registry
    body_timeout_s: float = 30.0    # to read a request's whole body once its headers are in (408)
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    trust_priority_header: bool = False  # read x-tidegate-priority (else every request is standard)
    default_slo: SloTargets | None = None  # for pools without an SLO of their own (None: the policy's)
    engine_credentials: EngineCredentials = NO_CREDENTIALS  # Authorization to send to each pool's engines
    prompt_counter: PromptCounter = ESTIMATE  # prompt tokens: the byte estimate, or --tokenizer's exact count


@dataclass(frozen=True)
class _Failure:
    """An attempt that failed before anything reached the client."""

    kind: str                 # connect | reset | upstream_5xx | timeout
    retryable: bool
    status: int
    message: str
    body: bytes | None = None         # an engine's own 5xx answer, passed through if not retried
    content_type: str | None = None


_FIRST_BYTE_TIMEOUT = "the engine did not answer within the first-byte timeout"


class _DeadlineClock:
    """The first-byte deadlines of the attempts in flight, checked by one loop timer every
    `tick_s` instead of a loop timer armed and cancelled per attempt (that pair was ~2% of a tiny
    request's CPU). A deadline fires at most `tick_s` late. Every deadline has the same length,
    so arming order is expiry order and a sweep stops at the first one still running."""

    __slots__ = ("loop", "_tick_s", "_armed", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop, tick_s: float) -> None:
        self.loop = loop
        self._tick_s = tick_s
        self._armed: dict[_Deadline, None] = {}  # insertion ordered: expiry order
        self._timer: asyncio.TimerHandle | None = None

    def arm(self, deadline: _Deadline) -> None:
        self._armed[deadline] = None
        if self._timer is None:
            self._timer = self.loop.call_later(self._tick_s, self._sweep)

    def disarm(self, deadline: _Deadline) -> None:
        self._armed.pop(deadline, None)

    def _sweep(self) -> None:
        self._timer = None
        now = self.loop.time()
        due = []
        for deadline in self._armed:
            if deadline.at > now:
                break
            due.append(deadline)
        for deadline in due:
            del self._armed[deadline]
            deadline.fire()
        if self._armed:
            self._timer = self.loop.call_later(self._tick_s, self._sweep)


class _Deadline:
    """Cancels the current task `delay_s` from now (within the clock's tick) unless closed first:
    asyncio.timeout's job without its lookups of the running loop and task on each use, once per
    attempt on the hot path. Same rules: a cancellation from elsewhere (the client went away)
    stays a cancellation."""

    __slots__ = ("_clock", "_task", "_cancelling", "_fired", "at")

    def __init__(self, clock: _DeadlineClock, delay_s: float) -> None:
        task = asyncio.current_task(clock.loop)
        assert task is not None
        self._clock = clock
        self._task = task
        self._cancelling = task.cancelling()
        self._fired = False
        self.at = clock.loop.time() + delay_s
        clock.arm(self)

    def fire(self) -> None:
        self._fired = True
        self._task.cancel()

    def close(self) -> bool:
        """Disarms it (call once). True when it fired and nothing else cancelled the task: the
        CancelledError in flight, if any, is the deadline's own, i.e. a timeout."""
        self._clock.disarm(self)
        return self._fired and self._task.uncancel() <= self._cancelling


def json_error(status: int, message: str, type_: str, param: str | None = None, code: str | None = None,
               headers: dict[str, str] | None = None) -> Response:
    return Response(status, json.dumps(error_body(message, type_, param, code)).encode(), headers,
                    "application/json")


def _dropped(connection_values: Iterable[str], always: frozenset[str]) -> frozenset[str]:
    """`always` and the headers the Connection header's values name (hop-by-hop too)."""
    named = [t.strip().lower() for value in connection_values for t in value.split(",")]
    return always.union(named) if named else always


def forward_request_headers(headers: Any) -> list[tuple[str, str]]:
    """A client's request headers (a multidict) as they go to the engine."""
    drop = _dropped(headers.getall("Connection", ()), _DROP_REQUEST)
    return [(k, v) for k, v in headers.items() if k.lower() not in drop]


def forward_response_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """An engine's answer headers as they go to the client."""
    drop = _dropped([v for k, v in headers if k.lower() == "connection"], _DROP_RESPONSE)
    return [(k, v) for k, v in headers if k.lower() not in drop]


class _ClientSink:
    """Where an engine's body pieces go after the first (EngineResponse.relay): straight into the
    client's transport, framed as the answer is (chunked or not), from the engine connection's
    own callback. The answer's headers and first piece went through its StreamResponse
    (out.write), its end goes through it too (out.write_eof), so that frames the start and the
    end and this the middle, in order on one transport. Keeps the last two pieces (the usage is in them), and
    notes when the SSE event EARLY_TOKENS after the first arrived (`early_at`): the early TPOT's
    end. Events stand for tokens there: an engine that coalesces tokens into one event (a slow
    reader) or sends a role event first moves it by a token or so, which the plan's quantile
    absorbs; the whole answer's TPOT still comes from the usage's token count."""

    __slots__ = ("_transport", "_chunked", "_high", "_clock", "_events", "prev", "last", "early_at")

    def __init__(self, transport: asyncio.Transport, chunked: bool, first: bytes,
                 clock: Callable[[], float] | None = None) -> None:
        self._transport = transport
        self._chunked = chunked
        self._high = transport.get_write_buffer_limits()[1]  # past it the transport pauses us
        self.prev, self.last = b"", first
        self._clock = clock
        self.early_at: float | None = None
        # SSE events seen so far (the first piece's included); -1: not counting (timed, or no clock)
        self._events = first.count(b"data:") if clock is not None else -1

    def __call__(self, piece: bytes) -> bool:
        transport = self._transport
        if transport.is_closing():
            return False
        transport.write(b"%x\r\n%b\r\n" % (len(piece), piece) if self._chunked else piece)
        self.prev, self.last = self.last, piece
        if self._events >= 0:
            events = self._events + piece.count(b"data:")
            if events > EARLY_TOKENS:
                self.early_at = self._clock()  # type: ignore[misc]
                events = -1
            self._events = events
        return transport.get_write_buffer_size() <= self._high


def _sse_error(message: str) -> bytes:
    err = error_body(message, "upstream_error", None, "upstream_stream_broken")
    return b"data: " + json.dumps(err).encode() + b"\n\n"


class Proxy:
    def __init__(self, tables: RoutingTables, session: EngineClient, inflight: InflightCounter,
                 budget: RetryBudget, metrics: RouterMetrics, rng: random.Random, settings: ProxySettings,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._tables = tables
        self._session = session
        self._inflight = inflight
        self._budget = budget
        self._metrics = metrics
        self._rng = rng
        self._settings = settings
        self._clock = clock
        self._refusals = ConnectRefusals(clock)
        # per-request warnings repeat at request rate when an engine or the budget fails
        self._ratelog = LogRateLimiter(clock)
        # One policy instance per pool: router-local state (cursors, prefix trees) is per pool.
        self._policies: dict[str, registry.Policy] = {}
        # The pools' request queues and early rejection (router/admission.py); None: off.
        self.gate: Gate | None = None
        # This router's shares of the pools' admission budgets (router/admission_budgets.py); None: off.
        self.admission_budgets: AdmissionBudgets | None = None
        self._deadlines: _DeadlineClock | None = None  # the first-byte deadlines, once the loop is known

    def _log_limited(self, key: str, event: str, level: str = "warning", **fields: Any) -> None:
        """At most one line per key per interval, with the count of the lines left out."""
        suppressed = self._ratelog.check(key)
        if suppressed is not None:
            getattr(log, level)(event, suppressed=suppressed, **fields)

    def _deadline_clock(self) -> _DeadlineClock:
        clock = self._deadlines
        if clock is None:  # the serving loop is known from the first request on
            tick_s = min(0.1, max(0.001, self._settings.first_byte_timeout_s / 20))
            clock = self._deadlines = _DeadlineClock(asyncio.get_running_loop(), tick_s)
        return clock

    def _policy(self, pool: str) -> registry.Policy:
        policy = self._policies.get(pool)
        if policy is None:
            policy = self._policies[pool] = registry.create(self._settings.policy)
        return policy

    def policy(self, pool: str) -> registry.Policy:
        """The pool's policy instance, created on first use (peer load reports feed it too)."""
        return self._policy(pool)

    def policies(self) -> dict[str, registry.Policy]:
        """The pools' policy instances created so far."""
        return dict(self._policies)

    async def handle(self, request: Request) -> Answer:
        t0 = self._clock()
        ex = request.exchange = _Exchange()
        status = "500"
        try:
            resp = await self._handle(request, t0)
            status = ex.status or str(resp.status)
            return resp
        except asyncio.CancelledError:
            status = "499"  # client closed the request
            self._metrics.client_disconnects.inc()
            raise
        finally:
            model = ex.pool or "_none"  # until the model is known to be a pool (bounded cardinality)
            self._metrics.requests_for(model, status).inc()
            self._metrics.class_requests_for(model, ex.cls, status).inc()
            if ex.pool is not None:
                self._metrics.duration_for(model).observe(self._clock() - t0)

    async def _handle(self, request: Request, t0: float) -> Answer:
        try:
            if request.body_complete:  # the whole body came with the headers: nothing to wait for
                body = await request.read()
            else:
                async with asyncio.timeout(self._settings.body_timeout_s):
                    body = await request.read()
        except RequestTooLarge as exc:
            return json_error(413, f"request body too large (limit {exc.limit} bytes)", "invalid_request_error",
                              code="request_too_large")
        except TimeoutError:
            # The rest of the body may never come (a Content-Length longer than the body): answer
            # and close rather than wait for it.
            resp = json_error(408, "request body not received in time", "invalid_request_error",
                              code="body_timeout")
            resp.force_close()
            return resp
        try:
            payload, features = parse_request(request.path, body, self._settings.max_json_depth,
                                              self._settings.prompt_counter)
        except BadRequest as exc:
            return json_error(400, str(exc), "invalid_request_error", param=exc.param)
        if not self._tables.synced.is_set():
            return json_error(503, "routing tables not synced yet", "service_unavailable",
                              code="tables_not_synced", headers={"Retry-After": "1"})
        table = self._tables.get(features.model)
        if table is None:
            return json_error(404, f"the model {features.model!r} does not exist", "invalid_request_error",
                              param="model", code="model_not_found")
        ex = request.exchange
        ex.pool = table.pool
        try:
            rclass = classify(request.headers, trust_priority=self._settings.trust_priority_header,
                              pool_slo=table.slo or self._settings.default_slo)
        except BadHeader as exc:
            return json_error(400, str(exc), "invalid_request_error", param=exc.header, code=exc.error_code)
        ex.cls = rclass.name
        self._budget.on_request()
        policy = self._policy(table.pool)
        hashes = (request_prefix_hashes(request.path, payload) if getattr(policy, "uses_prefix_hashes", False)
                  else features.prefix_hashes)
        return await self._route(request, body, table, features, t0, rclass, policy, hashes)

    async def _route(self, request: Request, body: bytes, table: PoolTable, features: RequestFeatures,
                     t0: float, rclass: RequestClass, policy: registry.Policy,
                     prefix_hashes: tuple[int, ...]) -> Answer:
        """Admission (dispatch now, hold, or 429; this router's budget share is part of it), then
        the pick and the attempts (`_send`)."""
        req = registry.RequestFeatures(features.prompt_tokens, features.max_tokens, prefix_hashes, rclass.priority,
                                       prefix_block_tokens=PREFIX_BLOCK_TOKENS)
        budget = self.admission_budgets.get(table.pool) if self.admission_budgets is not None else None
        gate = self.gate
        if gate is None or not gate.applies(policy):
            if budget is None:
                return await self._send(request, body, table, features, t0, rclass, policy, req)
            # No queue to wait in: a request the share has no room for is refused at once.
            tokens = Tokens.request(features.prompt_tokens, registry.expected_output(policy, req))
            if not budget.allows_tokens(rclass.name, tokens):
                budget.refused_tokens(tokens)
                return json_error(429, f"this router's share of the admission budget of {table.pool!r} is in use",
                                  "rate_limit_exceeded", code=BUDGET_EXHAUSTED,
                                  headers={"Retry-After": "1", REJECT_HEADER: BUDGET_EXHAUSTED})
            hold = request.exchange.hold = budget.acquire_tokens(tokens)
            try:
                return await self._send(request, body, table, features, t0, rclass, policy, req)
            finally:
                hold.release()
        pool = table.pool
        avoid = self._refusals.avoided()

        def snapshot(slo: registry.SloTargets | None) -> registry.PoolSnapshot:
            current = self._tables.get(pool) or table
            return registry.PoolSnapshot(current.entries, self._inflight.snapshot(), avoid, slo=slo)

        outcome = await gate.admit(pool, policy, req, rclass.name, rclass.slo or registry.SloTargets(), t0, snapshot,
                                   budget)
        if isinstance(outcome, Rejected):
            return rejection_response(pool, outcome)
        ex = request.exchange
        if outcome.hold is not None:
            ex.hold = outcome.hold
        ex.predicted_ttft_s = outcome.ttft_s
        sent = [not outcome.held]

        def on_sent() -> None:  # exactly once per held request: the queue hands out the next one
            if not sent[0]:
                sent[0] = True
                gate.sent(pool)

        try:
            return await self._send(request, body, self._tables.get(pool) or table, features, t0, rclass, policy,
                                    req, outcome.closed, on_sent)
        finally:
            on_sent()
            if outcome.hold is not None:  # its share is free again: a request held for it may go
                outcome.hold.release()
                self._wake(pool)

    def _wake(self, pool: str) -> None:
        if self.gate is not None:
            self.gate.wake(pool)

    async def _send(self, request: Request, body: bytes, table: PoolTable, features: RequestFeatures,
                    t0: float, rclass: RequestClass, policy: registry.Policy, req: registry.RequestFeatures,
                    closed: frozenset[str] = frozenset(),
                    on_sent: Callable[[], None] | None = None) -> Answer:
        ex = request.exchange
        ex.plans_tpot = self.gate is not None and self.gate.applies(policy)
        tried: list[str] = []
        failure: _Failure | None = None
        avoid = self._refusals.avoided() | closed
        while True:
            inflight = self._inflight.snapshot()
            choice = None
            if avoid:
                choice = policy.pick(registry.PoolSnapshot(table.entries, inflight, avoid.union(tried),
                                                           slo=rclass.slo), req, self._rng)
            if choice is None:
                choice = policy.pick(registry.PoolSnapshot(table.entries, inflight, frozenset(tried),
                                                           slo=rclass.slo), req, self._rng)
            if choice is None:
                break
            if failure is not None:  # this would be a retry
                if not failure.retryable or len(tried) > self._settings.max_retries:
                    break
                if not self._budget.try_spend():
                    self._metrics.retry_refused.inc()
                    self._log_limited(f"retry_budget_exhausted:{table.pool}", "retry_budget_exhausted",
                                      pool=table.pool)
                    break
                self._metrics.retries.labels(table.pool, failure.kind).inc()
            tried.append(choice.replica_id)
            self._inflight.acquire(choice.replica_id)
            registry.notify(policy, "on_dispatch", req, choice.replica_id)
            if on_sent is not None:
                on_sent()
            try:
                result = await self._attempt(request, body, table, choice, features, t0,
                                             first_token=functools.partial(self._first_token, policy, req,
                                                                           choice.replica_id, table.pool,
                                                                           ex.hold))
            finally:
                self._inflight.release(choice.replica_id)
                tpot = ex.tpot_s
                # Only admission enforces the policy's TPOT plan: without it the TPOT says nothing of it.
                if tpot is not None and ex.plans_tpot:
                    registry.notify_tpot(policy, req, choice.replica_id, tpot, ex.early_tpot_s)
                    margin = getattr(policy, "tpot_margin", None)
                    if margin is not None:
                        self._metrics.tpot_plan_margin_for(table.pool).set(margin)
                registry.notify(policy, "on_complete", req, choice.replica_id)
                self._wake(table.pool)
            if not isinstance(result, _Failure):
                output = ex.output_tokens
                if output is not None:
                    registry.notify_output(policy, req, choice.replica_id, output)
                self._refusals.succeeded(choice.replica_id)
                self._inflight.succeeded(choice.replica_id)
                return result
            failure = result
            self._inflight.failed(choice.replica_id)
            if failure.kind == "connect":
                self._refusals.refused(choice.replica_id)
            self._metrics.upstream_errors.labels(choice.replica_id, failure.kind).inc()
            self._log_limited(f"upstream_attempt_failed:{choice.replica_id}:{failure.kind}",
                              "upstream_attempt_failed", pool=table.pool, replica_id=choice.replica_id,
                              kind=failure.kind, status=failure.status, attempt=len(tried), error=failure.message)
        if failure is None:
            return json_error(503, f"no routable replica for model {table.pool!r}", "service_unavailable",
                              code="no_routable_replica", headers={"Retry-After": "1"})
        if failure.body is not None:
            return Response(failure.status, failure.body, content_type=failure.content_type or "application/json")
        if failure.kind == "timeout":
            return json_error(504, failure.message, "upstream_timeout", code="first_byte_timeout")
        return json_error(502, failure.message, "upstream_error", code=f"upstream_{failure.kind}")

    def _first_token(self, policy: registry.Policy, req: registry.RequestFeatures, replica_id: str,
                     pool: str, hold: Hold | None = None) -> None:
        if hold is not None:  # its prompt is prefilled: out of the budget's prefill tokens
            hold.first_token()
        registry.notify(policy, "on_first_token", req, replica_id)
        self._wake(pool)  # its prefill left the replica's budget

    async def _attempt(self, request: Request, body: bytes, table: PoolTable, choice: registry.Pick,
                       features: RequestFeatures, t0: float,
                       first_token: Callable[[], None] | None = None) -> StreamResponse | _Failure:
        headers = forward_request_headers(request.headers)
        engine_auth = self._settings.engine_credentials.authorization(table.pool)
        if engine_auth is not None:
            headers.append(("Authorization", engine_auth))
        sent = request.exchange.sent_s = self._clock()
        upstream: EngineResponse | None = None
        done = False
        try:
            deadline = _Deadline(self._deadline_clock(), self._settings.first_byte_timeout_s)
            try:
                try:
                    upstream = await self._session.post(choice.endpoint, request.path_qs, headers, body)
                    self._metrics.upstream_latency_for(table.pool).observe(self._clock() - sent)
                    if upstream.status >= 500:
                        data = await upstream.read()
                        return _Failure("upstream_5xx", True, upstream.status,
                                        f"engine answered {upstream.status}", data,
                                        upstream.header("Content-Type"))
                    first = await upstream.readany()
                finally:
                    timed_out = deadline.close()
            except asyncio.CancelledError:
                if not timed_out:
                    raise
                return _Failure("timeout", False, 504, _FIRST_BYTE_TIMEOUT)
            except ConnectFailed as exc:  # nothing was sent
                return _Failure("connect", True, 502, f"cannot connect to replica: {exc.reason}")
            except TimeoutError:
                return _Failure("timeout", False, 504, _FIRST_BYTE_TIMEOUT)
            except (EngineError, ConnectionError) as exc:
                return _Failure("reset", True, 502, f"connection to replica failed: {exc.__class__.__name__}")
            result = await self._stream(request, upstream, first, table, choice, features, t0, first_token)
            done = True
            return result
        finally:
            if upstream is not None:
                if done and upstream.at_eof():
                    upstream.release()
                else:  # cut short (error, client gone, cancel): drop the connection so the engine aborts
                    upstream.close()

    async def _stream(self, request: Request, upstream: EngineResponse, first: bytes,
                      table: PoolTable, choice: registry.Pick, features: RequestFeatures,
                      t0: float, first_token: Callable[[], None] | None = None) -> StreamResponse:
        """`first_token`: called once the engine's first piece (its prefill is done) is on its way
        to the client, not before: its bookkeeping is off the first token's path."""
        ex = request.exchange
        out = StreamResponse(status=upstream.status, reason=upstream.reason,
                       headers=forward_response_headers(upstream.raw_headers))
        out.headers[REPLICA_HEADER] = choice.replica_id
        is_sse = upstream.content_type == "text/event-stream"
        if upstream.content_length is not None and not is_sse:
            out.content_length = upstream.content_length
        first_at: float | None = None
        try:
            await out.prepare(request)
            if first:
                await out.write(first)  # the headers and the first piece in one write
                if features.stream or is_sse:
                    first_at = self._clock()
                    ttft = first_at - t0
                    self._metrics.ttft_for(table.pool).observe(ttft)
                    self._metrics.class_ttft_for(table.pool, ex.cls).observe(ttft)
            if first_token is not None:
                first_token()
            if first_at is not None and self.gate is not None:  # without admission: nothing to learn
                if ex.predicted_ttft_s is not None:
                    self.gate.observe_ttft(table.pool, ex.predicted_ttft_s, first_at - ex.sent_s)
            transport = request.transport
            if transport is None or transport.is_closing():
                raise ConnectionResetError("the client went away")
            sink = _ClientSink(transport, out.chunked, first,
                               self._clock if first_at is not None and ex.plans_tpot else None)
            upstream.relay(sink)
            while True:
                try:
                    ended = await upstream.relay_wait()
                except (EngineError, ConnectionError, TimeoutError) as exc:
                    self._metrics.upstream_errors.labels(choice.replica_id, "midstream").inc()
                    self._log_limited(f"upstream_stream_broken:{choice.replica_id}", "upstream_stream_broken",
                                      pool=table.pool, replica_id=choice.replica_id, error=exc.__class__.__name__)
                    ex.status = "502"
                    if is_sse:
                        await out.write(_sse_error("the engine connection broke mid-stream"))
                        await out.write_eof()
                    elif request.transport is not None:
                        # a truncated body must not look complete: cut the client connection
                        request.transport.close()
                    return out
                if ended:
                    break
                if transport.is_closing():  # the client is gone: its handler is being cancelled
                    raise ConnectionResetError("the client went away")
                await request.drain()  # a slow client: the engine waits (relay paused it)
                upstream.relay_resume()
            await out.write_eof()
            if upstream.status == 200:
                usage = _USAGE.search(sink.prev + sink.last)  # usage comes last: in the final piece or two
                if usage is not None:
                    output = ex.output_tokens = int(usage.group(1))
                    if first_at is not None and output > 1:
                        ex.tpot_s = (self._clock() - first_at) / (output - 1)
                        if sink.early_at is not None and output > EARLY_TOKENS:
                            ex.early_tpot_s = (sink.early_at - first_at) / EARLY_TOKENS
        except ConnectionResetError:  # the client went away while we wrote to it
            ex.status = "499"
            self._metrics.client_disconnects.inc()
            self._log_limited("client_disconnected", "client_disconnected", level="info", pool=table.pool,
                              replica_id=choice.replica_id)
        return out
