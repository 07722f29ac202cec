"""TLS and authentication for the etcd client (aetcd 1.0.0 speaks neither TLS nor re-auth).

- TLS: `ca_file` (to verify etcd), and `cert_file` + `key_file` (a client certificate, for an
  etcd started with `--client-cert-auth`; with etcd auth enabled and no password given, etcd
  takes the certificate's common name as the user).
- user/password: etcd's Authenticate gives a token that every call carries as `token`
  metadata. The token is added by channel interceptors, so every stub on the channel (aetcd's,
  our watches, the Election service) carries it. A token that etcd no longer knows (etcd
  restarted, or the token expired) fails a call with UNAUTHENTICATED: the token is dropped, the
  next call authenticates again, and a unary call is retried once at once.

aetcd builds an insecure channel in `connect()` (no round trip); `secure()` replaces it, and
the stubs built on it, with a channel that has the credentials and interceptors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aetcd
import aetcd.rpc as etcdrpc
import grpc
import grpc.aio
import structlog
from aetcd import watcher as aetcd_watcher

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class EtcdSecurity:
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    user: str = ""
    password: str = field(default="", repr=False)

    @property
    def tls(self) -> bool:
        return bool(self.ca_file or self.cert_file)

    def credentials(self) -> grpc.ChannelCredentials:
        def read(p: str) -> bytes | None:
            return Path(p).read_bytes() if p else None

        return grpc.ssl_channel_credentials(root_certificates=read(self.ca_file),
                                            private_key=read(self.key_file),
                                            certificate_chain=read(self.cert_file))

    def channel(self, target: str, options: dict[str, Any],
                interceptors: list[grpc.aio.ClientInterceptor] | None = None) -> grpc.aio.Channel:
        opts = list(options.items())
        if self.tls:
            return grpc.aio.secure_channel(target, self.credentials(), options=opts, interceptors=interceptors)
        return grpc.aio.insecure_channel(target, options=opts, interceptors=interceptors)


class _Token:
    """etcd's auth token for one user, fetched on first use and after etcd rejected it."""

    def __init__(self, sec: EtcdSecurity, target: str, options: dict[str, Any], timeout_s: float) -> None:
        self._sec = sec
        self._target = target
        self._options = options
        self._timeout_s = timeout_s
        self._token = ""
        self._lock = asyncio.Lock()

    async def get(self) -> str:
        async with self._lock:
            if not self._token:
                # A channel of its own: calls on the intercepted channel would need a token.
                async with self._sec.channel(self._target, self._options) as ch:
                    resp = await etcdrpc.AuthStub(ch).Authenticate(
                        etcdrpc.AuthenticateRequest(name=self._sec.user, password=self._sec.password),
                        timeout=self._timeout_s)
                self._token = resp.token
                log.debug("etcd_authenticated", user=self._sec.user)
            return self._token

    def drop(self, token: str) -> None:
        if self._token == token:
            self._token = ""


def _with_token(details: grpc.aio.ClientCallDetails, token: str) -> grpc.aio.ClientCallDetails:
    md = grpc.aio.Metadata(*(details.metadata or ()))
    if "token" in md:
        del md["token"]
    md.add("token", token)
    return grpc.aio.ClientCallDetails(details.method, details.timeout, md, details.credentials,
                                      details.wait_for_ready)


def _rejected(code: grpc.StatusCode) -> bool:
    return code == grpc.StatusCode.UNAUTHENTICATED


class _UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, token: _Token) -> None:
        self._token = token

    async def intercept_unary_unary(self, continuation: Callable[..., Any], details: grpc.aio.ClientCallDetails,
                                    request: Any) -> Any:
        tok = await self._token.get()
        call = await continuation(_with_token(details, tok), request)
        if _rejected(await call.code()):
            self._token.drop(tok)
            return await continuation(_with_token(details, await self._token.get()), request)
        return call


class _Streams(grpc.aio.UnaryStreamClientInterceptor, grpc.aio.StreamUnaryClientInterceptor,
               grpc.aio.StreamStreamClientInterceptor):
    """Streams are not retried (their callers re-open them); a rejected token is dropped."""

    def __init__(self, token: _Token) -> None:
        self._token = token
        self._checks: set[asyncio.Task[None]] = set()  # held so that they are not collected mid-way

    async def _open(self, continuation: Callable[..., Any], details: grpc.aio.ClientCallDetails, arg: Any) -> Any:
        tok = await self._token.get()
        call = await continuation(_with_token(details, tok), arg)

        async def check() -> None:
            if _rejected(await call.code()):
                self._token.drop(tok)

        def on_done(_: object) -> None:
            task = asyncio.ensure_future(check())
            self._checks.add(task)
            task.add_done_callback(self._checks.discard)

        call.add_done_callback(on_done)
        return call

    async def intercept_unary_stream(self, continuation: Callable[..., Any], details: grpc.aio.ClientCallDetails,
                                     request: Any) -> Any:
        return await self._open(continuation, details, request)

    async def intercept_stream_unary(self, continuation: Callable[..., Any], details: grpc.aio.ClientCallDetails,
                                     request_iterator: Any) -> Any:
        return await self._open(continuation, details, request_iterator)

    async def intercept_stream_stream(self, continuation: Callable[..., Any], details: grpc.aio.ClientCallDetails,
                                      request_iterator: Any) -> Any:
        return await self._open(continuation, details, request_iterator)


async def secure(client: aetcd.Client, target: str, sec: EtcdSecurity, options: dict[str, Any],
                 timeout_s: float) -> None:
    """Replace a connected aetcd client's channel with one carrying `sec`'s TLS and token."""
    interceptors: list[grpc.aio.ClientInterceptor] = []
    if sec.user:
        token = _Token(sec, target, options, timeout_s)
        interceptors = [_UnaryUnary(token), _Streams(token)]
    old = client.channel
    channel = sec.channel(target, options, interceptors or None)
    # What aetcd.Client.connect builds on its channel (aetcd 1.0.0).
    client.channel = channel
    client.kvstub = etcdrpc.KVStub(channel)
    client.clusterstub = etcdrpc.ClusterStub(channel)
    client.leasestub = etcdrpc.LeaseStub(channel)
    client.maintenancestub = etcdrpc.MaintenanceStub(channel)
    client._watcher = aetcd_watcher.Watcher(etcdrpc.WatchStub(channel), timeout=client._timeout,  # noqa: SLF001
                                            metadata=None)
    if old is not None:
        await old.close()
