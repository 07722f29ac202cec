"""The Admin gRPC client the commands use: bearer token, per-call timeouts, fail-over.

Admin calls work on any control-plane instance, so a call goes to the address that answered
last and, when that one is unreachable (UNAVAILABLE), to the next; every other status is the
server's answer and ends the call. The token travels only in call metadata; it is never
logged, and errors carry the status and the server's message, not the metadata.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import grpc
import grpc.aio
import structlog

from tidegate.ops import exitcodes
from tidegate.v1 import admin_pb2, admin_pb2_grpc, records_pb2

log = structlog.get_logger(__name__)

_FAILOVER = {grpc.StatusCode.UNAVAILABLE}


class AdminError(Exception):
    """A failed admin call: gRPC status, the server's (or transport's) message, the address."""

    def __init__(self, code: grpc.StatusCode, details: str, address: str = "") -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.address = address

    @property
    def exit_code(self) -> int:
        return exitcodes.for_status(self.code)

    def __str__(self) -> str:
        where = f" ({self.address})" if self.address else ""
        return f"{self.code.name}: {self.details}{where}"


class AdminClient:
    def __init__(self, addresses: Sequence[str], token: str, *, timeout_s: float = 5.0) -> None:
        if not addresses:
            raise ValueError("no control-plane address")
        self._addresses = list(addresses)
        self._token = token
        self.timeout_s = timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, admin_pb2_grpc.AdminStub] = {}
        self._current = 0

    @property
    def address(self) -> str:
        """The address that answered last (or the first one)."""
        return self._addresses[self._current]

    def _stub(self, address: str) -> admin_pb2_grpc.AdminStub:
        stub = self._stubs.get(address)
        if stub is None:
            channel = grpc.aio.insecure_channel(address)
            self._channels[address] = channel
            stub = self._stubs[address] = admin_pb2_grpc.AdminStub(channel)
        return stub

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self._token}"),)

    def _order(self) -> list[int]:
        n = len(self._addresses)
        return [(self._current + i) % n for i in range(n)]

    async def _unary(self, method: str, request: Any) -> Any:
        tried: list[str] = []
        for i in self._order():
            address = self._addresses[i]
            try:
                resp = await getattr(self._stub(address), method)(
                    request, timeout=self.timeout_s, metadata=self._metadata())
            except grpc.aio.AioRpcError as e:
                if e.code() in _FAILOVER:
                    log.debug("controlplane_unreachable", address=address, method=method)
                    tried.append(f"{address}: {e.details()}")
                    continue
                raise AdminError(e.code(), e.details() or e.code().name, address) from None
            self._current = i
            return resp
        raise AdminError(grpc.StatusCode.UNAVAILABLE, "no control plane answered: " + "; ".join(tried))

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._stubs.clear()

    async def __aenter__(self) -> AdminClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------ calls

    async def list_replicas(self, pool: str = "", region: str = "", state: int = 0
                            ) -> admin_pb2.ListReplicasResponse:
        # The enum is an int on the wire; the generated stubs type it as the wrapper class.
        request = admin_pb2.ListReplicasRequest(pool=pool, region=region, state=cast(Any, state))
        return await self._unary("ListReplicas", request)

    async def describe_replica(self, replica_id: str) -> admin_pb2.ReplicaDetail:
        return await self._unary("DescribeReplica", admin_pb2.DescribeReplicaRequest(replica_id=replica_id))

    async def list_pools(self) -> admin_pb2.ListPoolsResponse:
        return await self._unary("ListPools", admin_pb2.ListPoolsRequest())

    async def cordon(self, selector: admin_pb2.Selector, reason: str, dry_run: bool, force: bool
                     ) -> admin_pb2.IntentResponse:
        return await self._unary("Cordon", admin_pb2.CordonRequest(selector=selector, reason=reason,
                                                                   dry_run=dry_run, force=force))

    async def uncordon(self, selector: admin_pb2.Selector, reason: str, dry_run: bool
                       ) -> admin_pb2.IntentResponse:
        return await self._unary("Uncordon", admin_pb2.UncordonRequest(selector=selector, reason=reason,
                                                                       dry_run=dry_run))

    async def drain(self, selector: admin_pb2.Selector, reason: str, dry_run: bool, force: bool,
                    timeout_s: float, grace_period_s: float) -> admin_pb2.IntentResponse:
        return await self._unary("Drain", admin_pb2.DrainRequest(
            selector=selector, reason=reason, dry_run=dry_run, force=force, timeout_s=timeout_s,
            grace_period_s=grace_period_s))

    async def drain_status(self, replica_ids: Sequence[str]) -> admin_pb2.DrainStatusResponse:
        return await self._unary("DrainStatus", admin_pb2.DrainStatusRequest(replica_ids=list(replica_ids)))

    async def list_events(self, replica_id: str = "", limit: int = 0) -> admin_pb2.ListEventsResponse:
        return await self._unary("ListEvents", admin_pb2.ListEventsRequest(replica_id=replica_id, limit=limit))

    async def set_budget(self, budget: records_pb2.DisruptionBudget, delete: bool = False
                         ) -> admin_pb2.SetBudgetResponse:
        return await self._unary("SetBudget", admin_pb2.SetBudgetRequest(budget=budget, delete=delete))

    async def list_budgets(self) -> admin_pb2.ListBudgetsResponse:
        return await self._unary("ListBudgets", admin_pb2.ListBudgetsRequest())

    async def set_pool_slo(self, slo: records_pb2.PoolSlo, clear: bool = False) -> admin_pb2.SetPoolSloResponse:
        return await self._unary("SetPoolSlo", admin_pb2.SetPoolSloRequest(slo=slo, clear=clear))

    async def get_pool_slo(self, pool: str = "") -> admin_pb2.GetPoolSloResponse:
        return await self._unary("GetPoolSlo", admin_pb2.GetPoolSloRequest(pool=pool))

    async def watch_events(self, replica_id: str = "", *, retry_s: float = 1.0
                           ) -> AsyncIterator[records_pb2.Event]:
        """Events as they happen, for as long as the caller iterates. A stream cut by a control
        plane going away is reopened on the next address (events may repeat; callers dedupe);
        auth and argument errors end the iteration with AdminError."""
        request = admin_pb2.WatchEventsRequest(replica_id=replica_id)
        failures = 0
        while True:
            i = (self._current + failures) % len(self._addresses)
            address = self._addresses[i]
            call = self._stub(address).WatchEvents(request, metadata=self._metadata())
            try:
                async for event in call:
                    self._current, failures = i, 0
                    yield event
                failures += 1  # the server ended the stream (e.g. it is stopping)
            except grpc.aio.AioRpcError as e:
                if e.code() not in _FAILOVER and e.code() != grpc.StatusCode.CANCELLED:
                    raise AdminError(e.code(), e.details() or e.code().name, address) from None
                failures += 1
                log.debug("watch_reconnect", address=address, code=e.code().name)
            finally:
                call.cancel()
            if failures % len(self._addresses) == 0:
                await asyncio.sleep(retry_s)
