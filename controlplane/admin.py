"""The admin API (`tidegate.v1.Admin`) served by every control-plane instance.

Reads come from this instance's FleetState. Cordon/Uncordon write/delete the ReplicaIntent in
etcd (any instance may; the leader's decision loop reads intents through a WatchCache).
Drain, DrainStatus and ListEvents are not implemented yet (UNIMPLEMENTED).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import grpc.aio
from google.protobuf import timestamp_pb2

from controlplane.fleet import FleetState
from controlplane.publisher import TablePublisher
from tidegate import codec, keys
from tidegate.errors import StoreError
from tidegate.policy.weights import ReplicaView, decide
from tidegate.store.api import Store
from tidegate.v1 import admin_pb2, admin_pb2_grpc, records_pb2

RS = records_pb2.ReplicaState
ACTOR_METADATA = "x-tidegate-actor"


class AdminService(admin_pb2_grpc.AdminServicer):
    def __init__(
        self,
        fleet: FleetState,
        store: Store,
        publisher: TablePublisher,
        controlplane_id: str,
        is_leader: Callable[[], bool],
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._fleet = fleet
        self._store = store
        self._publisher = publisher
        self._id = controlplane_id
        self._is_leader = is_leader
        self._wall = wall_clock

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
            gpu_telemetry_available=view.gpu_telemetry_available,
        )

    async def ListReplicas(self, request: admin_pb2.ListReplicasRequest,  # noqa: N802
                           context: grpc.aio.ServicerContext) -> admin_pb2.ListReplicasResponse:
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
        return admin_pb2.ListReplicasResponse(replicas=out, controlplane_id=self._id, leader=self._is_leader())

    async def DescribeReplica(self, request: admin_pb2.DescribeReplicaRequest,  # noqa: N802
                              context: grpc.aio.ServicerContext) -> admin_pb2.ReplicaDetail:
        view = self._fleet.view(request.replica_id)
        rec = self._fleet.get(request.replica_id)
        if view is None or rec is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"replica {request.replica_id!r} is not known to control plane {self._id}")
        summary = self._summary(view)
        detail = admin_pb2.ReplicaDetail(summary=summary, hello=rec.hello,
                                         reasons=[r for r in summary.reason.split("; ") if r])
        if rec.report is not None:
            detail.last_report.CopyFrom(rec.report)
        intent = self._fleet.intent(request.replica_id)
        if intent is not None:
            detail.intent.CopyFrom(intent)
        return detail

    async def ListPools(self, request: admin_pb2.ListPoolsRequest,  # noqa: N802
                        context: grpc.aio.ServicerContext) -> admin_pb2.ListPoolsResponse:
        pools: dict[str, admin_pb2.PoolSummary] = {}
        for view in self._fleet.views():
            p = pools.get(view.pool)
            if p is None:
                p = pools[view.pool] = admin_pb2.PoolSummary(
                    pool=view.pool, generation=self._publisher.generation(view.pool))
            d = decide(view, self._fleet.policy)
            name = RS.Name(d.state).removeprefix("REPLICA_STATE_").lower()
            p.replicas_by_state[name] = p.replicas_by_state[name] + 1
            p.total_weight += d.weight
        return admin_pb2.ListPoolsResponse(pools=[pools[k] for k in sorted(pools)])

    # ------------------------------------------------------------ intents

    def _select(self, selector: admin_pb2.Selector) -> list[str]:
        ids = set(selector.replica_ids)
        if selector.labels:
            for view in self._fleet.views():
                labels = {"pool": view.pool, "region": view.region, "zone": view.zone}
                if all(labels.get(k) == v for k, v in selector.labels.items()):
                    ids.add(view.replica_id)
        return sorted(ids)

    async def _change_intent(self, selector: admin_pb2.Selector, cordon: bool, reason: str,
                             dry_run: bool, context: grpc.aio.ServicerContext) -> admin_pb2.IntentResponse:
        if not selector.replica_ids and not selector.labels:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "empty selector: name replica ids or labels (pool, region, zone)")
        bad = set(selector.labels) - {"pool", "region", "zone"}
        if bad:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"unknown selector labels {sorted(bad)}; valid: pool, region, zone")
        actor = dict(context.invocation_metadata() or ()).get(ACTOR_METADATA, "sre:unknown")
        verb = "cordon" if cordon else "uncordon"
        results = []
        try:
            for rid in self._select(selector):
                kv = await self._store.get(keys.intent(rid))
                current = codec.decode(kv.value, records_pb2.ReplicaIntent) if kv else None
                is_cordoned = bool(current and (current.cordoned or current.draining))
                if cordon == is_cordoned:
                    results.append(admin_pb2.IntentResult(replica_id=rid, changed=False,
                                                          message=f"already {verb}ed"))
                    continue
                if self._fleet.get(rid) is None and cordon:
                    results.append(admin_pb2.IntentResult(
                        replica_id=rid, changed=False, message="unknown replica (not connected here)"))
                    continue
                if dry_run:
                    results.append(admin_pb2.IntentResult(replica_id=rid, changed=True,
                                                          message=f"would {verb} (dry run)"))
                    continue
                if cordon:
                    ts = timestamp_pb2.Timestamp()
                    ts.FromNanoseconds(int(self._wall() * 1e9))
                    intent = records_pb2.ReplicaIntent(replica_id=rid, cordoned=True, reason=reason,
                                                       actor=actor, created_at=ts)
                    await self._store.put(keys.intent(rid), codec.encode(intent))
                else:
                    # Uncordon also ends a drain, like `kubectl uncordon`.
                    await self._store.delete(keys.intent(rid))
                results.append(admin_pb2.IntentResult(replica_id=rid, changed=True, message=f"{verb}ed"))
        except StoreError as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"etcd: {e}")
        except codec.DecodeError as e:
            await context.abort(grpc.StatusCode.DATA_LOSS, str(e))
        return admin_pb2.IntentResponse(results=results)

    async def Cordon(self, request: admin_pb2.CordonRequest,  # noqa: N802
                     context: grpc.aio.ServicerContext) -> admin_pb2.IntentResponse:
        return await self._change_intent(request.selector, True, request.reason, request.dry_run, context)

    async def Uncordon(self, request: admin_pb2.UncordonRequest,  # noqa: N802
                       context: grpc.aio.ServicerContext) -> admin_pb2.IntentResponse:
        return await self._change_intent(request.selector, False, request.reason, request.dry_run, context)
