"""The router process against hostile or broken clients, over raw sockets: every error answered
in the OpenAI error envelope, timeouts that cut slow clients, a connection limit that evicts idle
connections and refuses gracefully, and logs that stay short."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from urllib.parse import urlsplit

import aiohttp
import pytest
import test_router  # type: ignore[import-not-found]
from test_router import CHAT, put_table, wait_generation  # type: ignore[import-not-found]

pytestmark = pytest.mark.e2e

# the router-process and engine fixtures of test_router
engines = test_router.engines
start_router = test_router.start_router

OPENAI_ERROR_KEYS = {"message", "type", "param", "code"}


def _addr(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def exchange(url: str, data: bytes, timeout_s: float = 5.0, trickle_s: float = 0.0) -> tuple[bytes, float, bool]:
    """Sends `data` (one byte per `trickle_s` when set), reads until the router closes.
    Returns (everything read, seconds until close, whether the router closed it)."""
    sock = socket.create_connection(_addr(url), timeout=timeout_s)
    t0 = time.monotonic()
    out = b""
    try:
        if trickle_s:
            sock.setblocking(False)
            for i in range(len(data)):
                try:
                    sock.send(data[i:i + 1])
                except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                    break
                time.sleep(trickle_s)
                try:
                    chunk = sock.recv(65536)
                    out += chunk
                    if not chunk:
                        return out, time.monotonic() - t0, True
                except BlockingIOError:
                    pass
                except ConnectionResetError:  # a byte sent after the router closed draws a reset
                    return out, time.monotonic() - t0, True
                if time.monotonic() - t0 > timeout_s:
                    return out, time.monotonic() - t0, False
            sock.setblocking(True)
            sock.settimeout(max(0.1, timeout_s - (time.monotonic() - t0)))
        else:
            sock.sendall(data)
        while True:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                return out, time.monotonic() - t0, False
            except ConnectionResetError:
                return out, time.monotonic() - t0, True
            if not chunk:
                return out, time.monotonic() - t0, True
            out += chunk
    finally:
        sock.close()


def parse_response(raw: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, headers, json.loads(body[: int(headers["content-length"])])


def assert_openai_error(raw: bytes, status: int, code: str | None = None) -> dict:
    got, headers, body = parse_response(raw)
    assert got == status, raw[:300]
    assert headers["content-type"].startswith("application/json")
    assert set(body["error"]) == OPENAI_ERROR_KEYS
    if code is not None:
        assert body["error"]["code"] == code
    return body["error"]


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def test_parser_level_errors_and_hostile_bodies_get_openai_errors(clean_etcd, start_router, tmp_path):
    router = start_router(clean_etcd)
    url = router.url
    assert_openai_error(exchange(url, b"GARBAGE\r\n\r\n")[0], 400, "malformed_request")
    assert_openai_error(exchange(url, b"GET /health HTTP/1.1\r\nX: " + b"a" * 100_000 + b"\r\n\r\n")[0], 400,
                        "header_too_large")
    assert_openai_error(exchange(url, b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n")[0], 400, "header_too_large")
    assert_openai_error(exchange(url, b"GET /health HTTP/1.1\r\nBad Header\r\n\r\n")[0], 400, "malformed_request")
    lone = b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}'
    assert_openai_error(exchange(url, post("/v1/chat/completions", lone))[0], 400)
    deep = b"[" * 100_000 + b"]" * 100_000
    assert_openai_error(exchange(url, post("/v1/chat/completions", deep))[0], 400)
    assert_openai_error(exchange(url, post("/v1/completions", b'{"model": "m", "prompt": "\xff\xfe"}'))[0], 400)
    assert_openai_error(exchange(url, post("/v1/nothing", b"{}"))[0], 404)
    assert_openai_error(exchange(url, b"DELETE /v1/chat/completions HTTP/1.1\r\nHost: t\r\n\r\n")[0], 405)

    # the same error many times logs a few lines, not one per request (and never a traceback)
    for _ in range(200):
        exchange(url, b"GARBAGE\r\n\r\n")
    log_text = (tmp_path / "router.log").read_text()
    assert log_text.count("client_connection_http_error") <= 3
    assert "Traceback" not in log_text


def test_truncated_body_is_answered_after_the_body_timeout(clean_etcd, start_router):
    router = start_router(clean_etcd, "--body-timeout-s", "0.5")
    data = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{\"model\":")
    raw, took, closed = exchange(router.url, data, timeout_s=5)
    assert_openai_error(raw, 408, "body_timeout")
    assert closed and 0.4 < took < 2.5, took


def test_slowloris_is_cut_at_the_header_timeout(clean_etcd, start_router):
    router = start_router(clean_etcd, "--header-timeout-s", "0.5")
    headers = b"GET /health HTTP/1.1\r\nHost: t\r\n" + b"X-Slow: " + b"a" * 200 + b"\r\n\r\n"
    raw, took, closed = exchange(router.url, headers, timeout_s=5, trickle_s=0.02)
    assert closed and took < 2.5, took
    assert_openai_error(raw, 408, "header_timeout")


def test_idle_connection_is_closed_at_the_keepalive_timeout(clean_etcd, start_router):
    router = start_router(clean_etcd, "--keepalive-timeout-s", "0.5")
    raw, took, closed = exchange(router.url, b"", timeout_s=5)
    assert closed and raw == b"" and took < 2.5, took


async def test_connection_limit_evicts_idle_and_refuses_when_all_busy(clean_etcd, engines, start_router):
    slow = engines[0]
    slow.chunks, slow.chunk_delay_s = 40, 0.05  # 2 s streams
    await put_table(clean_etcd, "m", [("r1", slow.url, 1.0)], 1)
    router = start_router(clean_etcd, "--max-client-connections", "4", "--keepalive-timeout-s", "60")
    host, port = _addr(router.url)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        await wait_generation(http, router, "m", 1)
        await asyncio.sleep(0.5)  # the router has seen the health checks' connections close
        idle = [await asyncio.open_connection(host, port) for _ in range(4)]
        try:
            await asyncio.sleep(0.7)  # connections quiet for less than 0.5 s are never evicted
            async with http.post(router.url + "/v1/chat/completions", json=CHAT) as r:
                assert r.status == 200  # took the place of the least recently active idle connection
            assert await asyncio.wait_for(idle[0][0].read(), 2) == b""
            for reader, _ in idle[1:]:
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(reader.read(), 0.2)
        finally:
            for _, writer in idle:
                writer.close()

        async def stream() -> int:
            async with http.post(router.url + "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
                await r.read()
                return r.status

        busy = [asyncio.create_task(stream()) for _ in range(4)]
        await asyncio.sleep(0.5)
        async with http.post(router.url + "/v1/chat/completions", json=CHAT) as r:
            assert r.status == 503
            err = (await r.json())["error"]
            assert err["code"] == "too_many_connections" and set(err) == OPENAI_ERROR_KEYS
            assert r.headers["Retry-After"] == "1"
        assert await asyncio.gather(*busy) == [200] * 4
        # Served again once connections are free: the client has read the streams' ends, the
        # router may take a moment more to mark their connections idle (a CI run saw one 503).
        for _ in range(20):
            async with http.post(router.url + "/v1/chat/completions", json=CHAT) as r:
                status = r.status
                await r.read()
            if status == 200:
                break
            await asyncio.sleep(0.1)
        assert status == 200
        async with http.get(router.url + "/metrics") as r:
            metrics = await r.text()
    assert 'tidegate_router_client_connection_events_total{kind="evicted"}' in metrics
    assert 'tidegate_router_client_connection_events_total{kind="refused"}' in metrics
