"""Schemathesis against a live router process (real etcd, a real `tidegate sim` engine): for
every route of the router's OpenAPI document, schema-valid and schema-invalid requests get no
5xx, and every answer conforms to the document (status, content type, body)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tidegate import codec, keys
from tidegate.etcd_server import EmbeddedEtcd
from tidegate.router.openapi import spec
from tidegate.store.etcd import EtcdStore
from tidegate.v1.records_pb2 import RouteEntry, RoutingTable

pytestmark = pytest.mark.e2e

TIDEGATE = Path(sys.executable).with_name("tidegate")
POOL = "openapi-model"
SCHEMA = schemathesis.openapi.from_dict(spec())


def _routed_spec() -> dict:
    """The document with `model` pinned to the live pool, so generated requests reach the engine
    (with any model name, nearly all would be the router's own 404)."""
    doc = spec()
    for name in ("ChatRequest", "CompletionRequest"):
        doc["components"]["schemas"][name]["properties"]["model"] = {"type": "string", "enum": [POOL]}
    return doc


ROUTED = schemathesis.openapi.from_dict(_routed_spec())
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES = 60


def _listen(cmd: list[str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    with open(log, "wb") as err:
        proc = subprocess.Popen([str(TIDEGATE), *cmd, "--port", "0", "--log-json"], stdout=subprocess.PIPE,
                                stderr=err, start_new_session=True)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    if not line:
        raise AssertionError(log.read_text()[-2000:])
    return proc, f"http://127.0.0.1:{json.loads(line)['port']}"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
    if proc.stdout is not None:
        proc.stdout.close()


async def _put_table(etcd: str, engine_url: str) -> None:
    t = RoutingTable(pool=POOL, generation=1, schema_version=1)
    t.computed_at.GetCurrentTime()
    t.replicas.append(RouteEntry(replica_id="r0", endpoint=engine_url, weight=1.0, state=2))
    store = EtcdStore([etcd])
    await store.connect()
    try:
        await store.put(keys.table(POOL), codec.encode(t))
    finally:
        await store.close()


@pytest.fixture(scope="module")
def private_etcd() -> Iterator[EmbeddedEtcd]:
    """An etcd of this module's own: the session's holds other tests' tables (pool "m" among
    them, its replicas long gone), and a generated model name that happens to be one of those
    pools was routed to a dead endpoint, a 502 this test would blame on the router."""
    with EmbeddedEtcd() as server:
        yield server


@pytest.fixture(scope="module")
def live_router(private_etcd: EmbeddedEtcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    etcd_server = private_etcd
    tmp = tmp_path_factory.mktemp("openapi")
    # a short context keeps generated max_tokens cheap: longer asks are the engine's 400
    sim, sim_url = _listen(["sim", "--model", POOL, "--profile", "instant", "--max-model-len", "256",
                            "--log-level", "warning"], tmp / "sim.log")
    router = None
    try:
        asyncio.run(_put_table(etcd_server.endpoint, sim_url))
        router, url = _listen(["router", "--etcd", etcd_server.endpoint, "--shutdown-grace-s", "1",
                               "--log-level", "warning"], tmp / "router.log")
        import urllib.request

        for _ in range(100):
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if POOL in json.loads(r.read())["pools"]:
                        break
            except OSError:
                pass
            asyncio.run(asyncio.sleep(0.1))
        else:
            raise AssertionError("router never synced")
        yield url
    finally:
        if router is not None:
            _stop(router)
        _stop(sim)


OPERATIONS = [(op.path, op.method.upper()) for op in (r.ok() for r in SCHEMA.get_all_operations())]
WITH_BODY = {(p, m) for p, m in OPERATIONS if m == "POST"}


@pytest.mark.parametrize("routed", [True, False], ids=["pool-model", "any-model"])
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize("path,method", OPERATIONS)
def test_router_conforms_to_its_openapi(live_router: str, path: str, method: str, mode: GenerationMode,
                                        routed: bool):
    if (path, method) not in WITH_BODY and (mode == GenerationMode.NEGATIVE or not routed):
        pytest.skip("no input to vary")
    strategy = (ROUTED if routed else SCHEMA)[path][method].as_strategy(generation_mode=mode)
    statuses: list[int] = []

    @settings(max_examples=EXAMPLES if (path, method) in WITH_BODY else 3, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(case: schemathesis.Case) -> None:
        response = case.call(base_url=live_router, timeout=15)
        statuses.append(response.status_code)
        case.validate_response(response, checks=CHECKS)

    run()
    if routed and mode == GenerationMode.POSITIVE and (path, method) in WITH_BODY:
        assert 200 in statuses, statuses  # some requests went all the way to the engine and back


def test_every_route_is_documented(live_router: str):
    import urllib.request

    with urllib.request.urlopen(live_router + "/openapi.json", timeout=5) as r:
        served = json.loads(r.read())
    assert served == spec()
    from tidegate.router.app import build_app  # the app's routes are exactly the document's
    from tidegate.router.budget import RetryBudget
    from tidegate.router.inflight import InflightCounter
    from tidegate.router.metrics import RouterMetrics
    from tidegate.router.proxy import Proxy, ProxySettings
    from tidegate.router.tables import RoutingTables

    tables, inflight = RoutingTables(), InflightCounter()
    metrics = RouterMetrics(tables, inflight, wall=lambda: 0.0)
    proxy = Proxy(tables, None, inflight, RetryBudget(lambda: 0.0), metrics, None, ProxySettings())  # type: ignore[arg-type]
    app = build_app(proxy, tables, metrics, "r")
    routes = set(app.routes())
    assert routes == {(p, m.upper()) for p, item in spec()["paths"].items() for m in item}


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(["/v1/chat/completions", "/v1/completions"]), st.binary(max_size=300)
       | st.text(max_size=200).map(str.encode) | st.sampled_from([b"[" * 5000, b'{"model":"' + POOL.encode() + b'"}']))
def test_any_body_bytes_get_a_non_5xx_openai_answer(live_router: str, path: str, body: bytes):
    import urllib.error
    import urllib.request

    req = urllib.request.Request(live_router + path, data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    assert status < 500, (status, raw[:200])
    if status >= 400:
        assert set(json.loads(raw)["error"]) == {"message", "type", "param", "code"}
