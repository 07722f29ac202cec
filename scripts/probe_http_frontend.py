"""What an HTTP front end costs per request, apart from the proxy behind it.

Serves a constant JSON answer on 127.0.0.1 with one of two servers, on uvloop:
- `aiohttp`: aiohttp's low-level server (`web.Server`), whose handler reads the body, as the
  router's front door did until 2026-12-05;
- `bare`: a bare asyncio protocol on httptools' request parser, writing a prebuilt answer (the
  floor under router/http1.py, the router's server since).
Prints the port, then serves until killed. Measure its CPU per request under `wrk` with the
server pinned to one core (docs/BENCHMARKS.md, "Next to vllm-router and sglang-router"):

    taskset -c 1 .venv/bin/python scripts/probe_http_frontend.py aiohttp > port.txt &
    T0=$(awk '{print $14+$15}' /proc/$!/stat)
    taskset -c 0 wrk -t1 -c64 -d5s -s post.lua http://127.0.0.1:$(cat port.txt)/v1/chat/completions
    # CPU per request: (utime + stime after - T0) / CLK_TCK / requests
"""

from __future__ import annotations

import asyncio
import sys

import httptools
import uvloop
from aiohttp import web

BODY = (b'{"id":"x","object":"chat.completion","choices":[{"index":0,'
        b'"message":{"role":"assistant","content":"ok"}}]}')
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)


class _Bare(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._parser = httptools.HttpRequestParser(self)

    def on_message_complete(self) -> None:
        self._transport.write(ANSWER)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)


async def _serve(mode: str) -> None:
    loop = asyncio.get_running_loop()
    if mode == "aiohttp":
        async def handle(request: web.BaseRequest) -> web.Response:
            await request.read()
            return web.Response(body=BODY, content_type="application/json")

        server = await loop.create_server(web.Server(handle, access_log=None), "127.0.0.1", 0)
    else:
        server = await loop.create_server(_Bare, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()


def main() -> int:
    if len(sys.argv) != 2 or sys.argv[1] not in ("aiohttp", "bare"):
        print("usage: probe_http_frontend.py aiohttp|bare", file=sys.stderr)
        return 2
    uvloop.run(_serve(sys.argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
