"""The router's routes: OpenAI endpoints, /health, /metrics, /openapi.json, on router/http1.py."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tidegate.policy.pick import routable
from tidegate.router.engine_client import EngineClient
from tidegate.router.http1 import Answer, Request, Response, json_response
from tidegate.router.metrics import RouterMetrics
from tidegate.router.openapi import spec as openapi_spec
from tidegate.router.parse import CHAT_PATH, COMPLETIONS_PATH, error_body
from tidegate.router.proxy import Proxy, json_error
from tidegate.router.ratelog import LogRateLimiter
from tidegate.router.tables import RoutingTables

MIB = 1024 * 1024

log = structlog.get_logger(__name__)

Handler = Callable[[Request], Awaitable[Answer]]


def make_session(connect_timeout_s: float, limit: int = 10_000) -> EngineClient:
    """One shared engine client for every engine (router/engine_client.py): bodies pass through
    untouched, only connecting has its own timeout (the first byte is timed by the proxy), and
    no cookies are kept, so one client's engine cookies never go out with another's request."""
    return EngineClient(connect_timeout_s, limit=limit, keepalive_s=30.0)


class App:
    """The routes by (method, path); HEAD is answered as GET without the body (router/http1.py).
    An unknown path is 404, a known path with another method 405, a handler's bug 500: each in
    the OpenAI error envelope, bugs logged with a rate limit."""

    def __init__(self, max_body_bytes: int) -> None:
        self.max_body_bytes = max_body_bytes
        self._routes: dict[tuple[str, str], Handler] = {}
        self._ratelog = LogRateLimiter(time.monotonic)

    def add(self, method: str, path: str, handler: Handler) -> None:
        self._routes[(method, path)] = handler
        if method == "GET":
            self._routes[("HEAD", path)] = handler

    def routes(self) -> list[tuple[str, str]]:
        """(path, method) of every route (HEAD, implied by GET, left out)."""
        return [(path, method) for method, path in self._routes if method != "HEAD"]

    async def __call__(self, request: Request) -> Answer:
        handler = self._routes.get((request.method, request.path))
        if handler is None:
            allowed = [m for m, p in self._routes if p == request.path]  # an error's path only
            if not allowed:
                return json_error(404, "Not Found", "invalid_request_error")
            return json_error(405, "Method Not Allowed", "invalid_request_error",
                              headers={"Allow": ", ".join(sorted(allowed))})
        try:
            return await handler(request)
        except (ConnectionError, TimeoutError):
            raise  # the client is gone: nothing to answer
        except Exception as exc:
            suppressed = self._ratelog.check(exc.__class__.__name__)
            if suppressed is not None:
                log.exception("request_handler_failed", path=request.path, suppressed=suppressed)
            return json_error(500, "internal server error", "server_error", code="internal_error")


def build_app(proxy: Proxy, tables: RoutingTables, metrics: RouterMetrics, router_id: str,
              max_body_bytes: int = 4 * MIB) -> App:
    async def models(_: Request) -> Response:
        data = [{"id": pool, "object": "model", "created": 0, "owned_by": "tidegate"}
                for pool, t in sorted(tables.pools().items()) if t.has_replicas]
        return json_response({"object": "list", "data": data})

    async def health(_: Request) -> Response:
        synced = tables.synced.is_set()
        suspect = tables.suspect()  # pools routed on their last known set (panic threshold)
        body = {
            "status": "ok" if synced else "unsynced",
            "router_id": router_id,
            "synced": synced,
            "etcd_healthy": tables.etcd_healthy,
            "pools": {pool: {"generation": t.generation, "replicas": len(t.entries),
                             "routable": sum(1 for e in t.entries if routable(e.weight)),
                             "suspect": pool in suspect,
                             "slo": {"ttft_s": t.slo.ttft_s, "tpot_s": t.slo.tpot_s} if t.slo else None}
                      for pool, t in sorted(tables.pools().items())},
        }
        return json_response(body, status=200 if synced else 503)

    async def prom(_: Request) -> Response:
        return Response(body=generate_latest(metrics.registry), content_type=CONTENT_TYPE_LATEST)

    openapi_doc = json.dumps(openapi_spec()).encode()

    async def openapi(_: Request) -> Response:
        return Response(body=openapi_doc, content_type="application/json")

    app = App(max_body_bytes)
    app.add("POST", CHAT_PATH, proxy.handle)
    app.add("POST", COMPLETIONS_PATH, proxy.handle)
    app.add("GET", "/v1/models", models)
    app.add("GET", "/health", health)
    app.add("GET", "/metrics", prom)
    app.add("GET", "/openapi.json", openapi)
    return app


__all__ = ["App", "build_app", "make_session", "error_body", "MIB"]
