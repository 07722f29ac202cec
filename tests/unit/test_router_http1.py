"""router/http1.py, the router's HTTP/1.1 server, over real sockets on 127.0.0.1: keep-alive and
pipelining, bodies (sized, chunked, too large), Expect, HEAD, HTTP/1.0, streamed answers, parser
errors, timeouts, the connection limit, a client that goes away, a handler's bug, shutdown."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidegate.router.frontdoor import FrontDoor, FrontDoorLimits
from tidegate.router.http1 import MAX_HEAD_BYTES, Request, Response, Server, StreamResponse, json_response

LIMIT = 1000  # body bytes


class EchoApp:
    """Answers what it parsed; special paths stream, sleep or fail."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, Any, bytes]] = []
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()

    async def __call__(self, request: Request) -> Response | StreamResponse:
        body = await request.read()
        self.seen.append((request.method, request.path, request.path_qs, request.headers, body))
        if request.path == "/stream":
            out = StreamResponse(200, headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            for i in range(3):
                await out.write(b"data: %d\n\n" % i)
            await out.write_eof()
            return out
        if request.path == "/hang":
            self.started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        if request.path == "/slow":
            await asyncio.sleep(0.2)
        if request.path == "/bug":
            raise RuntimeError("bug")
        if request.path == "/unwritable":  # a header latin-1 cannot carry: the head cannot be written
            return Response(200, b"x", headers={"X-Name": "\u2603"})
        return json_response({"method": request.method, "path": request.path_qs, "len": len(body)})


async def _serve(app, limits: FrontDoorLimits | None = None):
    loop = asyncio.get_running_loop()
    server = Server(app, FrontDoor(limits or FrontDoorLimits()), LIMIT, loop)
    listener = await loop.create_server(server, "127.0.0.1", 0)
    return server, listener, listener.sockets[0].getsockname()[1]


@pytest.fixture
async def served():
    app = EchoApp()
    server, listener, port = await _serve(app)
    yield app, port
    listener.close()
    await server.shutdown(0.5)


async def _read_answer(reader: asyncio.StreamReader, to_head: bool = False) -> tuple[int, dict[str, str], bytes]:
    """One answer: status, headers (lower-case names), body (sized or chunked; none to a HEAD)."""
    raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = raw.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    if to_head:
        body = b""
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"])) if status != 100 else b""
    elif headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            piece = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += piece[:-2]
    else:
        body = b"" if status == 100 else await asyncio.wait_for(reader.read(), 5)
    return status, headers, body


async def _exchange(port: int, data: bytes, answers: int = 1) -> tuple[list[tuple[int, dict[str, str], bytes]], bool]:
    """Sends `data`, reads `answers` answers; (answers, whether the server then closed)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    got = [await _read_answer(reader) for _ in range(answers)]
    try:
        closed = await asyncio.wait_for(reader.read(1), 0.3) == b""
    except TimeoutError:
        closed = False
    writer.close()
    return got, closed


def _post(path: str, body: bytes, extra: str = "", version: str = "1.1") -> bytes:
    return (f"POST {path} HTTP/{version}\r\nHost: t\r\nContent-Length: {len(body)}\r\n{extra}\r\n").encode() + body


async def test_keep_alive_serves_requests_in_turn_on_one_connection(served):
    app, port = served
    got, closed = await _exchange(port, _post("/a?x=1", b"one") + _post("/b", b"two!"), answers=2)
    assert [json.loads(b) for _, _, b in got] == [{"method": "POST", "path": "/a?x=1", "len": 3},
                                                   {"method": "POST", "path": "/b", "len": 4}]
    assert not closed
    status, headers, _ = got[0]
    assert status == 200 and "date" in headers and "server" not in headers
    assert headers["content-type"] == "application/json"
    assert [s[1] for s in app.seen] == ["/a", "/b"]


async def test_a_pipelined_request_whose_body_comes_later_is_served_in_its_turn(served):
    """The second request's head arrives while the first is handled (reading pauses there); the
    rest of its body comes after: it must still be read once its turn comes."""
    app, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    second = _post("/b", b"0123456789")
    writer.write(_post("/slow", b"one") + second[:-6])
    await asyncio.sleep(0.05)
    writer.write(second[-6:])
    first, then = await _read_answer(reader), await _read_answer(reader)
    assert json.loads(first[2])["path"] == "/slow" and json.loads(then[2]) == {"method": "POST", "path": "/b",
                                                                               "len": 10}
    writer.close()


async def test_connection_close_and_http10_close_after_the_answer(served):
    _, port = served
    got, closed = await _exchange(port, _post("/a", b"x", "Connection: close\r\n"))
    assert got[0][0] == 200 and got[0][1]["connection"] == "close" and closed
    got, closed = await _exchange(port, _post("/a", b"x", version="1.0"))
    assert got[0][0] == 200 and closed


async def test_chunked_request_body_is_joined(served):
    app, port = served
    data = (b"POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n")
    got, _ = await _exchange(port, data)
    assert json.loads(got[0][2])["len"] == 7 and app.seen[0][4] == b"abcdefg"


async def test_a_body_over_the_limit_is_refused_and_the_connection_closed():
    async def reads(request: Request) -> Response:
        from tidegate.router.http1 import RequestTooLarge
        try:
            await request.read()
        except RequestTooLarge as exc:
            return Response(413, str(exc).encode())
        return Response(200)

    server, listener, port = await _serve(reads)
    try:
        got, closed = await _exchange(port, _post("/big", b"x" * (LIMIT + 1)) + _post("/next", b""))
        assert got[0][0] == 413 and closed  # the rest of that body is never read: nothing follows
        got, closed = await _exchange(port, _post("/ok", b"x" * LIMIT))
        assert got[0][0] == 200 and not closed
    finally:
        listener.close()
        await server.shutdown(0.5)


async def test_expect_continue_is_answered_and_other_expectations_refused(served):
    app, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /e HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 100 Continue")
    writer.write(b"ok")
    status, _, body = await _read_answer(reader)
    assert status == 200 and json.loads(body)["len"] == 2
    writer.close()
    got, closed = await _exchange(port, _post("/e", b"ok", "Expect: something-else\r\n"))
    assert got[0][0] == 417 and json.loads(got[0][2])["error"]["code"] == "expectation_failed" and closed


async def test_head_has_the_get_length_and_no_body(served):
    _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"HEAD /h HTTP/1.1\r\nHost: t\r\n\r\n" + _post("/after", b""))
    status, headers, _ = await _read_answer(reader, to_head=True)
    assert status == 200 and int(headers["content-length"]) > 0
    second = await _read_answer(reader)  # starts right after the head: no body was sent
    assert json.loads(second[2])["path"] == "/after"
    writer.close()


async def test_streamed_answers_are_chunked_on_11_and_close_delimited_on_10(served):
    _, port = served
    got, closed = await _exchange(port, _post("/stream", b""))
    assert got[0][1]["transfer-encoding"] == "chunked" and got[0][2] == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
    assert not closed
    got, closed = await _exchange(port, _post("/stream", b"", version="1.0"))
    assert "transfer-encoding" not in got[0][1] and got[0][2] == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"


@pytest.mark.parametrize(
    ("data", "code"),
    [
        pytest.param(b"GARBAGE\r\n\r\n", "malformed_request", id="garbage"),
        pytest.param(b"GET /h HTTP/1.1\r\nBad Header\r\n\r\n", "malformed_request", id="bad-header"),
        pytest.param(b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", "header_too_large", id="long-url"),
        pytest.param(b"GET /h HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n", "header_too_large", id="long-header"),
        pytest.param(b"GET /h HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 1000) for i in range(80))
                     + b"\r\n", "header_too_large", id="many-headers"),
    ],
)
async def test_parser_errors_are_400_in_the_openai_envelope_and_close(served, data: bytes, code: str):
    _, port = served
    got, closed = await _exchange(port, data)
    status, headers, body = got[0]
    assert status == 400 and headers["content-type"] == "application/json" and closed
    assert json.loads(body)["error"]["code"] == code


async def test_a_head_trickling_past_the_limit_is_cut(served):
    _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /h HTTP/1.1\r\nX: ")
    for _ in range(MAX_HEAD_BYTES // 4096 + 2):  # one header value, never finished, in pieces
        writer.write(b"a" * 4096)
        await writer.drain()
        await asyncio.sleep(0.005)
    status, _, body = await _read_answer(reader)
    assert status == 400 and json.loads(body)["error"]["code"] == "header_too_large"
    writer.close()


async def test_a_handler_bug_is_a_500_and_the_connection_closes(served):
    _, port = served
    got, closed = await _exchange(port, _post("/bug", b""))
    assert got[0][0] == 500 and json.loads(got[0][2])["error"]["code"] == "internal_error" and closed


async def test_an_answer_that_cannot_be_written_ends_the_connection_and_the_server_serves_on(served):
    _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_post("/unwritable", b""))
    assert await asyncio.wait_for(reader.read(), 5) == b""   # closed, nothing half-written
    writer.close()
    got, _ = await _exchange(port, _post("/a", b"x"))
    assert got[0][0] == 200


async def test_a_client_that_goes_away_cancels_its_handler(served):
    app, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_post("/hang", b""))
    await asyncio.wait_for(app.started.wait(), 5)
    writer.close()
    await asyncio.wait_for(app.cancelled.wait(), 5)


async def test_header_and_keep_alive_timeouts():
    app = EchoApp()
    server, listener, port = await _serve(app, FrontDoorLimits(header_timeout_s=0.2, keepalive_timeout_s=0.3))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /h HTTP/1.1\r\nHost")  # and never the rest
        status, _, body = await _read_answer(reader)
        assert status == 408 and json.loads(body)["error"]["code"] == "header_timeout"
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post("/a", b""))
        assert (await _read_answer(reader))[0] == 200
        assert await asyncio.wait_for(reader.read(1), 2) == b""  # idle past the keep-alive timeout: closed
        writer.close()
    finally:
        listener.close()
        await server.shutdown(0.5)


async def test_beyond_the_connection_limit_a_newcomer_gets_503_when_none_is_idle():
    app = EchoApp()
    server, listener, port = await _serve(app, FrontDoorLimits(max_client_connections=1))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post("/hang", b""))
        await asyncio.wait_for(app.started.wait(), 5)  # busy: it cannot be evicted
        got, closed = await _exchange(port, _post("/a", b""))
        assert got[0][0] == 503 and json.loads(got[0][2])["error"]["code"] == "too_many_connections" and closed
        writer.close()
    finally:
        listener.close()
        await server.shutdown(0.5)


async def test_shutdown_closes_idle_connections_and_lets_a_busy_one_answer():
    release = asyncio.Event()

    async def slow(request: Request) -> Response:
        await request.read()
        if request.path == "/slow":
            await release.wait()
        return Response(200, b"done")

    server, listener, port = await _serve(slow)
    idle_r, idle_w = await asyncio.open_connection("127.0.0.1", port)
    idle_w.write(_post("/a", b""))
    assert (await _read_answer(idle_r))[0] == 200
    busy_r, busy_w = await asyncio.open_connection("127.0.0.1", port)
    busy_w.write(_post("/slow", b""))
    await asyncio.sleep(0.1)
    listener.close()
    stopping = asyncio.create_task(server.shutdown(5.0))
    assert await asyncio.wait_for(idle_r.read(1), 2) == b""
    release.set()
    status, headers, body = await _read_answer(busy_r)
    assert (status, body, headers["connection"]) == (200, b"done", "close")
    await asyncio.wait_for(stopping, 5)
    assert len(server.door.table) == 0
    idle_w.close()
    busy_w.close()


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=12), st.binary(max_size=200),
       st.booleans())
def test_where_the_bytes_are_cut_does_not_change_what_is_parsed(cuts: list[int], body: bytes, chunked: bool):
    """Property: one request (sized or chunked body) fed in arbitrary pieces parses the same."""
    if chunked:
        framed = b"".join(b"%x\r\n%b\r\n" % (len(body[i:i + 7]), body[i:i + 7]) for i in range(0, len(body), 7))
        data = (b"POST /p?q=1 HTTP/1.1\r\nHost: t\r\nX-A: 1\r\nTransfer-Encoding: chunked\r\n\r\n"
                + framed + b"0\r\n\r\n")
    else:
        data = b"POST /p?q=1 HTTP/1.1\r\nHost: t\r\nX-A: 1\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)

    async def run() -> None:
        app = EchoApp()
        server, listener, port = await _serve(app)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            pos = 0
            for cut in cuts:
                writer.write(data[pos:pos + cut])
                await writer.drain()
                await asyncio.sleep(0)
                pos += cut
            writer.write(data[pos:])
            status, _, answer = await _read_answer(reader)
            writer.close()
            assert status == 200 and json.loads(answer) == {"method": "POST", "path": "/p?q=1", "len": len(body)}
            method, path, path_qs, headers, seen = app.seen[0]
            assert (path, path_qs, headers["x-a"], seen) == ("/p", "/p?q=1", "1", body)
        finally:
            listener.close()
            await server.shutdown(0.5)

    asyncio.run(run())
