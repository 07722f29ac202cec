"""The router's own HTTP server (router/http1.py) serving an app on 127.0.0.1, with an aiohttp
client session bound to it: what aiohttp's TestClient was for these tests, on the server that
`tidegate router` really runs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aiohttp

from tidegate.router.app import App
from tidegate.router.frontdoor import FrontDoor, FrontDoorLimits
from tidegate.router.http1 import Server


@dataclass
class Address:
    host: str
    port: int


class RouterClient:
    """`await start_server()`, then `post`/`get` relative paths as a client; `close()` stops both."""

    def __init__(self, app: App, limits: FrontDoorLimits | None = None) -> None:
        self._app = app
        self._limits = limits or FrontDoorLimits()
        self.server = Address("127.0.0.1", 0)
        self._listener: asyncio.AbstractServer | None = None
        self._http: aiohttp.ClientSession | None = None

    async def start_server(self) -> None:
        loop = asyncio.get_running_loop()
        self.http_server = Server(self._app, FrontDoor(self._limits), self._app.max_body_bytes, loop)
        self._listener = await loop.create_server(self.http_server, "127.0.0.1", 0)
        self.server.port = self._listener.sockets[0].getsockname()[1]
        self._http = aiohttp.ClientSession(base_url=self.url)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    def post(self, path: str, **kwargs: Any) -> Any:
        assert self._http is not None
        return self._http.post(path, **kwargs)

    def get(self, path: str, **kwargs: Any) -> Any:
        assert self._http is not None
        return self._http.get(path, **kwargs)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
        if self._listener is not None:
            self._listener.close()
            await self.http_server.shutdown(1.0)
