"""Leader election through etcd's server-side Election service (v3electionpb).

Each campaign gets a fresh lease of `ttl_s`, kept alive every ttl/3 by a task. Campaign blocks
inside etcd until this candidate's key is the oldest under the election name. We step down
(`lost` is set, `is_leader` becomes False) as soon as the lease is reported gone, or when no
refresh has succeeded for `ttl_s` measured from the *send* time of the last good refresh: the
server extended the lease no earlier than that, so at that moment the lease may have lapsed and
a standby may already lead. A dead leader's lease lapses after ttl_s and the standby's Campaign
returns (≈2.3 s after the leader stopped, with ttl 3).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import grpc
import grpc.aio
import structlog

from tidegate.aio import cancel_and_wait
from tidegate.errors import StoreError
from tidegate.etcdapi import v3election_pb2 as pb
from tidegate.etcdapi import v3election_pb2_grpc as pb_grpc
from tidegate.store.api import Fence, LeaseNotFoundError
from tidegate.store.etcd import EtcdStore
from tidegate.store.etcdsec import EtcdSecurity
from tidegate.store.watchcache import full_jitter

log = structlog.get_logger(__name__)


class Election:
    def __init__(
        self,
        endpoints: Sequence[str],
        name: str,
        value: bytes,
        ttl_s: int = 3,
        timeout_s: float = 2.0,
        *,
        rng: random.Random | None = None,
        security: EtcdSecurity | None = None,
    ) -> None:
        if ttl_s < 1:
            raise ValueError("ttl_s must be >= 1")
        self._store = EtcdStore(endpoints, timeout_s=timeout_s, security=security)
        self._name = name.encode()
        self._value = value
        self._ttl_s = ttl_s
        self._timeout_s = timeout_s
        self._rng = rng or random.Random()
        self._stub: pb_grpc.ElectionStub | None = None
        self._lease_id = 0
        self._leader_key: pb.LeaderKey | None = None
        self._keepalive: asyncio.Task[None] | None = None
        self.is_leader = False
        self.lost = asyncio.Event()

    @property
    def lease_id(self) -> int:
        return self._lease_id

    @property
    def fence(self) -> Fence | None:
        """The fence of the current term (None when not leading): condition every leader-only
        write on it (`Store.put_fenced`), so a deposed leader's write cannot land."""
        key = self._leader_key
        if key is None or not self.is_leader:
            return None
        return Fence(key=bytes(key.key).decode(), create_revision=int(key.rev))

    def step_down(self, reason: str) -> None:
        """Ends this term now (a fenced write failed: someone else leads, or our key is gone)."""
        self._step_down(reason, self._lease_id)

    async def _connect(self) -> pb_grpc.ElectionStub:
        if self._stub is None:
            await self._store.connect()
            self._stub = pb_grpc.ElectionStub(self._store.channel)
        return self._stub

    async def campaign(self) -> None:
        """Blocks until this instance leads. Retries with backoff while etcd is unreachable."""
        stub = await self._connect()
        self.lost.clear()
        attempt = 0
        while True:
            loop = asyncio.get_running_loop()
            try:
                sent = loop.time()
                lease_id = await self._store.grant_lease(self._ttl_s)
                self._lease_id = lease_id
                self._keepalive = asyncio.create_task(self._keep_alive(lease_id, sent))
                call = asyncio.ensure_future(stub.Campaign(
                    pb.CampaignRequest(name=self._name, lease=lease_id, value=self._value)))
                try:
                    await asyncio.wait({call, self._keepalive}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if not call.done():
                        call.cancel()
                if not call.done() or call.cancelled() or self._keepalive.done():
                    raise StoreError("lease lost while campaigning")
                try:
                    resp = call.result()
                except grpc.aio.AioRpcError as e:
                    raise StoreError(f"Campaign failed: {e.code().name}: {e.details()}") from e
                self._leader_key = resp.leader
                self.is_leader = True
                log.info("election_won", name=self._name.decode(), lease_id=f"{lease_id:x}")
                return
            except StoreError as e:
                log.warning("election_campaign_failed", name=self._name.decode(), error=str(e))
                await self._drop_lease(revoke=True)
                await asyncio.sleep(full_jitter(attempt, 0.2, max(1.0, self._ttl_s / 3), self._rng))
                attempt += 1
            except BaseException:
                await asyncio.shield(self._drop_lease(revoke=True))
                raise

    async def _keep_alive(self, lease_id: int, last_ok_sent: float) -> None:
        loop = asyncio.get_running_loop()
        interval = self._ttl_s / 3
        while True:
            now = loop.time()
            remaining = last_ok_sent + self._ttl_s - now
            if remaining <= 0:
                self._step_down("lease_not_refreshed", lease_id)
                return
            try:
                await asyncio.wait_for(self._store.refresh_lease(lease_id), min(remaining, self._timeout_s))
                last_ok_sent = now
            except LeaseNotFoundError:
                self._step_down("lease_gone", lease_id)
                return
            except (TimeoutError, StoreError) as e:
                log.warning("election_refresh_failed", lease_id=f"{lease_id:x}", error=str(e) or "timeout")
            await asyncio.sleep(max(0.0, min(interval, last_ok_sent + self._ttl_s - loop.time())))

    def _step_down(self, reason: str, lease_id: int) -> None:
        if self.is_leader:
            log.warning("election_lost", name=self._name.decode(), reason=reason, lease_id=f"{lease_id:x}")
            self.is_leader = False
            self.lost.set()
        self._leader_key = None

    async def _drop_lease(self, revoke: bool) -> None:
        task, self._keepalive = self._keepalive, None
        if task is not None and task is not asyncio.current_task():
            # The keep-alive loop runs around wait_for: cancel until it is really done.
            await cancel_and_wait([task], timeout_s=self._timeout_s + 1.0)
        lease_id, self._lease_id = self._lease_id, 0
        if revoke and lease_id:
            try:
                await asyncio.wait_for(self._store.revoke_lease(lease_id), self._timeout_s)
            except (TimeoutError, StoreError) as e:
                log.info("election_revoke_failed", lease_id=f"{lease_id:x}", error=str(e) or "timeout")

    async def leader(self) -> bytes | None:
        """The current leader's value, None when nobody leads."""
        await self._connect()
        return await leader_value(self._store, self._name.decode(), self._timeout_s)

    async def resign(self) -> None:
        """Hands leadership over now (the standby's Campaign returns at once)."""
        key, self._leader_key = self._leader_key, None
        self.is_leader = False
        if key is not None and self._stub is not None:
            try:
                await self._stub.Resign(pb.ResignRequest(leader=key), timeout=self._timeout_s)
            except grpc.aio.AioRpcError as e:
                log.warning("election_resign_failed", error=f"{e.code().name}: {e.details()}")
        await self._drop_lease(revoke=True)
        log.info("election_resigned", name=self._name.decode())

    async def close(self) -> None:
        """Stops refreshing and closes the channel WITHOUT revoking: to etcd this looks like a
        crash, so a standby takes over when the lease lapses. Call `resign()` first for a fast,
        clean handover."""
        await self._drop_lease(revoke=False)
        self.is_leader = False
        self._leader_key = None
        self._stub = None
        await self._store.close()


async def leader_value(store: EtcdStore, name: str, timeout_s: float) -> bytes | None:
    """The value the current leader of election `name` proclaimed, None when nobody leads.
    `store` must be connected. Raises StoreError when etcd does not answer."""
    stub = pb_grpc.ElectionStub(store.channel)
    try:
        resp = await stub.Leader(pb.LeaderRequest(name=name.encode()), timeout=timeout_s)
    except grpc.aio.AioRpcError as e:
        if "no leader" in (e.details() or ""):
            return None
        raise StoreError(f"Leader failed: {e.code().name}: {e.details()}") from e
    return bytes(resp.kv.value) if resp.HasField("kv") else None
