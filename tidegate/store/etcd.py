"""`Store` over a real etcd, through aetcd 1.0.0 (grpc.aio).

What this wrapper adds to aetcd (see NOTES-infra.md for the measurements behind it):
- a timeout on every call (aetcd's default is none);
- gRPC keepalive, so a frozen etcd fails a watch in ~15 s instead of hanging for minutes;
- several endpoints through one gRPC multi-address target (failover by pick_first);
- every aetcd/gRPC error mapped onto `StoreError` / `CompactedError` / `LeaseNotFoundError`;
- watches on their own bidi stream built from aetcd's generated `WatchStub`: aetcd's shared
  `Watcher` flattens responses into single events (we want one batch per etcd response, i.e.
  per revision) and delivers stream errors through callbacks that are easy to miss.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aetcd
import aetcd.exceptions
import aetcd.rpc as etcdrpc
import aetcd.utils
import grpc
import grpc.aio
import structlog

from tidegate.errors import CompactedError, StoreError
from tidegate.store.api import Fence, FencedError, KeyValue, LeaseNotFoundError, Listing, WatchEvent
from tidegate.store.etcdsec import EtcdSecurity, secure

log = structlog.get_logger(__name__)

CHANNEL_OPTIONS: dict[str, Any] = {
    # Without both, a SIGSTOPped etcd leaves a watch hanging silently for minutes.
    "grpc.keepalive_time_ms": 10_000,
    "grpc.http2.ping_timeout_ms": 5_000,
    "grpc.keepalive_timeout_ms": 5_000,
    "grpc.keepalive_permit_without_calls": 1,
    "grpc.http2.max_pings_without_data": 0,
    # gRPC shares subchannels across a process's channels by default, so a store opened
    # after an outage inherited another store's reconnect backoff and failed at once
    # with "connection refused" against a healthy etcd (CI, stop 14).
    "grpc.use_local_subchannel_pool": 1,
    # The default backoff grows to 120 s: after a minute-long etcd outage the client
    # would stay away long after etcd was back. 5 s bounds that.
    "grpc.max_reconnect_backoff_ms": 5_000,
}


def _split_endpoint(endpoint: str) -> tuple[str, int]:
    ep = endpoint.strip()
    for scheme in ("http://", "https://"):
        if ep.startswith(scheme):
            ep = ep[len(scheme):]
    ep = ep.rstrip("/")
    host, sep, port = ep.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"etcd endpoint {endpoint!r} is not host:port")
    return host.strip("[]"), int(port)


def _is_ipv4(host: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv4Address)
    except ValueError:
        return False


async def _resolve_ipv4(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, family=socket.AF_INET,
                                                          type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


async def channel_target(endpoints: Sequence[str]) -> tuple[str, int]:
    """(host, port) for aetcd.Client, which formats its gRPC target as f"{host}:{port}".

    One endpoint: plain host:port (gRPC's DNS resolver also fails over across several A
    records). Several: gRPC's multi-address target `ipv4:A:pa,B:pb,...`, which we smuggle
    through aetcd as host="ipv4:A:pa,...,B" and port=pb, because subclassing `connect()` would
    mean copying it. Host names among several endpoints are resolved here (IPv4 only).
    """
    if not endpoints:
        raise ValueError("no etcd endpoints")
    parsed = [_split_endpoint(e) for e in endpoints]
    if len(parsed) == 1:
        return parsed[0]
    addrs: list[str] = []
    for host, port in parsed:
        ips = [host] if _is_ipv4(host) else await _resolve_ipv4(host, port)
        addrs.extend(f"{ip}:{port}" for ip in ips)
    if not addrs:
        raise StoreError(f"no IPv4 address for etcd endpoints {list(endpoints)}")
    *head, last = addrs
    last_host, last_port = last.rsplit(":", 1)
    prefix = "ipv4:" + "".join(a + "," for a in head)
    return prefix + last_host, int(last_port)


def _rpc_error(e: BaseException) -> StoreError:
    if isinstance(e, aetcd.exceptions.RevisionCompactedError):
        return CompactedError(int(e.compacted_revision))
    cause = e.__cause__ if isinstance(e.__cause__, grpc.aio.AioRpcError) else e
    if isinstance(cause, grpc.aio.AioRpcError):
        details = cause.details() or ""
        if "lease not found" in details:
            return LeaseNotFoundError(details)
        if cause.code() == grpc.StatusCode.OUT_OF_RANGE and "compacted" in details:
            return CompactedError(0)
        return StoreError(f"etcd {cause.code().name}: {details}")
    if isinstance(e, asyncio.TimeoutError | aetcd.exceptions.ConnectionTimeoutError):
        return StoreError(f"etcd call timed out: {e}")
    return StoreError(f"etcd error: {type(e).__name__}: {e}")


_ERRORS = (aetcd.exceptions.ClientError, grpc.aio.AioRpcError, asyncio.TimeoutError, grpc.RpcError)


def _kv(kv: Any) -> KeyValue:
    return KeyValue(key=kv.key.decode(), value=bytes(kv.value), mod_revision=int(kv.mod_revision),
                    lease=int(kv.lease))


class EtcdStore:
    """The `Store` protocol over etcd. Create, `await connect()`, use, `await close()`."""

    def __init__(self, endpoints: Sequence[str], timeout_s: float = 2.0, *,
                 security: EtcdSecurity | None = None) -> None:
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e.strip()]
        self._endpoints = list(endpoints)
        self._timeout_s = timeout_s
        self._security = security
        self._client: aetcd.Client | None = None

    @property
    def endpoints(self) -> list[str]:
        return list(self._endpoints)

    @property
    def channel(self) -> grpc.aio.Channel:
        """The grpc.aio channel (for other etcd services, e.g. Election)."""
        return self._connected().channel

    async def connect(self) -> None:
        if self._client is not None:
            return
        host, port = await channel_target(self._endpoints)
        client = aetcd.Client(host=host, port=port, timeout=self._timeout_s,
                              options=dict(CHANNEL_OPTIONS))
        try:
            await client.connect()  # builds the channel and stubs; no round trip
            if self._security is not None:
                await secure(client, f"{host}:{port}", self._security, dict(CHANNEL_OPTIONS), self._timeout_s)
        except _ERRORS as e:
            raise _rpc_error(e) from e
        self._client = client

    def _connected(self) -> aetcd.Client:
        if self._client is None:
            raise StoreError("EtcdStore used before connect()")
        return self._client

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                await asyncio.wait_for(client.close(), self._timeout_s)
            except (*_ERRORS, Exception) as e:  # closing must not raise
                log.debug("etcd_close_failed", error=repr(e))

    async def __aenter__(self) -> EtcdStore:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def get(self, key: str) -> KeyValue | None:
        try:
            r = await self._connected().get(key.encode())
        except _ERRORS as e:
            raise _rpc_error(e) from e
        return None if r is None else _kv(r)

    async def list_prefix(self, prefix: str) -> Listing:
        try:
            r = await self._connected().get_prefix(prefix.encode())
        except _ERRORS as e:
            raise _rpc_error(e) from e
        return Listing(revision=int(r.header.revision), items=tuple(_kv(kv) for kv in r.kvs))

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        try:
            r = await self._connected().put(key.encode(), value, lease=lease or None)
        except _ERRORS as e:
            raise _rpc_error(e) from e
        return int(r.header.revision)

    async def put_fenced(self, key: str, value: bytes, fence: Fence) -> int:
        """One Txn: `create_revision(fence.key) == fence.create_revision` then put. A deposed
        leader (its election key gone or re-created) writes nothing."""
        r = await self._fenced_txn(
            etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=key.encode(), value=value)), fence)
        return int(r.header.revision)

    async def delete_fenced(self, key: str, fence: Fence) -> bool:
        """`delete` in one Txn conditioned on `fence`, like `put_fenced`."""
        r = await self._fenced_txn(
            etcdrpc.RequestOp(request_delete_range=etcdrpc.DeleteRangeRequest(key=key.encode())), fence)
        return int(r.responses[0].response_delete_range.deleted) > 0

    async def _fenced_txn(self, op: Any, fence: Fence) -> Any:
        client = self._connected()
        req = etcdrpc.TxnRequest(
            compare=[etcdrpc.Compare(result=etcdrpc.Compare.EQUAL, target=etcdrpc.Compare.CREATE,
                                     key=fence.key.encode(), create_revision=fence.create_revision)],
            success=[op],
        )
        try:
            r = await client.kvstub.Txn(req, timeout=self._timeout_s, metadata=client.metadata)
        except _ERRORS as e:
            raise _rpc_error(e) from e
        if not r.succeeded:
            raise FencedError(f"fence {fence.key} @ {fence.create_revision} no longer holds")
        return r

    async def delete(self, key: str) -> bool:
        try:
            r = await self._connected().delete(key.encode())
        except _ERRORS as e:
            raise _rpc_error(e) from e
        return r is not None and int(r.deleted) > 0

    async def delete_prefix(self, prefix: str) -> int:
        """Deletes every key under `prefix`; returns how many (not part of `Store`)."""
        try:
            r = await self._connected().delete_prefix(prefix.encode())
        except _ERRORS as e:
            raise _rpc_error(e) from e
        return int(r.deleted) if r is not None else 0

    async def compact(self, revision: int) -> None:
        """Compacts history below `revision` (not part of `Store`; tests and maintenance)."""
        try:
            await self._connected().compact(revision, physical=True)
        except _ERRORS as e:
            raise _rpc_error(e) from e

    async def grant_lease(self, ttl_s: int) -> int:
        try:
            lease = await self._connected().lease(ttl_s)
        except _ERRORS as e:
            raise _rpc_error(e) from e
        return int(lease.id)

    async def refresh_lease(self, lease_id: int) -> int:
        try:
            # aetcd's refresh_lease is a one-message LeaseKeepAlive stream; the gRPC deadline
            # covers the whole exchange.
            reply = await self._connected().refresh_lease(lease_id)
        except _ERRORS as e:
            raise _rpc_error(e) from e
        if reply is None:
            raise StoreError(f"no keep-alive answer for lease {lease_id:x}")
        ttl = int(reply.TTL)
        if ttl <= 0:
            raise LeaseNotFoundError(f"lease {lease_id:x} not found")
        return ttl

    async def revoke_lease(self, lease_id: int) -> None:
        try:
            await self._connected().revoke_lease(lease_id)
        except _ERRORS as e:
            err = _rpc_error(e)
            if isinstance(err, LeaseNotFoundError):
                return  # already gone: revoking is idempotent
            raise err from e

    async def _is_compacted(self, key: bytes, revision: int) -> bool:
        client = self._connected()
        req = etcdrpc.RangeRequest(key=key, range_end=aetcd.utils.prefix_range_end(key),
                                   revision=revision, count_only=True)
        try:
            await client.kvstub.Range(req, timeout=self._timeout_s, metadata=client.metadata)
        except grpc.aio.AioRpcError as e:
            details = e.details() or ""
            if e.code() == grpc.StatusCode.OUT_OF_RANGE:
                return "compacted" in details  # else "future revision": fine to watch
            raise _rpc_error(e) from e
        return False

    async def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[list[WatchEvent]]:
        client = self._connected()
        key = prefix.encode()
        create = etcdrpc.WatchRequest(create_request=etcdrpc.WatchCreateRequest(
            key=key, range_end=aetcd.utils.prefix_range_end(key), start_revision=start_revision,
        ))
        # One request then silence: the stream stays open until we cancel the call.
        requests: asyncio.Queue[Any] = asyncio.Queue()
        requests.put_nowait(create)

        async def request_iter() -> AsyncIterator[Any]:
            while True:
                item = await requests.get()
                if item is None:
                    return
                yield item

        # etcd accepts a watch on a compacted revision and cancels it only on its next sync
        # (~100 ms later). A count-only Range at that revision tells us now, so the first
        # (empty) batch really means "resumed", not "about to fail".
        expect_compacted = start_revision > 0 and await self._is_compacted(key, start_revision)
        call = etcdrpc.WatchStub(client.channel).Watch(request_iter(), metadata=client.metadata)
        watch_id: int | None = None
        try:
            # The created response must come within the timeout; afterwards gRPC keepalive
            # bounds how long a dead or frozen etcd can stay unnoticed.
            try:
                while True:
                    resp = await asyncio.wait_for(call.read(), self._timeout_s)
                    if resp is grpc.aio.EOF:
                        raise StoreError("etcd closed the watch stream before creating it")
                    if resp.compact_revision:
                        raise CompactedError(int(resp.compact_revision))
                    if resp.created and not expect_compacted:
                        watch_id = int(resp.watch_id)
                        break
            except TimeoutError as e:
                if expect_compacted:  # the Range said so; the watch never told us the revision
                    raise CompactedError(0) from e
                raise _rpc_error(e) from e
            except _ERRORS as e:
                if isinstance(e, StoreError):
                    raise
                raise _rpc_error(e) from e
            if resp.canceled:
                raise StoreError(f"etcd refused the watch: {resp.cancel_reason or 'canceled'}")
            yield []
            while True:
                try:
                    resp = await call.read()
                except _ERRORS as e:
                    raise _rpc_error(e) from e
                if resp is grpc.aio.EOF:
                    raise StoreError("etcd watch stream ended")
                if resp.compact_revision:
                    raise CompactedError(int(resp.compact_revision))
                if resp.canceled:
                    raise StoreError(f"etcd canceled the watch: {resp.cancel_reason or 'canceled'}")
                if not resp.events:
                    continue  # progress notification
                yield [
                    WatchEvent(
                        key=ev.kv.key.decode(),
                        value=None if ev.type == etcdrpc.Event.EventType.DELETE else bytes(ev.kv.value),
                        mod_revision=int(ev.kv.mod_revision),
                    )
                    for ev in resp.events
                ]
        finally:
            log.debug("etcd_watch_closed", prefix=prefix, watch_id=watch_id)
            requests.put_nowait(None)
            call.cancel()
