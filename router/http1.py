"""The router's HTTP/1.1 server: a bare asyncio protocol on httptools' request parser (llhttp).

Why not a framework's server: per tiny request aiohttp's low-level server costs ~59 µs of CPU
and uvicorn's (httptools, raw ASGI) ~45 µs, against ~9 µs for a protocol that parses with llhttp
and answers in one write (scripts/probe_http_frontend.py, docs/BENCHMARKS.md). The router serves
a handful of fixed routes, so routing is a dict lookup, and the engine leg already runs on the
same parser (router/engine_client.py). What a framework would give us and is done here:

- **Requests**: the head parsed by llhttp (request line, headers, chunked or sized bodies);
  the head limited to MAX_HEAD_BYTES and each line to MAX_LINE_BYTES (400 `header_too_large`);
  the body to the app's limit (`RequestTooLarge` at `read()`, then the connection closes);
  `Expect: 100-continue` answered before the body is read; HEAD answered without a body.
- **Keep-alive and pipelining**: one request handled at a time per connection, in order; a
  pipelined request's head waits (reading pauses until its turn). `Connection: close` and
  HTTP/1.0 without keep-alive close after the answer.
- **Answers**: `Response` (status, headers, body: one write) and `StreamResponse` (headers go
  out with the first piece; chunked framing on HTTP/1.1, close-delimited on 1.0); a `Date`
  header cached per second; no `Server` header.
- **Flow control**: `Request.drain()` waits while the transport is paused for a slow reader.
- **A client that goes away** cancels its request's handler task (the proxy closes the engine
  connection, which is how the engine learns to abort).
- **The front door's guards** (router/frontdoor.py): the header timeout, the keep-alive timeout,
  the connection table (least recently active idle connections evicted for newcomers, refusal
  beyond), and every error in the OpenAI envelope, logged with a rate limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

import httptools
import structlog
from multidict import CIMultiDict, CIMultiDictProxy

from tidegate.router.frontdoor import (
    HEADER_TIMEOUT_RESPONSE,
    FrontDoor,
    Refuse,
    canned_response,
)
from tidegate.router.parse import error_body

log = structlog.get_logger(__name__)

MAX_LINE_BYTES = 8190        # the request line and each header line (aiohttp's and nginx's order)
MAX_HEAD_BYTES = 64 * 1024   # the whole head
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_REASONS = {s.value: s.phrase for s in HTTPStatus}

TOO_LARGE_HEAD = canned_response(400, "Bad Request", "request line or header field too long",
                                 "invalid_request_error", "header_too_large")
MALFORMED = canned_response(400, "Bad Request", "malformed HTTP request", "invalid_request_error",
                            "malformed_request")
EXPECTATION_FAILED = canned_response(417, "Expectation Failed", "unsupported Expect header",
                                     "invalid_request_error", "expectation_failed")


class RequestTooLarge(Exception):
    """The body is longer than the server's limit (`Server(max_body_bytes=...)`)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body exceeds {limit} bytes")
        self.limit = limit


class _DateHeader:
    """The `Date` header line, formatted at most once per second."""

    __slots__ = ("_second", "_line")

    def __init__(self) -> None:
        self._second = -1
        self._line = ""

    def line(self) -> str:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._line = f"Date: {formatdate(now, usegmt=True)}\r\n"
        return self._line


_DATE = _DateHeader()


class Request:
    """One request on its connection. `headers` is case-insensitive; `path` the raw path without
    the query, `path_qs` the raw target as sent (forwarded to engines as is). `exchange` is the
    handler's own slot (what the proxy notes of the request)."""

    __slots__ = ("method", "path", "path_qs", "headers", "version", "keep_alive", "transport",
                 "exchange", "_conn", "_chunks", "_size", "_complete", "_too_large", "_waiter")

    def __init__(self, conn: Http1Protocol, method: str, target: bytes, headers: CIMultiDictProxy[str],
                 version: str, keep_alive: bool) -> None:
        self._conn = conn
        self.transport = conn.transport
        self.method = method
        if target[:1] == b"/":
            self.path_qs = target.decode("latin-1")
            self.path = self.path_qs.partition("?")[0]
        else:  # absolute form (http://host/path?q) or '*'
            try:
                url = httptools.parse_url(target)
            except httptools.HttpParserInvalidURLError:
                url = None
            path = (url.path or b"/").decode("latin-1") if url is not None else target.decode("latin-1")
            self.path = path
            self.path_qs = path + ("?" + url.query.decode("latin-1") if url is not None and url.query else "")
        self.headers = headers
        self.version = version
        self.keep_alive = keep_alive
        self.exchange: Any = None
        self._chunks: list[bytes] = []
        self._size = 0
        self._complete = False
        self._too_large = False
        self._waiter: asyncio.Future[None] | None = None

    @property
    def body_complete(self) -> bool:
        """The whole body is in (nothing to wait for)."""
        return self._complete or self._too_large

    async def read(self) -> bytes:
        """The whole body. Raises RequestTooLarge past the limit (the connection then closes)."""
        if not self.body_complete:
            self._waiter = self._conn.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._too_large:
            raise RequestTooLarge(self._conn.max_body_bytes)
        chunks = self._chunks
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def drain(self) -> None:
        """Waits while the client reads slower than we write."""
        await self._conn.drain()

    @property
    def write_blocked(self) -> bool:
        """Whether `drain` would wait or raise: a writer awaits it only then, so the hot path
        makes no coroutine when nothing waits."""
        conn = self._conn
        return conn._paused_writing or conn._closing

    def _body(self, data: bytes) -> None:
        if self._too_large:
            return
        self._size += len(data)
        if self._size > self._conn.max_body_bytes:
            self._too_large = True
            self._chunks = []
            self.keep_alive = False  # the rest of the body is never read: the connection closes
            self._wake()
            return
        self._chunks.append(data)

    def _done(self) -> None:
        self._complete = True
        self._wake()

    def _wake(self, exc: BaseException | None = None) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)


def _head(status: int, reason: str | None, headers: CIMultiDict[str] | None, framing: str, close: bool) -> bytes:
    parts = [f"HTTP/1.1 {status} {reason or _REASONS.get(status, 'Unknown')}\r\n"]
    if headers:
        parts += [f"{k}: {v}\r\n" for k, v in headers.items()]
    parts.append(framing)
    parts.append(_DATE.line())
    if close:
        parts.append("Connection: close\r\n")
    parts.append("\r\n")
    return "".join(parts).encode("latin-1")


class Response:
    """A whole answer, written in one piece after the handler returns."""

    __slots__ = ("status", "reason", "headers", "body", "close")

    def __init__(self, status: int = 200, body: bytes = b"", headers: Any = None, content_type: str | None = None,
                 reason: str | None = None) -> None:
        self.status = status
        self.reason = reason
        self.headers: CIMultiDict[str] = CIMultiDict(headers or ())
        if content_type is not None:
            self.headers["Content-Type"] = content_type
        self.body = body
        self.close = False

    def force_close(self) -> None:
        self.close = True

    def encode(self, head_only: bool, close: bool) -> bytes:
        body = self.body
        head = _head(self.status, self.reason, self.headers, f"Content-Length: {len(body)}\r\n",
                     close or self.close)
        return head if head_only or not body else head + body


def json_response(data: Any, status: int = 200, headers: Any = None) -> Response:
    return Response(status, json.dumps(data).encode(), headers, "application/json")


class StreamResponse:
    """An answer written as it comes: `prepare(request)`, then `write(piece)` (the headers go
    out with the first piece), then `write_eof()`. Without a `content_length`, HTTP/1.1 answers
    are chunked (`chunked` tells the caller who writes pieces to the transport itself) and
    HTTP/1.0 ones end when the connection closes."""

    __slots__ = ("status", "reason", "headers", "content_length", "chunked", "finished", "_request", "_sent",
                 "_close")

    def __init__(self, status: int = 200, reason: str | None = None, headers: Any = None) -> None:
        self.status = status
        self.reason = reason
        self.headers: CIMultiDict[str] = CIMultiDict(headers or ())
        self.content_length: int | None = None
        self.chunked = False
        self.finished = False
        self._request: Request | None = None
        self._sent = False
        self._close = False

    @property
    def close(self) -> bool:
        return self._close

    async def prepare(self, request: Request) -> None:
        self._request = request
        if self.content_length is None:
            if request.version == "1.1":
                self.chunked = True
            else:
                self._close = request.keep_alive = False

    def _transport(self) -> Any:
        request = self._request
        if request is None:
            raise RuntimeError("write before prepare")
        return request.transport

    def _head(self) -> bytes:
        self._sent = True
        if self.chunked:
            framing = "Transfer-Encoding: chunked\r\n"
        elif self.content_length is not None:
            framing = f"Content-Length: {self.content_length}\r\n"
        else:
            framing = ""
        request = self._request
        return _head(self.status, self.reason, self.headers, framing,
                     request is not None and not request.keep_alive)

    async def write(self, data: bytes) -> None:
        transport = self._transport()
        if transport.is_closing():
            raise ConnectionResetError("the client went away")
        piece = b"%x\r\n%b\r\n" % (len(data), data) if self.chunked and data else data
        transport.write(piece if self._sent else self._head() + piece)
        request = self._request
        if request is not None and request.write_blocked:
            await request.drain()

    async def write_eof(self) -> None:
        if self.finished:
            return
        transport = self._transport()
        tail = b"0\r\n\r\n" if self.chunked else b""
        if not self._sent:
            tail = self._head() + tail
        if tail and not transport.is_closing():
            transport.write(tail)
        self.finished = True


Answer = Response | StreamResponse
Handler = Callable[[Request], Awaitable[Answer]]


class Http1Protocol(asyncio.Protocol):
    """One client connection: parses requests, runs one handler task at a time, writes answers."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self._door = server.door
        self.loop = server.loop
        self.max_body_bytes = server.max_body_bytes
        self.transport: Any = None
        self._parser = httptools.HttpRequestParser(self)
        # the request being parsed
        self._url = b""
        self._headers: list[tuple[str, str]] = []
        self._head_size = 0             # the head's bytes seen by the callbacks
        self._head_fed = 0              # bytes fed while the head was incomplete
        self._in_head = False           # a request's head has begun and is not complete
        self._parsing: Request | None = None
        # requests whose heads are in, in order; the first is being handled
        self._queue: deque[Request] = deque()
        self._task: asyncio.Task[None] | None = None
        self._paused_reading = False
        self._paused_writing = False
        self._drain: asyncio.Future[None] | None = None
        self._header_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle_since = 0.0
        self._closing = False
        self.evicted = False

    # --- the connection table's view

    @property
    def waiting_for_request(self) -> bool:
        """No request being handled: idle, or its next request's head still coming."""
        return self._task is None and not self._queue

    def evict(self) -> None:
        """Closed to make room for a new connection; it had no request in progress."""
        self.evicted = True
        self._close()

    # --- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.evicted:  # evicted between accept and now: never serve it
            transport.close()
            return
        self.transport = transport
        self._idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._door.table.remove(self)
        self._cancel_timers()
        task = self._task
        if task is not None and not task.done():
            task.cancel()  # the client went away: its handler stops (the proxy aborts the engine leg)
        gone = ConnectionResetError("the client went away")
        for request in self._queue:
            request._wake(gone)
        if self._parsing is not None:
            self._parsing._wake(gone)
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_exception(gone)

    def pause_writing(self) -> None:
        self._paused_writing = True

    def resume_writing(self) -> None:
        self._paused_writing = False
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)

    async def drain(self) -> None:
        if self._closing:
            raise ConnectionResetError("the client went away")
        if not self._paused_writing:
            return
        drain = self._drain
        if drain is None or drain.done():
            drain = self._drain = self.loop.create_future()
        await drain

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        door = self._door
        door.table.touch(self, door.clock())
        continuing = self._in_head  # this chunk continues a head that began before it
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # answered as a plain request (on_message_complete ran); the connection then closes
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            if isinstance(cause, _HeadTooLarge):
                self._fail(TOO_LARGE_HEAD, "header_too_large", None)
            elif isinstance(cause, _Expectation):
                self._fail(EXPECTATION_FAILED, "expectation_failed", None, status=417)
            else:
                self._fail(MALFORMED, "malformed_request", exc)
            return
        if self._in_head:
            # llhttp keeps a header line that is still coming to itself: bound the head by the
            # bytes fed while it lasts (a chunk in which a head began is not counted: <= 256 KiB)
            if continuing:
                self._head_fed += len(data)
                if self._head_fed > MAX_HEAD_BYTES:
                    self._fail(TOO_LARGE_HEAD, "header_too_large", None)
                    return
            if self._header_timer is None:  # armed only for heads that come in pieces (most come whole)
                self._header_timer = self.loop.call_later(door.limits.header_timeout_s, self._header_timeout)

    def eof_received(self) -> bool:
        # A client that half-closes is taken as gone (as aiohttp's server did): the transport
        # closes, connection_lost cancels its handler and the engine leg is aborted. Clients
        # that send a request and shut their side down to wait for the answer are not served.
        return False

    # --- parser callbacks (llhttp, called inside feed_data)

    def on_message_begin(self) -> None:
        self._in_head = True
        self._url = b""
        self._headers = []
        self._head_size = self._head_fed = 0
        self._cancel_idle()

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > MAX_LINE_BYTES:
            raise _HeadTooLarge()

    def on_header(self, name: bytes, value: bytes | None) -> None:
        size = len(name) + (len(value) if value else 0)
        self._head_size += size
        if size > MAX_LINE_BYTES or self._head_size > MAX_HEAD_BYTES:
            raise _HeadTooLarge()
        self._headers.append((name.decode("latin-1"), value.decode("latin-1") if value else ""))

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        parser = self._parser
        headers = CIMultiDictProxy(CIMultiDict(self._headers))
        request = Request(self, parser.get_method().decode("latin-1"), self._url, headers,
                          parser.get_http_version(), parser.should_keep_alive() and not parser.should_upgrade())
        self._parsing = request
        expect = headers.get("Expect")
        if expect is not None:
            if expect.lower() != "100-continue":
                raise _Expectation()
            if request.version == "1.1":
                self.transport.write(CONTINUE)
        self._queue.append(request)
        if self._task is None:
            self._start()
        elif len(self._queue) > 1 and not self._paused_reading:
            # pipelined: its body and what follows wait in the kernel until its turn
            self._paused_reading = True
            self.transport.pause_reading()

    def on_body(self, body: bytes) -> None:
        request = self._parsing
        if request is not None:
            request._body(body)

    def on_message_complete(self) -> None:
        request = self._parsing
        self._parsing = None
        if request is not None:
            request._done()

    # --- requests and answers

    def _start(self) -> None:
        self._task = self.loop.create_task(self._serve(self._queue[0]))

    async def _serve(self, request: Request) -> None:
        answer: Answer | None = None
        try:
            answer = await self._server.handler(request)
        except asyncio.CancelledError:
            raise
        except ConnectionError:
            self._close()
            return
        except Exception as exc:  # a bug: answered, logged with a rate limit
            self._door.event("http_error", status=500, code="internal_error", error=exc.__class__.__name__)
            answer = Response(500, json.dumps(error_body("internal server error", "server_error", None,
                                                         "internal_error")).encode(),
                              content_type="application/json")
            answer.force_close()
        finally:
            self._task = None
        try:
            self._finish(request, answer)
        except Exception as exc:  # an answer that cannot be written (a bug): the connection ends
            self._door.event("http_error", status=500, code="unwritable_answer", error=exc.__class__.__name__)
            self._close()

    def _finish(self, request: Request, answer: Answer | None) -> None:
        transport = self.transport
        if self._closing or transport is None or transport.is_closing():
            return
        keep = request.keep_alive and not self._server.stopping
        if isinstance(answer, Response):
            keep = keep and not answer.close and request.body_complete and not request._too_large
            transport.write(answer.encode(request.method == "HEAD", not keep))
        elif answer is None or not answer.finished or answer.close:
            keep = False
        if not keep:
            self._close()
            return
        self._queue.popleft()
        if self._paused_reading and len(self._queue) <= 1:
            # the next request's turn: the rest of its body (and what follows) may still be coming
            self._paused_reading = False
            transport.resume_reading()
        if self._queue:
            self._start()
            return
        self._idle()

    def _fail(self, canned: bytes, code: str, exc: BaseException | None, status: int = 400) -> None:
        """A request that cannot be parsed: a fixed answer, then close."""
        self._door.event("http_error", status=status, code=code, error=exc.__class__.__name__ if exc else None)
        if self._task is None and self.transport is not None and not self.transport.is_closing():
            self.transport.write(canned)
        self._close()

    def _header_timeout(self) -> None:
        self._header_timer = None
        if not self._in_head or self._closing:
            return
        self._door.event("header_timeout")
        if self._task is None:
            self.transport.write(HEADER_TIMEOUT_RESPONSE)
        self._close()

    # --- the keep-alive timeout: one timer per idle spell, re-armed for the rest when it fires early

    def _idle(self) -> None:
        self._idle_since = self.loop.time()
        if self._idle_timer is None:
            self._idle_timer = self.loop.call_at(self._idle_since + self._door.limits.keepalive_timeout_s,
                                                 self._idle_timeout)

    def _cancel_idle(self) -> None:
        self._idle_since = 0.0

    def _idle_timeout(self) -> None:
        self._idle_timer = None
        if self._closing:
            return
        if self._idle_since == 0.0 or self._in_head:  # busy; the next idle spell arms it again
            return
        due = self._idle_since + self._door.limits.keepalive_timeout_s
        if self.loop.time() >= due:
            self._close()
        else:
            self._idle_timer = self.loop.call_at(due, self._idle_timeout)

    def _cancel_timers(self) -> None:
        for timer in (self._header_timer, self._idle_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._idle_timer = None

    def _close(self) -> None:
        self._closing = True
        self._cancel_timers()
        if self.transport is not None:
            self.transport.close()

    def close_if_idle(self) -> bool:
        if self._task is None and not self._queue:
            self._close()
            return True
        return False


class _HeadTooLarge(Exception):
    """Raised in a parser callback: the head passed a limit."""


class _Expectation(Exception):
    """Raised in a parser callback: an Expect header other than 100-continue."""


class Server:
    """The protocol factory for `loop.create_server`: guards (frontdoor.FrontDoor) per connection,
    then Http1Protocol. `close()` and `shutdown(grace_s)` for a graceful stop."""

    def __init__(self, handler: Handler, door: FrontDoor, max_body_bytes: int,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.handler = handler
        self.door = door
        self.max_body_bytes = max_body_bytes
        self.loop = loop or asyncio.get_running_loop()
        self.stopping = False

    def __call__(self) -> asyncio.Protocol:
        door = self.door
        now = door.clock()
        admit, victim = door.table.make_room(lambda c: c.waiting_for_request, now)
        if victim is not None:
            victim.evict()
            door.event("evicted")
        if not admit:
            door.event("refused", limit=door.table.limit)
            return Refuse(door)
        conn = Http1Protocol(self)
        door.table.add(conn, now)
        return conn

    async def shutdown(self, grace_s: float) -> None:
        """After the listener closed: idle connections close now, busy ones after their answer,
        and whatever is still running after `grace_s` is cut."""
        self.stopping = True
        table = self.door.table  # every open connection is in it until connection_lost
        for conn in table.connections():
            conn.close_if_idle()
        deadline = self.loop.time() + grace_s
        while len(table) and self.loop.time() < deadline:
            await asyncio.sleep(0.05)
        for conn in table.connections():
            with contextlib.suppress(Exception):
                conn._close()
