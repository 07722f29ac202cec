"""The router's HTTP/1.1 client for engines: keep-alive connections on a bare asyncio protocol.

Why not aiohttp's client: it was a third of the router's CPU per proxied request (the issue
"Ecosystem", item 5: a request object, a connector lookup, a body-writer task and a stream
reader per request). The router needs one narrow thing: POST a body it already holds to an
engine and relay the answer chunk by chunk. Parsing stays with a library (httptools, llhttp's
parser that uvicorn uses); what is written here is the connection pool and the relay.

- **Pool**: idle connections per endpoint, most recently used first; at most `limit` open in
  all (a request past it waits for one to close, or closes the longest idle one of another
  endpoint); idle ones close after `keepalive_s`. An idle connection the engine closes leaves
  the pool when the loop reads its end.
- **Errors**: `ConnectFailed` (refused, unreachable, or slower than `connect_timeout_s`:
  nothing was sent) and `ConnectionBroken` (reset, closed or a malformed answer once the
  request may have been sent). Both are `EngineError`.
- **Flow control**: a body piece waits in the response until read; past `HIGH_WATER` bytes
  unread the connection stops reading from the engine until the reader catches up, so a slow
  client slows its engine instead of filling the router's memory.
- **Reuse** only after an answer was read to its end and the engine allows keep-alive;
  `close()` drops the connection, which is how an engine learns that a request was abandoned.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

import httptools

HIGH_WATER = 256 * 1024   # unread answer bytes before the connection stops reading
LOW_WATER = 64 * 1024     # ... and resumes


class EngineError(Exception):
    """An engine could not be reached or broke the connection."""


class ConnectFailed(EngineError):
    """No connection was made: the request was not sent."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message  # short: the OS error's or the timeout's class name


class ConnectionBroken(EngineError):
    """The connection failed after the request may have been sent."""


class _Endpoint:
    """Where to connect for one `http(s)://host:port` base URL, parsed once."""

    __slots__ = ("key", "host", "port", "ssl", "host_header", "path", "idle")

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"engine endpoint must be an http(s) URL: {base_url!r}")
        self.key = base_url
        self.host = parts.hostname
        secure = parts.scheme == "https"
        self.port = parts.port or (443 if secure else 80)
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if secure else None
        self.host_header = parts.netloc.rsplit("@", 1)[-1].encode("latin-1")
        self.path = parts.path.rstrip("/").encode("utf-8", "surrogateescape")  # a base path, if any
        self.idle: list[_Connection] = []  # most recently released last


class _Connection(asyncio.Protocol):
    """One connection to one engine; it carries at most one request at a time."""

    def __init__(self, client: EngineClient, endpoint: _Endpoint) -> None:
        self._client = client
        self.endpoint = endpoint
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self.response: EngineResponse | None = None  # the answer being read

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None or response.complete:  # bytes nobody asked for: the connection is unusable
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionBroken(f"malformed answer from the engine: {exc}"))

    def eof_received(self) -> bool | None:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        response = self.response
        if response is not None and not response.complete:
            if response.until_close and response.status and exc is None:
                response._complete()  # an answer without a length ends where the connection does
            else:
                response._fail(ConnectionBroken("the engine closed the connection"
                                                + (f": {exc.__class__.__name__}" if exc else "")))
        self._client._closed(self)

    # -- httptools callbacks

    def on_status(self, reason: bytes) -> None:
        assert self.response is not None
        self.response.reason = reason.decode("utf-8", "surrogateescape")

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.response is not None
        self.response.raw_headers.append((name.decode("utf-8", "surrogateescape"),
                                          value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self) -> None:
        response = self.response
        assert response is not None
        if response.status:  # a second answer to one request
            self._fail(ConnectionBroken("the engine sent an answer nobody asked for"))
            return
        status = self._parser.get_status_code()
        if status < 200:  # 1xx: informational, another header block follows
            response.raw_headers.clear()
            return
        response._headers_done(status)

    def on_body(self, body: bytes) -> None:
        response = self.response
        assert response is not None
        response._feed(body)
        if response.buffered > HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        response = self.response
        if response is not None and response.status:
            response.keep_alive = self._parser.should_keep_alive()
            response._complete()

    # -- ours

    def _fail(self, exc: EngineError) -> None:
        if self.response is not None:
            self.response._fail(exc)
        self.close()

    def pause(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()  # connection_lost follows, which accounts for it


class EngineResponse:
    """An engine's answer: status and headers at once, the body as it comes (`readany`)."""

    __slots__ = ("_conn", "_loop", "status", "reason", "raw_headers", "content_type", "content_length",
                 "until_close", "keep_alive", "complete", "buffered", "_chunks", "_waiter", "_error",
                 "_released", "_sink", "_sink_full")

    def __init__(self, conn: _Connection, loop: asyncio.AbstractEventLoop) -> None:
        self._conn = conn
        self._loop = loop
        self.status = 0
        self.reason = ""
        self.raw_headers: list[tuple[str, str]] = []
        self.content_type = ""           # its media type, lower case, without parameters
        self.content_length: int | None = None
        self.until_close = False         # no length and not chunked: the body ends with the connection
        self.keep_alive = False
        self.complete = False            # the whole answer has arrived
        self.buffered = 0
        self._chunks: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._error: EngineError | None = None
        self._released = False
        self._sink: Callable[[bytes], bool] | None = None  # relay mode: where body pieces go at once
        self._sink_full = False

    def _headers_done(self, status: int) -> None:
        self.status = status
        chunked = False
        for name, value in self.raw_headers:
            lname = name.lower()
            if lname == "content-type":
                self.content_type = value.split(";", 1)[0].strip().lower()
            elif lname == "content-length":
                try:
                    self.content_length = int(value)
                except ValueError:
                    self.content_length = None
            elif lname == "transfer-encoding":
                chunked = "chunked" in value.lower()
        self.until_close = (not chunked and self.content_length is None and status not in (204, 304))
        self._wake()

    def _feed(self, body: bytes) -> None:
        if self._sink is not None and not self._sink_full and not self._chunks:
            if not self._sink(body):
                self._sink_full = True
                self._conn.pause()
                self._wake()
            return
        self._chunks.append(body)
        self.buffered += len(body)
        self._wake()

    def _complete(self) -> None:
        self.complete = True
        self._wake()

    def _fail(self, exc: EngineError) -> None:
        if not self.complete and self._error is None:
            self._error = exc
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def _wait(self) -> None:
        waiter = self._waiter = self._loop.create_future()
        await waiter

    def headers(self, drop: Iterable[str] = ()) -> list[tuple[str, str]]:
        """The answer's headers, without those named (lower case) in `drop`."""
        skip = set(drop)
        return [(k, v) for k, v in self.raw_headers if k.lower() not in skip]

    def header(self, name: str) -> str | None:
        lname = name.lower()
        for k, v in self.raw_headers:
            if k.lower() == lname:
                return v
        return None

    def at_eof(self) -> bool:
        return self.complete and not self._chunks

    async def readany(self) -> bytes:
        """What has arrived of the body since the last call (waiting for some), b"" at its end.
        Raises ConnectionBroken when the connection fails before the end."""
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self.complete:
                return b""
            await self._wait()
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join([chunks.popleft() for _ in range(len(chunks))])
        was = self.buffered
        self.buffered = 0
        if was > LOW_WATER:
            self._conn.resume()
        return data

    def relay(self, sink: Callable[[bytes], bool]) -> None:
        """From now on every body piece goes to `sink(piece)` as it arrives, from the connection's
        own callback: no task switch per piece, which is most of what a streamed chunk costs.
        `sink` returns False when its side is full (a slow client): the connection stops reading
        until `relay_resume()`. Follow it with `relay_wait()`."""
        self._sink = sink
        self._flush_to_sink()

    def _flush_to_sink(self) -> None:
        sink, chunks = self._sink, self._chunks
        assert sink is not None
        while chunks:
            piece = chunks.popleft()
            self.buffered -= len(piece)
            if not sink(piece):
                self._sink_full = True
                self._conn.pause()
                return

    async def relay_wait(self) -> bool:
        """In relay mode: True once the whole body has gone to the sink, False when the sink said
        it is full (drain it, then `relay_resume()`). Raises ConnectionBroken as readany does."""
        while True:
            if self._error is not None:
                raise self._error
            if self._sink_full:
                return False
            if self.complete and not self._chunks:
                return True
            await self._wait()

    def relay_resume(self) -> None:
        """The sink has room again: what waited goes to it, then the connection reads on."""
        self._sink_full = False
        self._flush_to_sink()
        if not self._sink_full:
            self._conn.resume()

    async def read(self) -> bytes:
        """The whole body."""
        parts = []
        while chunk := await self.readany():
            parts.append(chunk)
        return b"".join(parts)

    def release(self) -> None:
        """Done with it: the connection goes back to the pool when the answer was read to its
        end and the engine keeps connections alive, else it closes."""
        if self._released:
            return
        self._released = True
        conn = self._conn
        conn.response = None
        if self.at_eof() and self.keep_alive and self._error is None:
            conn._client._idle(conn)
        else:
            conn.close()

    def close(self) -> None:
        """Abandon it: the connection closes (the engine sees the request go away)."""
        if not self._released:
            self._released = True
            self._conn.response = None
            self._conn.close()


class EngineClient:
    """Keep-alive HTTP/1.1 connections to engines, shared by every request of a router."""

    def __init__(self, connect_timeout_s: float, limit: int = 10_000, keepalive_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self._connect_timeout_s = connect_timeout_s
        self._limit = limit
        self._keepalive_s = keepalive_s
        self._clock = clock
        self._endpoints: dict[str, _Endpoint] = {}
        self._open = 0                                   # connections open or being opened
        self._waiters: deque[asyncio.Future[None]] = deque()  # requests waiting for room under `limit`
        self._sweeper: asyncio.TimerHandle | None = None
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop it serves, once known

    @property
    def open_connections(self) -> int:
        return self._open

    def idle_connections(self) -> int:
        return sum(len(e.idle) for e in self._endpoints.values())

    def _endpoint(self, base_url: str) -> _Endpoint:
        ep = self._endpoints.get(base_url)
        if ep is None:
            try:
                ep = _Endpoint(base_url)
            except ValueError as exc:  # a table's endpoint nobody can connect to: nothing is sent
                raise ConnectFailed(str(exc), "InvalidURL") from exc
            self._endpoints[base_url] = ep
        return ep

    async def post(self, base_url: str, path_qs: str, headers: Iterable[tuple[str, str]],
                   body: bytes) -> EngineResponse:
        """Sends `body` to `base_url` + `path_qs` and waits for the answer's status and headers.
        `headers` go as given (Host and Content-Length are set here)."""
        if self._closing:
            raise ConnectFailed("the engine client is closed")
        ep = self._endpoint(base_url)
        lines = "".join([f"{name}: {value}\r\n" for name, value in headers])
        request = b"".join((b"POST ", ep.path, path_qs.encode("utf-8", "surrogateescape"), b" HTTP/1.1\r\nHost: ",
                            ep.host_header, b"\r\nContent-Length: ", str(len(body)).encode(), b"\r\n",
                            lines.encode("utf-8", "surrogateescape"), b"\r\n"))
        conn = await self._acquire(ep)
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        response = conn.response = EngineResponse(conn, loop)
        try:
            assert conn.transport is not None
            if len(body) <= 64 * 1024:
                conn.transport.write(request + body)
            else:
                conn.transport.writelines((request, body))
            while not response.status:
                if response._error is not None:
                    raise response._error
                await response._wait()
        except BaseException:
            response.close()
            raise
        return response

    async def _acquire(self, ep: _Endpoint) -> _Connection:
        idle = ep.idle
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
        while self._open >= self._limit:
            if not self._close_oldest_idle():
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                try:
                    await waiter
                finally:
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)
            if ep.idle:  # one came back meanwhile
                return await self._acquire(ep)
        self._open += 1
        loop = asyncio.get_running_loop()
        conn = _Connection(self, ep)
        try:
            await asyncio.wait_for(loop.create_connection(lambda: conn, ep.host, ep.port, ssl=ep.ssl),
                                   self._connect_timeout_s)
        except BaseException as exc:
            if not conn.closed:
                conn.closed = True
                self._closed(conn)
            if isinstance(exc, (OSError, TimeoutError)):
                raise ConnectFailed(f"cannot connect to {ep.key}: {exc.__class__.__name__}",
                                    exc.__class__.__name__) from exc
            raise
        return conn

    def _close_oldest_idle(self) -> bool:
        oldest: _Connection | None = None
        for ep in self._endpoints.values():
            if ep.idle and (oldest is None or ep.idle[0].idle_since < oldest.idle_since):
                oldest = ep.idle[0]
        if oldest is None:
            return False
        oldest.endpoint.idle.remove(oldest)
        oldest.close()
        return True

    def _idle(self, conn: _Connection) -> None:
        if conn.closed or self._closing:
            conn.close()
            return
        conn.idle_since = self._clock()
        conn.endpoint.idle.append(conn)
        if self._waiters:  # someone waits for room: a connection to another endpoint makes none
            self._wake_waiter()
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(self._keepalive_s / 2, self._sweep)

    def _closed(self, conn: _Connection) -> None:
        self._open -= 1
        idle = conn.endpoint.idle
        if conn in idle:
            idle.remove(conn)
        self._wake_waiter()

    def _wake_waiter(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _sweep(self) -> None:
        self._sweeper = None
        horizon = self._clock() - self._keepalive_s
        left = False
        for ep in self._endpoints.values():
            stale = [c for c in ep.idle if c.idle_since <= horizon]
            for conn in stale:
                ep.idle.remove(conn)
                conn.close()
            left = left or bool(ep.idle)
        if left and not self._closing:
            self._sweeper = asyncio.get_running_loop().call_later(self._keepalive_s / 2, self._sweep)

    async def close(self) -> None:
        """Closes the idle connections and refuses new requests (answers in flight finish)."""
        self._closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for ep in self._endpoints.values():
            while ep.idle:
                ep.idle.pop().close()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        await asyncio.sleep(0)  # let the transports finish closing
