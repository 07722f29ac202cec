"""The router's front door: what hostile or broken clients can and cannot do to it. The rules
and their bookkeeping live here; router/http1.py's protocol applies them per connection.

- **Header timeout.** From the first byte of a request to the end of its headers at most
  `header_timeout_s`; then 408 (OpenAI error body) and close. A slowloris client dies there.
- **Keep-alive idle timeout** (`keepalive_timeout_s`), also armed at accept, so a
  connection that never sends anything is closed too.
- **Body timeout** (`body_timeout_s`): applied where the body is read (router.proxy).
- **Connection limit** (`max_client_connections`). A new connection beyond the limit first
  evicts the least recently active connection that is waiting for a request (idle keep-alive,
  never used, or still sending headers) and has been quiet for EVICT_MIN_IDLE_S -- like
  nginx's reusable-connection queue, so idle attackers cannot lock real clients out, while a
  client that just connected gets the time to send its request even in a flood. When no
  connection qualifies, the newcomer is refused: a fixed 503 with an OpenAI error body, then
  close, without reading or parsing anything.
- **Every error in the OpenAI envelope**, parser-level ones included, logged with a rate limit.

asyncio accepts up to its `backlog` argument sockets per loop turn, and the work for each
(protocol, transport, eviction) runs in the same turn. Under a connection flood a large batch
makes each turn long and starves everything else on the loop (the etcd lease keep-alive), so
the listener is made with a small accept batch (`ACCEPT_BATCH`) and then given a deep kernel
queue (`LISTEN_BACKLOG`) by calling listen() again (`listen_socket`, `deepen_backlog`). A batch
of accepted sockets exists before our code sees any, and the sockets closed to make room for
them are released one turn later: the descriptor budget keeps twice a batch spare (`fd_budget`).
On uvloop (the router's default loop) libuv accepts until the kernel queue is empty instead, one
connection at a time through the same protocol factory, so eviction and refusal work alike; the
chaos test (tests/chaos/test_hostile_clients.py: 20,000 idle connections against a 4,000 limit,
the etcd lease kept) passes on both loops.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import structlog

from tidegate.router.parse import error_body
from tidegate.router.ratelog import LogRateLimiter

log = structlog.get_logger(__name__)

LISTEN_BACKLOG = 4096   # the kernel's queue of connections not yet accepted
ACCEPT_BATCH = 128      # sockets asyncio accepts per loop turn
# A refused connection is half-closed after its 503 and kept until the client closes (at most
# REFUSE_LINGER_S): closing at once, with the client's request unread, would send a reset that
# can destroy the 503 before the client reads it. At most REFUSE_LINGER_MAX at a time.
REFUSE_LINGER_S = 1.0
REFUSE_LINGER_MAX = 256
# Descriptors beyond clients and engines: etcd channels, logs, the event loop, the listener,
# one batch of accepted sockets and as many evicted ones not yet released (module docstring),
# and the lingering refused connections.
FD_RESERVE = 2 * ACCEPT_BATCH + REFUSE_LINGER_MAX + 256
# How many least-recently-active connections one newcomer may look at for an idle one.
EVICT_SCAN = 64
# A connection quiet for less than this is never evicted: a real client that just connected
# needs a few event-loop turns to be read, and a flood brings up to ACCEPT_BATCH per turn. So
# eviction makes room for up to max_client_connections / EVICT_MIN_IDLE_S newcomers per second;
# beyond that rate, newcomers get the 503 (and OpenAI clients retry after Retry-After).
EVICT_MIN_IDLE_S = 0.5

C = TypeVar("C", bound=Hashable)


@dataclass(frozen=True)
class FrontDoorLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keepalive_timeout_s: float = 30.0
    max_client_connections: int = 8192


class ConnectionTable(Generic[C]):
    """Open client connections in least-recently-active order, with the time of their last
    activity (from the caller's clock). Pure bookkeeping."""

    def __init__(self, limit: int, min_idle_s: float = EVICT_MIN_IDLE_S) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self.limit = limit
        self.min_idle_s = min_idle_s
        self._conns: OrderedDict[C, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._conns)

    def connections(self) -> list[C]:
        return list(self._conns)

    def add(self, conn: C, now: float) -> None:
        self._conns[conn] = now

    def touch(self, conn: C, now: float) -> None:
        if conn in self._conns:
            self._conns[conn] = now
            self._conns.move_to_end(conn)

    def remove(self, conn: C) -> bool:
        return self._conns.pop(conn, None) is not None

    def make_room(self, is_idle: Callable[[C], bool], now: float) -> tuple[bool, C | None]:
        """Before adding a connection: (admit?, a connection to close to make room). Below the
        limit: (True, None). At it: the least recently active connection that is idle and was
        last active at least `min_idle_s` ago is removed and returned; when none of the
        EVICT_SCAN oldest qualifies: (False, None)."""
        if len(self._conns) < self.limit:
            return True, None
        for _ in range(min(EVICT_SCAN, len(self._conns))):
            conn, last = next(iter(self._conns.items()))
            if now - last < self.min_idle_s:
                return False, None  # the least recently active is recent: so is every other
            if is_idle(conn):
                del self._conns[conn]
                return True, conn
            self._conns[conn] = now  # busy: look at it again only after the others
            self._conns.move_to_end(conn)
        return False, None


def canned_response(status: int, reason: str, message: str, type_: str, code: str,
                    headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    """A complete HTTP/1.1 response with an OpenAI error body that closes the connection,
    written straight to a transport (no request was parsed)."""
    body = json.dumps(error_body(message, type_, None, code)).encode()
    head = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/json",
            f"Content-Length: {len(body)}", "Connection: close", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


BUSY_RESPONSE = canned_response(503, "Service Unavailable", "the router has too many open connections",
                                "service_unavailable", "too_many_connections", (("Retry-After", "1"),))
HEADER_TIMEOUT_RESPONSE = canned_response(408, "Request Timeout", "request headers not received in time",
                                          "invalid_request_error", "header_timeout")


def fd_budget(nofile: int, clients: int, engines: int, reserve: int = FD_RESERVE) -> tuple[int, int]:
    """(client connections, engine connections) that fit in `nofile` descriptors with `reserve`
    spare, so client load can never starve etcd or the engines of descriptors. Scaled down in
    proportion when the configured limits do not fit. Raises ValueError when nothing fits."""
    avail = nofile - reserve
    if avail < 2:
        raise ValueError(f"the open-file limit ({nofile}) leaves no room for connections "
                         f"({reserve} descriptors are kept in reserve); raise `ulimit -n`")
    if clients + engines <= avail:
        return clients, engines
    scale = avail / (clients + engines)
    return max(1, int(clients * scale)), max(1, int(engines * scale))


def raise_nofile_limit() -> int:
    """Lift the soft RLIMIT_NOFILE to the hard limit; returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def listen_socket(host: str, port: int) -> socket.socket:
    """The router's listening socket (IPv4 or IPv6 by the address' form)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG)


def deepen_backlog(sock: socket.socket) -> None:
    """After asyncio started serving `sock` (and called listen(ACCEPT_BATCH) on it), give the
    kernel queue its depth back; on Linux a second listen() only changes the queue length."""
    sock.listen(LISTEN_BACKLOG)


class FrontDoor:
    """Shared state of the guarded server: the connection table, counters, the log limiter."""

    def __init__(self, limits: FrontDoorLimits, on_event: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.clock = clock
        self.table: ConnectionTable[Any] = ConnectionTable(limits.max_client_connections)
        self._on_event = on_event or (lambda _kind: None)
        self._ratelog = LogRateLimiter(clock)
        self.refused_lingering = 0

    def event(self, kind: str, **fields: Any) -> None:
        """Counts an event and logs it, at most once per interval per kind."""
        self._on_event(kind)
        suppressed = self._ratelog.check(kind)
        if suppressed is not None:
            log.warning("client_connection_" + kind, suppressed=suppressed, **fields)


class Refuse(asyncio.Protocol):
    """The connection beyond the limit: one fixed answer, then close (see REFUSE_LINGER_S)."""

    def __init__(self, door: FrontDoor) -> None:
        self._door = door
        self._lingering = False
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # (uvloop's transports are not asyncio.Transport instances, so no isinstance check)
        transport.write(BUSY_RESPONSE)
        if self._door.refused_lingering >= REFUSE_LINGER_MAX or not transport.can_write_eof():
            transport.close()
            return
        self._door.refused_lingering += 1
        self._lingering = True
        transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(REFUSE_LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        pass  # never parsed

    def eof_received(self) -> bool:
        return False  # the client closed: so do we

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._lingering:
            self._lingering = False
            self._door.refused_lingering -= 1


class RateLimitFilter(logging.Filter):
    """For stdlib loggers that libraries write to (asyncio, aiohttp): one line per message
    template per interval, the next one saying how many were dropped."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, interval_s: float = 10.0) -> None:
        super().__init__()
        self._limiter = LogRateLimiter(clock, interval_s)

    def filter(self, record: logging.LogRecord) -> bool:
        suppressed = self._limiter.check(f"{record.name}:{record.msg}")
        if suppressed is None:
            return False
        if suppressed:
            record.msg = f"{record.msg} ({suppressed} similar lines suppressed)"
        return True


def rate_limited_exception_handler(clock: Callable[[], float] = time.monotonic,
                                   interval_s: float = 10.0) -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]],
                                                                         None]:
    """An event-loop exception handler (e.g. 'socket.accept() out of system resource') that
    logs each message at most once per interval, without the traceback every time."""
    limiter = LogRateLimiter(clock, interval_s)

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", "unhandled exception in event loop"))
        suppressed = limiter.check(message)
        if suppressed is None:
            return
        exc = context.get("exception")
        log.error("event_loop_error", message=message, suppressed=suppressed,
                  error=exc.__class__.__name__ if exc is not None else None, detail=str(exc) if exc else None)

    return handler
