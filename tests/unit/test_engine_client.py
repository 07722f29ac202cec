"""router/engine_client.py against real sockets: a scripted HTTP/1.1 server on 127.0.0.1 that
answers each request as a test says (keep-alive, chunked, until-close, broken, malformed)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tidegate.router.engine_client import (
    HIGH_WATER,
    ConnectFailed,
    ConnectionBroken,
    EngineClient,
)

Answer = Callable[[bytes, bytes, asyncio.StreamWriter], Awaitable[bool]]  # (head, body, writer) -> keep going


class ScriptedEngine:
    """Reads requests (headers and a Content-Length body) and hands each to `answer`; counts the
    connections and requests, and notices connections the client closes."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.closed_by_client = 0
        self.server: asyncio.Server | None = None
        self.url = ""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    self.closed_by_client += 1
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                self.requests.append((head, body))
                if not await self.answer(head, body, writer):
                    return
        except ConnectionError:
            self.closed_by_client += 1
        finally:
            writer.close()

    async def __aenter__(self) -> ScriptedEngine:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.server.wait_closed(), 1.0)


def plain(body: bytes, status: int = 200, extra: bytes = b"") -> Answer:
    async def answer(head: bytes, _: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
                     % (status, len(body), extra, body))
        await writer.drain()
        return True
    return answer


def raw(data: bytes, keep_open: bool) -> Answer:
    """Writes `data` as the whole answer, then keeps the connection (True) or closes it."""
    async def answer(_: bytes, __: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(data)
        await writer.drain()
        return keep_open
    return answer


@contextlib.asynccontextmanager
async def client(**kw: float) -> AsyncIterator[EngineClient]:
    c = EngineClient(kw.pop("connect_timeout_s", 1.0), **kw)  # type: ignore[arg-type]
    try:
        yield c
    finally:
        await c.close()


async def wait_for(cond: Callable[[], bool], timeout_s: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


async def test_plain_answers_reuse_one_connection():
    async with ScriptedEngine(plain(b'{"ok": 1}')) as engine, client() as c:
        for i in range(3):
            r = await c.post(engine.url, f"/v1/chat/completions?i={i}", [("X-Request-Id", "q")], b"hello")
            assert r.status == 200 and r.reason == "X" and r.content_type == "application/json"
            assert r.content_length == 9 and await r.read() == b'{"ok": 1}' and r.at_eof()
            r.release()
        assert engine.connections == 1 and len(engine.requests) == 3
        head, body = engine.requests[2]
        assert head.startswith(b"POST /v1/chat/completions?i=2 HTTP/1.1\r\n") and body == b"hello"
        assert b"\r\nX-Request-Id: q\r\n" in head and b"\r\nContent-Length: 5\r\n" in head
        assert f"\r\nHost: {engine.url[len('http://'):]}\r\n".encode() in head


async def test_base_path_of_an_endpoint_prefixes_the_request_path():
    async with ScriptedEngine(plain(b"{}")) as engine, client() as c:
        r = await c.post(engine.url + "/engine-a/", "/v1/completions", [], b"{}")
        await r.read()
        r.release()
        assert engine.requests[0][0].startswith(b"POST /engine-a/v1/completions HTTP/1.1\r\n")


async def test_chunked_stream_arrives_piece_by_piece():
    go = asyncio.Event()

    async def answer(_: bytes, __: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n5\r\ndata1\r\n")
        await writer.drain()
        await go.wait()
        writer.write(b"5\r\ndata2\r\n0\r\n\r\n")
        await writer.drain()
        return True

    async with ScriptedEngine(answer) as engine, client() as c:
        r = await c.post(engine.url, "/v1/chat/completions", [], b"{}")
        assert r.content_type == "text/event-stream" and r.content_length is None
        assert await r.readany() == b"data1"
        assert not r.at_eof()
        go.set()
        assert await r.read() == b"data2" and r.at_eof()
        r.release()
        r2 = await c.post(engine.url, "/v1/chat/completions", [], b"{}")  # the same connection again
        assert await r2.read() == b"data1data2"
        assert engine.connections == 1


async def test_body_until_close_ends_with_the_connection_and_is_not_reused():
    answer = raw(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"a\": 1}",
                 keep_open=False)

    async with ScriptedEngine(answer) as engine, client() as c:
        for _ in range(2):
            r = await c.post(engine.url, "/v1/completions", [], b"{}")
            assert await r.read() == b'{"a": 1}'
            r.release()
        assert engine.connections == 2
        await wait_for(lambda: c.open_connections == 0)


async def test_informational_answer_is_skipped():
    answer = raw(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok", keep_open=True)

    async with ScriptedEngine(answer) as engine, client() as c:
        r = await c.post(engine.url, "/x", [], b"")
        assert r.status == 201 and r.header("content-length") == "2" and await r.read() == b"ok"


async def test_refused_connection_is_connect_failed():
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    async with client() as c:
        with pytest.raises(ConnectFailed) as info:
            await c.post(f"http://127.0.0.1:{port}", "/x", [], b"")
        assert info.value.reason == "ConnectionRefusedError"
        assert c.open_connections == 0


async def test_connect_timeout_is_connect_failed():
    # 192.0.2.0/24 is TEST-NET-1: never routed, so connecting hangs until the timeout (or fails
    # at once where there is no route at all, which is a ConnectFailed too).
    async with client(connect_timeout_s=0.05) as c:
        with pytest.raises(ConnectFailed):
            await c.post("http://192.0.2.1:9", "/x", [], b"")
        assert c.open_connections == 0


async def test_engine_reset_before_answer_is_connection_broken():
    async def answer(_: bytes, __: bytes, writer: asyncio.StreamWriter) -> bool:
        return False  # read the request, close without a word

    async with ScriptedEngine(answer) as engine, client() as c:
        with pytest.raises(ConnectionBroken):
            await c.post(engine.url, "/x", [], b"{}")
        await wait_for(lambda: c.open_connections == 0)


async def test_engine_dies_mid_body():
    answer = raw(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part", keep_open=False)

    async with ScriptedEngine(answer) as engine, client() as c:
        r = await c.post(engine.url, "/x", [], b"{}")
        assert await r.readany() == b"only part"
        with pytest.raises(ConnectionBroken):
            await r.readany()
        r.release()
        await wait_for(lambda: c.open_connections == 0)


async def test_malformed_answer_is_connection_broken():
    answer = raw(b"NOT HTTP AT ALL\r\n\r\n", keep_open=True)

    async with ScriptedEngine(answer) as engine, client() as c:
        with pytest.raises(ConnectionBroken, match="malformed"):
            await c.post(engine.url, "/x", [], b"{}")
        await wait_for(lambda: c.open_connections == 0)


async def test_idle_connection_closed_by_engine_is_not_reused():
    async def answer(head: bytes, body: bytes, writer: asyncio.StreamWriter) -> bool:
        await plain(b"{}")(head, body, writer)
        return False  # keep-alive promised, then the engine closes it while idle

    async with ScriptedEngine(answer) as engine, client() as c:
        r = await c.post(engine.url, "/x", [], b"")
        await r.read()
        r.release()
        await wait_for(lambda: c.idle_connections() == 0)  # the loop read the close
        r = await c.post(engine.url, "/x", [], b"")
        assert await r.read() == b"{}"
        assert engine.connections == 2


async def test_abandoned_answer_closes_the_connection_so_the_engine_sees_it():
    # the stream never ends; the next read sees the client go
    answer = raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n", keep_open=True)

    async with ScriptedEngine(answer) as engine, client() as c:
        r = await c.post(engine.url, "/x", [], b"")
        assert await r.readany() == b"abc"
        r.close()
        await wait_for(lambda: engine.closed_by_client == 1)
        await wait_for(lambda: c.open_connections == 0)


async def test_cancelled_while_waiting_for_headers_closes_the_connection():
    async def answer(_: bytes, __: bytes, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(10)
        return False

    async with ScriptedEngine(answer) as engine, client() as c:
        task = asyncio.ensure_future(c.post(engine.url, "/x", [], b""))
        await wait_for(lambda: len(engine.requests) == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_for(lambda: c.open_connections == 0)


async def test_limit_waits_for_a_connection_to_come_back():
    release = asyncio.Event()

    async def answer(head: bytes, body: bytes, writer: asyncio.StreamWriter) -> bool:
        if len(engine.requests) == 1:
            await release.wait()
        return await plain(b"{}")(head, body, writer)

    async with ScriptedEngine(answer) as engine, client(limit=1) as c:
        first = asyncio.ensure_future(c.post(engine.url, "/x", [], b""))
        await wait_for(lambda: len(engine.requests) == 1)
        second = asyncio.ensure_future(c.post(engine.url, "/y", [], b""))
        await asyncio.sleep(0.05)
        assert not second.done() and c.open_connections == 1
        release.set()
        r1 = await first
        await r1.read()
        r1.release()
        r2 = await second
        assert await r2.read() == b"{}"
        assert engine.connections == 1 and c.open_connections == 1


async def test_limit_closes_an_idle_connection_to_another_engine():
    async with ScriptedEngine(plain(b"{}")) as a, ScriptedEngine(plain(b"{}")) as b, client(limit=1) as c:
        r = await c.post(a.url, "/x", [], b"")
        await r.read()
        r.release()
        assert c.idle_connections() == 1
        r = await c.post(b.url, "/x", [], b"")
        assert await r.read() == b"{}"
        await wait_for(lambda: a.closed_by_client == 1)


async def test_idle_connections_close_after_keepalive():
    async with ScriptedEngine(plain(b"{}")) as engine, client(keepalive_s=0.1) as c:
        r = await c.post(engine.url, "/x", [], b"")
        await r.read()
        r.release()
        assert c.idle_connections() == 1
        await wait_for(lambda: c.idle_connections() == 0 and engine.closed_by_client == 1)


async def test_unread_answer_pauses_the_engine_connection():
    big = b"x" * (8 * HIGH_WATER)
    async with ScriptedEngine(plain(big)) as engine, client() as c:
        r = await c.post(engine.url, "/x", [], b"")
        await asyncio.sleep(0.1)  # the engine writes all it can; the client stops reading at HIGH_WATER
        assert HIGH_WATER <= r.buffered < len(big)
        assert await r.read() == big  # reading resumes it
        r.release()
        assert c.idle_connections() == 1


async def test_closed_client_refuses_new_requests():
    c = EngineClient(1.0)
    await c.close()
    with pytest.raises(ConnectFailed):
        await c.post("http://127.0.0.1:1", "/x", [], b"")


@pytest.mark.parametrize("url", ["ftp://h:1", "127.0.0.1:80", "http://"])
async def test_bad_endpoint_is_a_failed_connect(url):
    async with client() as c:
        with pytest.raises(ConnectFailed) as info:
            await c.post(url, "/x", [], b"")
        assert info.value.reason == "InvalidURL" and c.open_connections == 0


# -------------------------------------------------------------------------- relay mode


def chunked_pieces(pieces: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


async def test_relay_hands_every_piece_to_the_sink_in_order_then_reuses_the_connection():
    steps = [asyncio.Event() for _ in range(3)]

    async def answer(_: bytes, __: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1\r\na\r\n" + b"1\r\nb\r\n")
        await writer.drain()
        for i, step in enumerate(steps):
            await step.wait()
            writer.write(b"1\r\n%d\r\n" % i)
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    got: list[bytes] = []
    async with ScriptedEngine(answer) as engine, client() as c:
        r = await c.post(engine.url, "/x", [], b"")
        await wait_for(lambda: r.buffered == 2)  # both early pieces wait in the response
        assert await r.readany() == b"ab"
        r.relay(lambda piece: got.append(piece) or True)
        for i, step in enumerate(steps):
            step.set()
            await wait_for(lambda i=i: len(got) == i + 1)  # each piece as it arrives
        assert await r.relay_wait() is True
        assert got == [b"0", b"1", b"2"] and r.at_eof()
        r.release()
        r = await c.post(engine.url, "/x", [], b"")  # the connection went back to the pool
        assert r.status == 200 and engine.connections == 1


async def test_relay_flushes_pieces_that_arrived_before_it():
    body = chunked_pieces([b"one", b"two"])
    async with ScriptedEngine(raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body, True)) as engine, \
            client() as c:
        r = await c.post(engine.url, "/x", [], b"")
        await wait_for(lambda: r.complete)
        got: list[bytes] = []
        r.relay(lambda piece: got.append(piece) or True)
        assert got == [b"one", b"two"] and await r.relay_wait() is True


async def test_full_sink_pauses_the_engine_until_resumed():
    pieces = [bytes([65 + i % 26]) * 65536 for i in range(256)]  # 16 MiB: more than loopback buffers hold
    written = asyncio.Event()

    async def answer(_: bytes, __: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked_pieces(pieces))
        await writer.drain()
        written.set()
        return True

    got: list[bytes] = []

    def sink(piece: bytes) -> bool:
        got.append(piece)
        return False  # full after every piece

    async with ScriptedEngine(answer) as engine, client() as c:
        r = await c.post(engine.url, "/x", [], b"")
        r.relay(sink)
        rounds = 0
        while not await r.relay_wait():
            rounds += 1
            if rounds == 1:
                await asyncio.sleep(0.2)  # paused: the engine cannot finish its answer meanwhile
                assert not written.is_set() and r.buffered <= 2 * HIGH_WATER
            r.relay_resume()
        assert b"".join(got) == b"".join(pieces) and rounds >= 2
        assert written.is_set()
        r.release()
        assert c.idle_connections() == 1


async def test_relay_raises_when_the_engine_breaks_mid_body():
    answer = raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n", keep_open=False)
    async with ScriptedEngine(answer) as engine, client() as c:
        r = await c.post(engine.url, "/x", [], b"")
        got: list[bytes] = []
        r.relay(lambda piece: got.append(piece) or True)
        with pytest.raises(ConnectionBroken):
            await r.relay_wait()
        assert b"".join(got) == b"abc"
        r.release()
        await wait_for(lambda: c.open_connections == 0)


async def test_body_until_close_cut_by_a_reset_is_broken_not_complete():
    import socket
    import struct

    async def answer(_: bytes, __: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\npart")
        await writer.drain()
        await asyncio.sleep(0.05)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        writer.transport.abort()
        return False

    async with ScriptedEngine(answer) as engine, client() as c:
        r = await c.post(engine.url, "/x", [], b"")
        assert r.until_close and await r.readany() == b"part"
        with pytest.raises(ConnectionBroken):
            await r.readany()
