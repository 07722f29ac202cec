"""The admin API (`tidegate.v1.Admin`) served by every control-plane instance.

Every call is authenticated (controlplane/auth.py): viewers read, operators also change.
Only the leader ingests telemetry, so fleet-dependent calls (list, describe, pools, intents,
drain status) made to a standby are forwarded to the leader (address from its LeaderRecord)
with the caller's own metadata. Events, budgets and pool SLOs live in etcd and are served
anywhere; the leader watches the SLO records and copies them into the routing tables.

Intents (cordon, drain) are ReplicaIntent records in etcd, written by the leader alone and
fenced by its term (a refused write ends the term and the call answers UNAVAILABLE). On the
leader an intent change is applied to the fleet and the affected tables are published before
the RPC returns, so routers stop sending new requests within their watch latency (well under
1 s). Cordon and drain check disruption budgets (tidegate/policy/budgets.py) unless forced.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, NoReturn

import grpc
import grpc.aio
import structlog
from google.protobuf import timestamp_pb2
from google.protobuf.message import Message

from tidegate import codec, keys
from tidegate.controlplane.auth import OPERATOR, VIEWER, Authenticator, Principal
from tidegate.controlplane.events import EventLog
from tidegate.controlplane.fleet import FleetState
from tidegate.controlplane.pools import pool_summaries
from tidegate.controlplane.publisher import TablePublisher
from tidegate.controlplane.slo import decode_all as decode_slos
from tidegate.controlplane.slo import validate as validate_slo
from tidegate.errors import StoreError
from tidegate.policy import budgets as budget_policy
from tidegate.policy.weights import ROUTABLE_STATES, ReplicaView, decide
from tidegate.store.api import Fence, FencedError, Store
from tidegate.v1 import admin_pb2, admin_pb2_grpc, records_pb2

log = structlog.get_logger(__name__)

RS = records_pb2.ReplicaState
FORWARDED = "x-tidegate-forwarded"
SELECTOR_LABELS = ("pool", "region", "zone")

# (replica_id, intent or None for deleted, etcd revision of the write)
ApplyIntent = Callable[[str, records_pb2.ReplicaIntent | None, int], Awaitable[None]]


async def _noop_apply(rid: str, intent: records_pb2.ReplicaIntent | None, rev: int) -> None:
    return None


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
    """`context.abort`, typed: it raises (grpc ships no type hints, so a checker cannot tell)."""
    await context.abort(code, details)
    raise AssertionError("grpc's ServicerContext.abort returned")


class AdminService(admin_pb2_grpc.AdminServicer):
    def __init__(
        self,
        fleet: FleetState,
        store: Store,
        publisher: TablePublisher,
        controlplane_id: str,
        is_leader: Callable[[], bool],
        *,
        auth: Authenticator,
        events: EventLog,
        apply_intent: ApplyIntent = _noop_apply,
        slo_ttft_ms: float = 0.0,
        slo_itl_ms: float = 0.0,
        scale: Callable[[], Mapping[str, records_pb2.ScaleRecommendation]] = dict,
        wall_clock: Callable[[], float] = time.time,
        fence: Callable[[], Fence | None],
        on_fenced: Callable[[str], None],
    ) -> None:
        self._fleet = fleet
        self._store = store
        self._publisher = publisher
        self._id = controlplane_id
        self._is_leader = is_leader
        self._fence = fence
        self._on_fenced = on_fenced
        self._auth = auth
        self._events = events
        self._apply = apply_intent
        self._slo = (slo_ttft_ms, slo_itl_ms)
        self._scale = scale
        self._wall = wall_clock
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()

    # ------------------------------------------------------------ forwarding

    async def _forward(self, method: str, request: Message, response_cls: type[Any],
                       context: grpc.aio.ServicerContext) -> Any:
        """Calls the same method on the leader with the caller's metadata."""
        md = tuple(context.invocation_metadata() or ())
        if any(k == FORWARDED for k, _ in md):
            await _abort(context, grpc.StatusCode.UNAVAILABLE,
                                  f"control plane {self._id} is not the leader (forwarded call)")
        try:
            listing = await self._store.list_prefix(keys.ELECTION)
            leader = (codec.decode(listing.items[0].value, records_pb2.LeaderRecord)
                      if listing.items else None)
        except (StoreError, codec.DecodeError) as e:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, f"cannot find the leader: {e}")
        if leader is None or not leader.admin_address or leader.controlplane_id == self._id:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, "no control-plane leader right now; retry")
        ch = self._channels.get(leader.admin_address)
        if ch is None:
            ch = self._channels[leader.admin_address] = grpc.aio.insecure_channel(leader.admin_address)
        call = ch.unary_unary(f"/tidegate.v1.Admin/{method}", request_serializer=lambda m: m.SerializeToString(),
                              response_deserializer=response_cls.FromString)
        try:
            return await call(request, metadata=(*[(k, v) for k, v in md if not k.startswith(":")
                                                   and k not in ("user-agent",)], (FORWARDED, self._id)),
                              timeout=30)
        except grpc.aio.AioRpcError as e:
            await _abort(context, e.code(), e.details() or "")

    # ------------------------------------------------------------ reads

    def _summary(self, view: ReplicaView) -> admin_pb2.ReplicaSummary:
        d = decide(view, self._fleet.policy)
        rec = self._fleet.get(view.replica_id)
        mem_used = mem_total = 0
        if rec is not None and rec.report is not None:
            mem_used = sum(g.memory_used_bytes for g in rec.report.gpus)
            mem_total = sum(g.memory_total_bytes for g in rec.report.gpus)
        return admin_pb2.ReplicaSummary(
            replica_id=view.replica_id, pool=view.pool, region=view.region, zone=view.zone,
            endpoint=view.endpoint, state=d.state, weight=d.weight,
            kv_cache_usage=(1.0 - view.kv_free_tokens / view.kv_capacity_tokens
                            if view.kv_capacity_tokens > 0 else view.kv_usage),
            waiting=view.waiting, running=view.running, ttft_p95_ms=view.ttft_p95_ms,
            itl_p95_ms=view.itl_p95_ms, gpu_memory_used_bytes=mem_used, gpu_memory_total_bytes=mem_total,
            report_age_s=view.report_age_s, reason=d.reason,
            gpu_telemetry_available=view.gpu_telemetry_available, max_num_seqs=view.max_num_seqs,
        )

    async def ListReplicas(self, request: admin_pb2.ListReplicasRequest,  # noqa: N802
                           context: grpc.aio.ServicerContext) -> admin_pb2.ListReplicasResponse:
        await self._auth.require(context, VIEWER)
        if not self._is_leader():
            return await self._forward("ListReplicas", request, admin_pb2.ListReplicasResponse, context)
        out = []
        for view in self._fleet.views():
            if request.pool and view.pool != request.pool:
                continue
            if request.region and view.region != request.region:
                continue
            s = self._summary(view)
            if request.state and s.state != request.state:
                continue
            out.append(s)
        return admin_pb2.ListReplicasResponse(replicas=out, controlplane_id=self._id, leader=True)

    async def DescribeReplica(self, request: admin_pb2.DescribeReplicaRequest,  # noqa: N802
                              context: grpc.aio.ServicerContext) -> admin_pb2.ReplicaDetail:
        await self._auth.require(context, VIEWER)
        if not self._is_leader():
            return await self._forward("DescribeReplica", request, admin_pb2.ReplicaDetail, context)
        view = self._fleet.view(request.replica_id)
        rec = self._fleet.get(request.replica_id)
        if view is None or rec is None:
            await _abort(context, grpc.StatusCode.NOT_FOUND,
                                  f"replica {request.replica_id!r} is not known to control plane {self._id}")
        summary = self._summary(view)
        reasons = [f"state {_state_name(summary.state)}, weight {summary.weight:g}"]
        reasons += [r for r in summary.reason.split("; ") if r]
        intent = self._fleet.intent(request.replica_id)
        if intent is not None:
            what = "draining" if intent.draining else "cordoned"
            reasons.append(f"intent: {what} by {intent.actor or 'unknown'}"
                           + (f" ({intent.reason})" if intent.reason else ""))
        fault = rec.fault
        if fault.cause and not fault.ejected:
            reasons.append(f"last ejection: {fault.cause} (re-admitted)")
        if fault.ejections:
            reasons.append(f"ejections in a row: {fault.ejections}")
        if view.router_inflight:
            reasons.append(f"{view.router_inflight} requests in flight at routers")
        detail = admin_pb2.ReplicaDetail(summary=summary, hello=rec.hello, reasons=reasons)
        if rec.report is not None:
            detail.last_report.CopyFrom(rec.report)
        if intent is not None:
            detail.intent.CopyFrom(intent)
        try:
            detail.events.extend(await self._events.list(request.replica_id, limit=20))
        except StoreError as e:
            detail.reasons.append(f"events unavailable: {e}")
        return detail

    async def ListPools(self, request: admin_pb2.ListPoolsRequest,  # noqa: N802
                        context: grpc.aio.ServicerContext) -> admin_pb2.ListPoolsResponse:
        await self._auth.require(context, VIEWER)
        if not self._is_leader():
            return await self._forward("ListPools", request, admin_pb2.ListPoolsResponse, context)
        budgets = await self._budgets(context)
        pools = pool_summaries(self._fleet, budgets, self._publisher.generation,
                               slo_ttft_ms=self._slo[0], slo_itl_ms=self._slo[1],
                               slos=await self._pool_slos(context), scale=self._scale())
        return admin_pb2.ListPoolsResponse(pools=pools)

    async def DrainStatus(self, request: admin_pb2.DrainStatusRequest,  # noqa: N802
                          context: grpc.aio.ServicerContext) -> admin_pb2.DrainStatusResponse:
        await self._auth.require(context, VIEWER)
        if not self._is_leader():
            return await self._forward("DrainStatus", request, admin_pb2.DrainStatusResponse, context)
        out = []
        for rid in request.replica_ids:
            p = admin_pb2.DrainProgress(replica_id=rid)
            intent = self._fleet.intent(rid)
            if intent is not None and intent.HasField("drain_deadline"):
                p.deadline.CopyFrom(intent.drain_deadline)
            view = self._fleet.view(rid)
            if view is not None:
                d = decide(view, self._fleet.policy)
                p.state, p.running, p.waiting = d.state, view.running, view.waiting
                p.router_inflight = view.router_inflight
                p.done = bool(view.draining and d.state == RS.REPLICA_STATE_DRAINED)
            out.append(p)
        return admin_pb2.DrainStatusResponse(replicas=out)

    # ------------------------------------------------------------ intents

    def _select(self, selector: admin_pb2.Selector) -> list[str]:
        ids = set(selector.replica_ids)
        if selector.labels:
            for view in self._fleet.views():
                labels = {"pool": view.pool, "region": view.region, "zone": view.zone}
                if all(labels.get(k) == v for k, v in selector.labels.items()):
                    ids.add(view.replica_id)
        return sorted(ids)

    async def _budgets(self, context: grpc.aio.ServicerContext) -> dict[str, records_pb2.DisruptionBudget]:
        try:
            listing = await self._store.list_prefix(keys.BUDGETS)
        except StoreError as e:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, f"etcd: {e}")
        out = {}
        for kv in listing.items:
            try:
                b = codec.decode(kv.value, records_pb2.DisruptionBudget)
            except codec.DecodeError:
                log.warning("budget_undecodable", key=kv.key)
                continue
            out[b.scope or keys.leaf(keys.BUDGETS, kv.key)] = b
        return out

    def _members(self) -> list[budget_policy.Member]:
        return [budget_policy.Member(v.replica_id, v.pool, v.region,
                                     decide(v, self._fleet.policy).state in ROUTABLE_STATES)
                for v in self._fleet.views()]

    async def _change_intent(self, verb: str, request: Any, context: grpc.aio.ServicerContext,
                             principal: Principal) -> admin_pb2.IntentResponse:
        """Cordon, uncordon or drain every selected replica, one after the other (sorted ids), each
        landing on its own: there is no transaction over several replicas. When etcd fails, the
        term ends or a stored intent is corrupt midway, what landed before stays landed, and the
        call aborts with a status whose message says which replicas changed, which one was being
        written (it may or may not have landed: the failure may come after the write, e.g. while
        its tables are published) and which were not attempted; running the command again is safe
        (done ones answer "already ...")."""
        selector = request.selector
        if not selector.replica_ids and not selector.labels:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                                  "empty selector: name replica ids or labels (pool, region, zone)")
        bad = set(selector.labels) - set(SELECTOR_LABELS)
        if bad:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                                  f"unknown selector labels {sorted(bad)}; valid: pool, region, zone")
        if verb == "drain" and (request.timeout_s < 0 or request.grace_period_s < 0):
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "timeout_s and grace_period_s must be >= 0")
        force = bool(getattr(request, "force", False))
        budgets = {} if verb == "uncordon" or force else await self._budgets(context)
        members = self._members() if budgets else []
        taking_out: set[str] = set()
        results: list[admin_pb2.IntentResult] = []
        selected = self._select(selector)
        writing = ""   # the replica whose write was sent last: if unanswered, it may have landed

        def partial() -> str:
            msg = _partial(verb, selected, results, writing, request.dry_run)
            if msg:
                log.warning("intent_partial", verb=verb, detail=msg, actor=principal.actor)
            return msg

        try:
            for rid in selected:
                kv = await self._store.get(keys.intent(rid))
                current = codec.decode(kv.value, records_pb2.ReplicaIntent) if kv else None
                out_now = bool(current and (current.cordoned or current.draining))
                if verb == "uncordon" and not out_now:
                    results.append(admin_pb2.IntentResult(replica_id=rid, message="already uncordoned"))
                    continue
                if verb == "cordon" and out_now:
                    results.append(admin_pb2.IntentResult(replica_id=rid, message="already cordoned"))
                    continue
                if verb == "drain" and current is not None and current.draining:
                    results.append(admin_pb2.IntentResult(replica_id=rid, message="already draining"))
                    continue
                if verb != "uncordon" and self._fleet.get(rid) is None:
                    results.append(admin_pb2.IntentResult(
                        replica_id=rid, message="unknown replica (no telemetry from it)"))
                    continue
                if budgets and not out_now:
                    broken = budget_policy.violations(budgets.values(), members, taking_out | {rid})
                    if broken:
                        results.append(admin_pb2.IntentResult(
                            replica_id=rid, refused=True,
                            message="refused: " + "; ".join(broken) + " (use --force to override)"))
                        continue
                taking_out.add(rid)
                done = {"cordon": "cordoned", "uncordon": "uncordoned", "drain": "draining"}[verb]
                if request.dry_run:
                    results.append(admin_pb2.IntentResult(replica_id=rid, changed=True,
                                                          message=f"would be {done} (dry run)"))
                    continue
                intent = None
                # Fenced: the budgets above were checked against this leader's view of the fleet,
                # so a deposed leader (which may not know it yet) must not land the change.
                fence = self._fence()
                if fence is None:
                    await _abort(context, grpc.StatusCode.UNAVAILABLE,
                                          f"control plane {self._id} is no longer the leader; retry{partial()}")
                writing = rid
                if verb == "uncordon":
                    # Uncordon also ends a drain, like `kubectl uncordon`.
                    await self._store.delete_fenced(keys.intent(rid), fence)
                    rev = 0
                else:
                    intent = self._intent(rid, verb, request, principal)
                    rev = await self._store.put_fenced(keys.intent(rid), codec.encode(intent), fence)
                await self._apply(rid, intent, rev)
                view = self._fleet.view(rid)
                await self._events.record(verb, rid, view.pool if view else "", principal.actor,
                                          _event_reason(verb, request, force))
                results.append(admin_pb2.IntentResult(replica_id=rid, changed=True, message=done))
        except FencedError as e:
            self._on_fenced(str(e))
            await _abort(context, grpc.StatusCode.UNAVAILABLE,
                                  f"control plane {self._id} is no longer the leader; retry{partial()}")
        except StoreError as e:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, f"etcd: {e}{partial()}")
        except codec.DecodeError as e:
            await _abort(context, grpc.StatusCode.DATA_LOSS, f"{e}{partial()}")
        for r in results:
            log.info("intent_result", verb=verb, replica_id=r.replica_id, changed=r.changed,
                     refused=r.refused, message=r.message, actor=principal.actor)
        return admin_pb2.IntentResponse(results=results)

    def _intent(self, rid: str, verb: str, request: Any, principal: Principal) -> records_pb2.ReplicaIntent:
        now = self._wall()
        intent = records_pb2.ReplicaIntent(replica_id=rid, cordoned=True, reason=request.reason,
                                           actor=principal.actor, force=bool(request.force))
        intent.created_at.CopyFrom(_timestamp(now))
        if verb == "drain":
            intent.draining = True
            intent.grace_period_s = request.grace_period_s
            if request.timeout_s > 0:
                intent.drain_deadline.CopyFrom(_timestamp(now + request.timeout_s))
        return intent

    async def Cordon(self, request: admin_pb2.CordonRequest,  # noqa: N802
                     context: grpc.aio.ServicerContext) -> admin_pb2.IntentResponse:
        who = await self._auth.require(context, OPERATOR)
        if not self._is_leader():
            return await self._forward("Cordon", request, admin_pb2.IntentResponse, context)
        return await self._change_intent("cordon", request, context, who)

    async def Uncordon(self, request: admin_pb2.UncordonRequest,  # noqa: N802
                       context: grpc.aio.ServicerContext) -> admin_pb2.IntentResponse:
        who = await self._auth.require(context, OPERATOR)
        if not self._is_leader():
            return await self._forward("Uncordon", request, admin_pb2.IntentResponse, context)
        return await self._change_intent("uncordon", request, context, who)

    async def Drain(self, request: admin_pb2.DrainRequest,  # noqa: N802
                    context: grpc.aio.ServicerContext) -> admin_pb2.IntentResponse:
        who = await self._auth.require(context, OPERATOR)
        if not self._is_leader():
            return await self._forward("Drain", request, admin_pb2.IntentResponse, context)
        return await self._change_intent("drain", request, context, who)

    # ------------------------------------------------------------ events and budgets

    async def ListEvents(self, request: admin_pb2.ListEventsRequest,  # noqa: N802
                         context: grpc.aio.ServicerContext) -> admin_pb2.ListEventsResponse:
        await self._auth.require(context, VIEWER)
        try:
            events = await self._events.list(request.replica_id, request.limit or 100)
        except StoreError as e:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, f"etcd: {e}")
        return admin_pb2.ListEventsResponse(events=events)

    async def WatchEvents(self, request: admin_pb2.WatchEventsRequest,  # noqa: N802
                          context: grpc.aio.ServicerContext) -> AsyncIterator[records_pb2.Event]:
        await self._auth.require(context, VIEWER)
        q = self._events.subscribe()
        try:
            while True:
                ev = await q.get()
                if not request.replica_id or ev.replica_id == request.replica_id:
                    yield ev
        finally:
            self._events.unsubscribe(q)

    async def SetBudget(self, request: admin_pb2.SetBudgetRequest,  # noqa: N802
                        context: grpc.aio.ServicerContext) -> admin_pb2.SetBudgetResponse:
        who = await self._auth.require(context, OPERATOR)
        b = records_pb2.DisruptionBudget()
        b.CopyFrom(request.budget)
        try:
            if request.delete:
                budget_policy.parse_scope(b.scope)
            else:
                budget_policy.validate(b)
        except ValueError as e:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"budget: {e}")
        try:
            if request.delete:
                existed = await self._store.delete(keys.budget(b.scope))
                msg = "deleted" if existed else "no such budget"
                if existed:
                    await self._events.record("budget_changed", actor=who.actor, reason=f"{b.scope} deleted")
                return admin_pb2.SetBudgetResponse(budget=b, message=msg)
            b.actor = who.actor
            b.updated_at.CopyFrom(_timestamp(self._wall()))
            await self._store.put(keys.budget(b.scope), codec.encode(b))
        except StoreError as e:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, f"etcd: {e}")
        what = (f"min_available={b.min_available}" if b.min_available else f"max_unavailable={b.max_unavailable}")
        await self._events.record("budget_changed", actor=who.actor, reason=f"{b.scope} {what}")
        return admin_pb2.SetBudgetResponse(budget=b, message="set")

    async def ListBudgets(self, request: admin_pb2.ListBudgetsRequest,  # noqa: N802
                          context: grpc.aio.ServicerContext) -> admin_pb2.ListBudgetsResponse:
        await self._auth.require(context, VIEWER)
        budgets = await self._budgets(context)
        return admin_pb2.ListBudgetsResponse(budgets=[budgets[k] for k in sorted(budgets)])

    # ------------------------------------------------------------ pool SLOs

    async def _pool_slos(self, context: grpc.aio.ServicerContext) -> dict[str, records_pb2.PoolSlo]:
        try:
            listing = await self._store.list_prefix(keys.SLOS)
        except StoreError as e:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, f"etcd: {e}")
        return decode_slos({kv.key: kv for kv in listing.items})

    async def SetPoolSlo(self, request: admin_pb2.SetPoolSloRequest,  # noqa: N802
                         context: grpc.aio.ServicerContext) -> admin_pb2.SetPoolSloResponse:
        who = await self._auth.require(context, OPERATOR)
        slo = records_pb2.PoolSlo(pool=request.slo.pool, ttft_s=request.slo.ttft_s, tpot_s=request.slo.tpot_s)
        try:
            if request.clear:
                if not slo.pool:
                    raise ValueError("no pool named")
            else:
                validate_slo(slo)
        except ValueError as e:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"slo: {e}")
        try:
            kv = await self._store.get(keys.slo(slo.pool))
            try:
                current = codec.decode(kv.value, records_pb2.PoolSlo) if kv else None
            except codec.DecodeError:
                current = records_pb2.PoolSlo()  # unreadable: replaced (or deleted) like any other
            if request.clear:
                if current is None:
                    return admin_pb2.SetPoolSloResponse(message="no SLO set")
                await self._store.delete(keys.slo(slo.pool))
                await self._events.record("slo_changed", pool=slo.pool, actor=who.actor, reason="SLO cleared")
                return admin_pb2.SetPoolSloResponse(message="cleared")
            if current is not None and (current.ttft_s, current.tpot_s) == (slo.ttft_s, slo.tpot_s):
                return admin_pb2.SetPoolSloResponse(slo=current, message="unchanged")
            slo.actor = who.actor
            slo.updated_at.CopyFrom(_timestamp(self._wall()))
            await self._store.put(keys.slo(slo.pool), codec.encode(slo))
        except StoreError as e:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, f"etcd: {e}")
        await self._events.record("slo_changed", pool=slo.pool, actor=who.actor,
                                  reason=f"ttft {slo.ttft_s:g}s tpot {slo.tpot_s:g}s")
        return admin_pb2.SetPoolSloResponse(slo=slo, message="set")

    async def GetPoolSlo(self, request: admin_pb2.GetPoolSloRequest,  # noqa: N802
                         context: grpc.aio.ServicerContext) -> admin_pb2.GetPoolSloResponse:
        await self._auth.require(context, VIEWER)
        slos = await self._pool_slos(context)
        chosen = [slos[p] for p in sorted(slos) if not request.pool or p == request.pool]
        return admin_pb2.GetPoolSloResponse(slos=chosen)


def _partial(verb: str, selected: list[str], results: list[admin_pb2.IntentResult], writing: str,
             dry_run: bool) -> str:
    """What an intent change over `selected` that failed midway did, for the abort message: the
    operator must know which replicas changed before acting again. `writing`: the replica whose
    write was sent last (if it has no result, the write may have landed)."""
    if not selected:
        return ""
    if dry_run:
        return " [dry run: nothing changed]"
    done = {"cordon": "cordoned", "uncordon": "uncordoned", "drain": "draining"}[verb]
    answered = {r.replica_id for r in results}
    landed = [r.replica_id for r in results if r.changed]
    unchanged = [r.replica_id for r in results if not r.changed]
    unknown = [writing] if writing and writing not in answered else []
    untried = [r for r in selected if r not in answered and r not in unknown]
    parts = [f"{done} before the failure (these stand): {', '.join(landed) or 'none'}"]
    if unchanged:
        parts.append(f"left as they were: {', '.join(unchanged)}")
    if unknown:
        parts.append(f"written when it failed, may or may not have landed: {', '.join(unknown)}")
    if untried:
        parts.append(f"not attempted: {', '.join(untried)}")
    return f" [partial {verb}: {'; '.join(parts)}; running it again is safe]"


def _event_reason(verb: str, request: Any, force: bool) -> str:
    parts = [request.reason] if request.reason else []
    if verb == "drain":
        parts.append(f"timeout {request.timeout_s:g}s" if request.timeout_s > 0 else "no timeout")
        if request.grace_period_s:
            parts.append(f"grace {request.grace_period_s:g}s")
    if force and verb != "uncordon":
        parts.append("forced (budgets not checked)")
    return "; ".join(parts)


def _state_name(state: int) -> str:
    return RS.Name(state).removeprefix("REPLICA_STATE_").lower()


def _timestamp(t: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(t * 1e9))
    return ts
