"""Who may stream telemetry, for which replica ids, advertising which endpoints.

Without this, anyone who can reach the control plane can register a replica (or re-register
an existing one) with an endpoint of their choice and receive user traffic with its prompts.

**Credentials** (`--telemetry-credentials-file`): one CSV line per agent token,

    # identity,sha256,replica-id patterns
    node-a,5e88489...(64 hex digits),replica-0 replica-1
    gpu-pool-b,9f86d08...,pool-b-*

`sha256` is the hex SHA-256 of the token (the file never holds a token, so reading it does
not let anyone impersonate an agent: `printf %s "$TOKEN" | sha256sum`); patterns are
space-separated shell globs (`fnmatch`, case-sensitive) of the replica ids the identity may
speak for. An identity may have several lines (several tokens: rotation). Agents send
`authorization: Bearer <token>` metadata.

**Checks**, in order, each a pure function here, mapped to gRPC codes only at the edge
(controlplane/telemetry.py):

1. the token is known                          -> else UnauthenticatedError
2. the identity's patterns match the replica id -> else PermissionDeniedError
3. the advertised endpoint is an http(s) base URL whose host lies in the allowed networks
   (`--telemetry-allowed-networks`: CIDRs, or host-name globs for DNS names, which trusts
   DNS)                                          -> else PermissionDeniedError
4. the replica id is not held (`ReplicaClaims`) -> else ReplicaHeldError / PermissionDeniedError

`ReplicaClaims` binds a replica id to one identity: the newest stream of the identity that
registered it holds it (a restarted agent takes over; its old stream is superseded). Another
identity is refused while a stream of the holder is open, and, after the stream ends, for as
long as the control plane still remembers the replica (until it is forgotten after
`remove_after_s` without reports): a registration, and with it the endpoint, can only be
changed by the identity that made it. Claims live in the leader's memory; after a failover
the patterns alone decide who registers first.
"""

from __future__ import annotations

import fnmatch
import hashlib
import ipaddress
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import structlog

from tidegate.config import ConfigError
from tidegate.controlplane.auth import csv_records, read_credentials_file
from tidegate.errors import PermissionDeniedError, ReplicaHeldError, UnauthenticatedError

log = structlog.get_logger(__name__)

CREDENTIAL_FIELDS = "identity,sha256,patterns"
# Loopback only: what `tidegate up` needs, and nothing a remote attacker can serve.
DEFAULT_ALLOWED_NETWORKS = ("127.0.0.0/8", "::1/128", "localhost")

_IDENTITY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_PATTERN = re.compile(r"^[A-Za-z0-9._:/*?\[\]!-]{1,253}$")
_HOST_GLOB = re.compile(r"^[a-z0-9*?.-]{1,253}$")


def token_digest(token: str) -> str:
    """What the credentials file holds for `token`."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class AgentIdentity:
    name: str
    patterns: tuple[str, ...]

    def permits(self, replica_id: str) -> bool:
        return any(fnmatch.fnmatchcase(replica_id, p) for p in self.patterns)


# Every stream of a control plane started with --telemetry-insecure speaks as this identity.
ANONYMOUS = AgentIdentity("anonymous", ("*",))


def parse_credentials(text: str, source: str = "telemetry credentials file") -> dict[str, AgentIdentity]:
    """token digest -> identity. Raises ConfigError naming the source and line of the first bad line."""
    out: dict[str, AgentIdentity] = {}
    for where, (name, digest, patterns_field) in csv_records(text, source, CREDENTIAL_FIELDS):
        if not _IDENTITY.match(name):
            raise ConfigError(f"{where}: identity {name!r} must be 1-128 of letters, digits and ._:@/- "
                              "(starting with a letter or digit)")
        digest = digest.lower().removeprefix("sha256:")
        if not _DIGEST.match(digest):
            # Never echo the field: it may be a token pasted by mistake.
            raise ConfigError(f"{where}: the second field must be the SHA-256 of the token (64 hex digits), "
                              "not the token itself: printf %s \"$TOKEN\" | sha256sum")
        patterns = tuple(patterns_field.split())
        if not patterns:
            raise ConfigError(f"{where}: identity {name!r} has no replica-id patterns")
        for p in patterns:
            if not _PATTERN.match(p):
                raise ConfigError(f"{where}: replica-id pattern {p!r} has characters other than letters, "
                                  "digits, ._:/- and the globs * ? [ ] !")
        if digest in out:
            raise ConfigError(f"{where}: duplicate token digest (also used by {out[digest].name!r})")
        out[digest] = AgentIdentity(name, patterns)
    if not out:
        raise ConfigError(f"{source}: no credentials (expected '{CREDENTIAL_FIELDS}' lines)")
    return out


def identify(credentials: Mapping[str, AgentIdentity], token: str | None) -> AgentIdentity:
    """The identity that was issued `token`. Raises UnauthenticatedError."""
    if not credentials:
        raise UnauthenticatedError("this control plane has no telemetry credentials (start it with "
                                   "--telemetry-credentials-file); every stream is refused")
    if not token:
        raise UnauthenticatedError("missing 'authorization: Bearer <token>' metadata "
                                   "(give the agent --telemetry-token-file or TIDEGATE_TELEMETRY_TOKEN)")
    # Looking up a SHA-256 leaks nothing useful through timing: finding a token from timings
    # of its digest's lookup would need a preimage.
    identity = credentials.get(token_digest(token))
    if identity is None:
        raise UnauthenticatedError("unknown telemetry token")
    return identity


@dataclass(frozen=True)
class AllowedNetworks:
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]
    host_globs: tuple[str, ...]

    @classmethod
    def parse(cls, entries: Iterable[str]) -> AllowedNetworks:
        """Each entry is a CIDR (10.0.0.0/8, fd00::/8, 192.168.1.7) or a host-name glob
        (localhost, *.svc.cluster.local). Raises ValueError naming the bad entry."""
        nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        hosts: list[str] = []
        for raw in entries:
            entry = raw.strip()
            if not entry:
                continue
            try:
                nets.append(ipaddress.ip_network(entry, strict=True))
                continue
            except ValueError as e:
                if "/" in entry or entry.replace(".", "").isdigit() or ":" in entry:
                    raise ValueError(f"{entry!r} is not a network: {e}") from None
            if not _HOST_GLOB.match(entry.lower()):
                raise ValueError(f"{entry!r} is neither a CIDR nor a host-name glob")
            hosts.append(entry.lower())
        if not nets and not hosts:
            raise ValueError("no allowed networks: every endpoint would be refused")
        return cls(tuple(nets), tuple(hosts))

    def describe(self) -> str:
        return ",".join([*(str(n) for n in self.networks), *self.host_globs])

    def check(self, endpoint: str) -> None:
        """Raises PermissionDeniedError unless `endpoint` is an http(s) base URL on an allowed host."""
        try:
            url = urlsplit(endpoint)
            port = url.port
        except ValueError:
            raise PermissionDeniedError(f"endpoint {endpoint!r} is not a valid URL") from None
        host = url.hostname
        if url.scheme not in ("http", "https") or not host:
            raise PermissionDeniedError(f"endpoint {endpoint!r} must be an http:// or https:// URL with a host")
        if url.username is not None or url.password is not None or url.query or url.fragment or port == 0:
            raise PermissionDeniedError(f"endpoint {endpoint!r} must be a plain base URL "
                                        "(no user info, query, fragment or port 0)")
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            if any(fnmatch.fnmatchcase(host.lower(), g) for g in self.host_globs):
                return
        else:
            mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
            if any((mapped or ip) in n for n in self.networks):
                return
        raise PermissionDeniedError(
            f"endpoint host {host!r} is outside the allowed networks ({self.describe()}); "
            "the operator can allow it with the control plane's --telemetry-allowed-networks")


def authorize(identity: AgentIdentity, replica_id: str, endpoint: str, networks: AllowedNetworks) -> None:
    """Checks 2 and 3: may `identity` register `replica_id` at `endpoint`?"""
    if not identity.permits(replica_id):
        raise PermissionDeniedError(
            f"identity {identity.name!r} may not speak for replica id {replica_id!r} "
            f"(its patterns: {' '.join(identity.patterns)})")
    networks.check(endpoint)


@dataclass
class _Holder:
    identity: str
    stream: int


class ReplicaClaims:
    """Which identity holds each replica id (check 4). Pure bookkeeping: the caller says whether
    the fleet still remembers the replica and which stream is asking."""

    def __init__(self) -> None:
        self._open: dict[str, _Holder] = {}
        self._registrant: dict[str, str] = {}

    def claim(self, replica_id: str, identity: str, stream: int, *, remembered: bool) -> int | None:
        """Make `stream` the holder of `replica_id`. Returns the stream it supersedes (the same
        identity's older stream), if any. Raises ReplicaHeldError or PermissionDeniedError."""
        held = self._open.get(replica_id)
        if held is not None and held.identity != identity:
            raise ReplicaHeldError(f"replica id {replica_id!r} is held by another identity's open stream")
        registrant = self._registrant.get(replica_id)
        if held is None and remembered and registrant is not None and registrant != identity:
            raise PermissionDeniedError(
                f"replica id {replica_id!r} was registered by another identity; only that identity may "
                "re-register it until the control plane forgets it (remove_after_s without reports)")
        self._open[replica_id] = _Holder(identity, stream)
        self._registrant[replica_id] = identity
        return held.stream if held is not None else None

    def holds(self, replica_id: str, stream: int) -> bool:
        held = self._open.get(replica_id)
        return held is not None and held.stream == stream

    def release(self, replica_id: str, stream: int) -> bool:
        """The stream ended; True when it was the holder."""
        if self.holds(replica_id, stream):
            del self._open[replica_id]
            return True
        return False


class Credentials(Protocol):
    def current(self) -> Mapping[str, AgentIdentity]: ...


@dataclass(frozen=True)
class StaticCredentials:
    by_digest: Mapping[str, AgentIdentity]

    def current(self) -> Mapping[str, AgentIdentity]:
        return self.by_digest


# What a control plane started without a credentials file holds: every stream is refused.
NO_CREDENTIALS = StaticCredentials({})


class CredentialsFile:
    """The credentials file, re-read when it changes (so tokens can be added and revoked without
    a restart). A file that becomes unreadable or invalid keeps the last good credentials and
    logs an error once per change. The file is looked at (stat) at most every `check_every_s`,
    as every report on every stream asks whether its token is still valid."""

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.monotonic,
                 check_every_s: float = 1.0) -> None:
        self.path = Path(path)
        self._clock = clock
        self._every = check_every_s
        self._checked = clock()
        self._stamp: tuple[int, int, int] | None = None
        self._credentials = self._load()  # a bad file at start-up is a ConfigError for the caller

    def _read_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def _load(self) -> dict[str, AgentIdentity]:
        stamp = self._read_stamp()
        text = read_credentials_file(self.path, "telemetry credentials file")
        creds = parse_credentials(text, source=f"telemetry credentials file {self.path}")
        self._stamp = stamp
        return creds

    def current(self) -> dict[str, AgentIdentity]:
        now = self._clock()
        if now - self._checked < self._every:
            return self._credentials
        self._checked = now
        stamp = self._read_stamp()
        if stamp is not None and stamp != self._stamp:
            try:
                self._credentials = self._load()
                log.info("telemetry_credentials_reloaded", path=str(self.path),
                         identities=len({i.name for i in self._credentials.values()}))
            except ConfigError as e:
                self._stamp = stamp
                log.error("telemetry_credentials_invalid", error=str(e), keeping="the last good credentials")
        return self._credentials


@dataclass(frozen=True)
class TelemetryAccess:
    """What the telemetry service enforces. `credentials` None means --telemetry-insecure:
    every stream speaks as ANONYMOUS (development only); endpoints are still checked."""

    credentials: Credentials | None
    networks: AllowedNetworks

    def identify(self, token: str | None) -> AgentIdentity:
        if self.credentials is None:
            return ANONYMOUS
        return identify(self.credentials.current(), token)

    def authorize(self, identity: AgentIdentity, replica_id: str, endpoint: str) -> None:
        authorize(identity, replica_id, endpoint, self.networks)

    def revoked(self, token: str | None) -> bool:
        """True when a token that opened a stream is no longer in the credentials (the stream must end)."""
        if self.credentials is None:
            return False
        return not token or token_digest(token) not in self.credentials.current()
