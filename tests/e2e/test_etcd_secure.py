"""etcd with TLS, client certificates and auth on (tidegate.etcd_secure): who gets in, and a
whole fleet (control plane, agents, router, as `tidegate up` starts them) running against it."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidegate import keys
from tidegate.errors import StoreError
from tidegate.etcd_secure import SecureEmbeddedEtcd
from tidegate.fleet.up import Fleet, UpConfig
from tidegate.store.etcd import EtcdStore
from tidegate.store.etcdsec import EtcdSecurity

pytestmark = pytest.mark.e2e

MODEL = "sim-model"
FLEET_PASSWORD = "fleet-pw-7c1e"


@pytest.fixture(scope="module")
def secure_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureEmbeddedEtcd]:
    # `tidegate`: certificate only (etcd takes its common name as the user); `fleet`: password too.
    with SecureEmbeddedEtcd({"tidegate": "", "fleet": FLEET_PASSWORD},
                            pki_dir=tmp_path_factory.mktemp("pki")) as server:
        yield server


async def put_get(endpoint: str, sec: EtcdSecurity | None, key: str = keys.PREFIX + "probe") -> str:
    """'ok', or the StoreError's message."""
    store = EtcdStore([endpoint], timeout_s=2.0, security=sec)
    try:
        await store.connect()
        await store.put(key, b"v")
        kv = await store.get(key)
        return "ok" if kv is not None and kv.value == b"v" else f"read back {kv!r}"
    except StoreError as e:
        return str(e)
    finally:
        await store.close()


async def test_who_gets_in(secure_etcd: SecureEmbeddedEtcd) -> None:
    ep = secure_etcd.endpoint
    fleet_cert = secure_etcd.cert("fleet")
    no_cert = EtcdSecurity(ca_file=secure_etcd.ca_file)
    wrong_password = EtcdSecurity(ca_file=secure_etcd.ca_file, cert_file=str(fleet_cert.cert),
                                  key_file=str(fleet_cert.key), user="fleet", password="guess")
    results = {
        "plain": await put_get(ep, None),
        "tls without a client certificate": await put_get(ep, no_cert),
        "wrong password": await put_get(ep, wrong_password),
        "certificate user": await put_get(ep, secure_etcd.security("tidegate", password=False)),
        "certificate user outside /tidegate/": await put_get(
            ep, secure_etcd.security("tidegate", password=False), key="/elsewhere/x"),
        "password user": await put_get(ep, secure_etcd.security("fleet")),
    }
    assert "UNAVAILABLE" in results["plain"]
    assert "UNAVAILABLE" in results["tls without a client certificate"]
    assert "authentication failed" in results["wrong password"]
    assert results["certificate user"] == "ok"
    assert "permission denied" in results["certificate user outside /tidegate/"]
    assert results["password user"] == "ok"
    assert FLEET_PASSWORD not in repr(secure_etcd.security("fleet"))


async def test_password_user_survives_an_etcd_restart(secure_etcd: SecureEmbeddedEtcd) -> None:
    store = EtcdStore([secure_etcd.endpoint], timeout_s=2.0, security=secure_etcd.security("fleet"))
    await store.connect()
    try:
        await store.put(keys.PREFIX + "before", b"1")
        await asyncio.to_thread(secure_etcd.restart)  # its auth tokens die with it
        kv = await store.get(keys.PREFIX + "before")  # re-authenticates and retries once
        assert kv is not None and kv.value == b"1"
    finally:
        await store.close()


def test_fleet_runs_against_secured_etcd(secure_etcd: SecureEmbeddedEtcd, tmp_path: Path) -> None:
    password_file = tmp_path / "etcd-password"
    password_file.write_text(FLEET_PASSWORD + "\n")
    password_file.chmod(0o600)
    cert = secure_etcd.cert("fleet")
    cfg = UpConfig(replicas=2, model=MODEL, profile="instant", run_dir=tmp_path / "run", report_interval_s=0.5,
                   ready_timeout_s=60, etcd=(secure_etcd.endpoint,), etcd_ca_file=secure_etcd.ca_file,
                   etcd_cert_file=str(cert.cert), etcd_key_file=str(cert.key), etcd_user="fleet",
                   etcd_password_file=str(password_file))
    with Fleet(cfg) as fleet:
        info = fleet.start()  # returns once the router routes to both replicas: tables went through etcd
        req = urllib.request.Request(info["router_url"] + "/v1/completions", method="POST",
                                     data=json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 4}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200
        logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "run").glob("*.log"))
    assert FLEET_PASSWORD not in logs
    table = asyncio.run(_table(secure_etcd))
    assert {r["replicaId"] for r in table["replicas"]} == {"replica-0", "replica-1"}


async def _table(server: SecureEmbeddedEtcd) -> dict[str, object]:
    store = EtcdStore([server.endpoint], security=server.security("tidegate", password=False))
    await store.connect()
    try:
        kv = await store.get(keys.table(MODEL))
        assert kv is not None
        return json.loads(kv.value)  # type: ignore[no-any-return]
    finally:
        await store.close()
