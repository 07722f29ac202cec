"""The router's aiohttp application: OpenAI endpoints, /health, /metrics."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tidegate.policy.pick import routable
from tidegate.router.engine_client import EngineClient
from tidegate.router.metrics import RouterMetrics
from tidegate.router.openapi import spec as openapi_spec
from tidegate.router.parse import CHAT_PATH, COMPLETIONS_PATH, error_body
from tidegate.router.proxy import Proxy, json_error
from tidegate.router.ratelog import LogRateLimiter
from tidegate.router.tables import RoutingTables

MIB = 1024 * 1024

log = structlog.get_logger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# The proxy's routes with their middleware applied once, by (method, path): `dispatcher` serves them
# without aiohttp's per-request routing and middleware chain.
_DIRECT = web.AppKey("tidegate_direct_routes", dict)


def make_session(connect_timeout_s: float, limit: int = 10_000) -> EngineClient:
    """One shared engine client for every engine (router/engine_client.py): bodies pass through
    untouched, only connecting has its own timeout (the first byte is timed by the proxy), and
    no cookies are kept, so one client's engine cookies never go out with another's request."""
    return EngineClient(connect_timeout_s, limit=limit, keepalive_s=30.0)


def _openai_errors(ratelog: LogRateLimiter) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler):
        """aiohttp's own errors (404 route, 405) and any bug answered in the OpenAI error envelope."""
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            kind = "invalid_request_error" if exc.status < 500 else "server_error"
            return json_error(exc.status, exc.reason, kind)
        except (ConnectionError, TimeoutError):
            raise  # the client is gone / aiohttp answers 504 itself (router.frontdoor's envelope)
        except Exception as exc:
            suppressed = ratelog.check(exc.__class__.__name__)
            if suppressed is not None:
                log.exception("request_handler_failed", path=request.path, suppressed=suppressed)
            return json_error(500, "internal server error", "server_error", code="internal_error")

    return middleware


def build_app(proxy: Proxy, tables: RoutingTables, metrics: RouterMetrics, router_id: str,
              max_body_bytes: int = 4 * MIB) -> web.Application:
    async def models(_: web.Request) -> web.Response:
        data = [{"id": pool, "object": "model", "created": 0, "owned_by": "tidegate"}
                for pool, t in sorted(tables.pools().items()) if t.has_replicas]
        return web.json_response({"object": "list", "data": data})

    async def health(_: web.Request) -> web.Response:
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
        return web.Response(status=200 if synced else 503, text=json.dumps(body),
                            content_type="application/json")

    async def prom(_: web.Request) -> web.Response:
        resp = web.Response(body=generate_latest(metrics.registry))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    errors = _openai_errors(LogRateLimiter(time.monotonic))
    app = web.Application(client_max_size=max_body_bytes, middlewares=[errors])
    app.router.add_post(CHAT_PATH, proxy.handle)
    app.router.add_post(COMPLETIONS_PATH, proxy.handle)
    proxied = functools.partial(errors, handler=proxy.handle)
    app[_DIRECT] = {("POST", CHAT_PATH): proxied, ("POST", COMPLETIONS_PATH): proxied}
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", prom)
    openapi_doc = json.dumps(openapi_spec())

    async def openapi(_: web.Request) -> web.Response:
        return web.Response(text=openapi_doc, content_type="application/json")

    app.router.add_get("/openapi.json", openapi)
    return app


def dispatcher(app: web.Application) -> Handler:
    """The server's request handler: the proxy's routes straight to their handler (with the same
    error middleware), the rest through the application's router. Routing, the middleware chain
    and the match-info objects cost ~5% of a proxied request's CPU. A request with an Expect
    header takes the application's path, which answers it."""
    direct = app[_DIRECT]
    slow = app._handle

    async def handle(request: web.Request) -> web.StreamResponse:
        handler = direct.get((request.method, request.rel_url.raw_path))
        if handler is None or "Expect" in request.headers:
            return await slow(request)
        return await handler(request)

    return handle


__all__ = ["build_app", "dispatcher", "make_session", "error_body", "MIB"]
