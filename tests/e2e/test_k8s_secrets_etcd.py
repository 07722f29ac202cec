"""The etcd certificates deploy/kubernetes/make-secrets.sh makes work with a real etcd and Tidegate's client.

etcd runs with the server certificate from tidegate-etcd-server and --client-cert-auth, as the
StatefulSet runs it; Tidegate's etcd store connects with the client certificate from
tidegate-etcd-client, as the control planes and routers do. A client without a certificate is
refused. (The unit test checks the certificate names the address the manifests dial.)
"""

from __future__ import annotations

import base64
import os
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest
import yaml

from tidegate.errors import StoreError
from tidegate.etcd_server import EmbeddedEtcd
from tidegate.store.etcd import EtcdStore
from tidegate.store.etcdsec import EtcdSecurity

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(shutil.which("openssl") is None, reason="make-secrets.sh needs openssl")]
ROOT = Path(__file__).resolve().parents[2]


class MadeSecretsEtcd(EmbeddedEtcd):
    """etcd serving TLS with the certificates of a make-secrets.sh run, clients verified by its CA."""

    _scheme = "https"

    def __init__(self, tls: Path, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._tls = tls

    def _ssl_context(self) -> ssl.SSLContext | None:
        ctx = ssl.create_default_context(cafile=str(self._tls / "ca.crt"))
        ctx.load_cert_chain(str(self._tls / "client.crt"), str(self._tls / "client.key"))
        return ctx

    def _argv(self) -> list[str]:
        plain = f"http://{self.endpoint}"
        return [a.replace(plain, f"https://{self.endpoint}") for a in super()._argv()] + [
            "--cert-file", str(self._tls / "server.crt"), "--key-file", str(self._tls / "server.key"),
            "--trusted-ca-file", str(self._tls / "ca.crt"), "--client-cert-auth"]


def _made_secrets(tmp_path: Path) -> Path:
    run = subprocess.run(["bash", str(ROOT / "deploy" / "kubernetes" / "make-secrets.sh"), "tidegate",
                          str(tmp_path / "out")], env={**os.environ, "DRY_RUN": "1"}, check=True,
                         capture_output=True, text=True, timeout=120)
    secrets = {o["metadata"]["name"]: o["data"] for o in yaml.safe_load_all(run.stdout) if o}
    tls = tmp_path / "tls"
    tls.mkdir(mode=0o700)
    for secret, prefix in (("tidegate-etcd-server", "server"), ("tidegate-etcd-client", "client")):
        for key, name in (("tls.crt", f"{prefix}.crt"), ("tls.key", f"{prefix}.key"), ("ca.crt", "ca.crt")):
            (tls / name).write_bytes(base64.b64decode(secrets[secret][key]))
            (tls / name).chmod(0o600)
    return tls


async def test_tidegate_reaches_etcd_with_the_made_certificates(tmp_path: Path) -> None:
    tls = _made_secrets(tmp_path)
    with MadeSecretsEtcd(tls, data_dir=tmp_path / "data", log_path=tmp_path / "etcd.log") as etcd:
        port = etcd.endpoint.rsplit(":", 1)[1]
        # "localhost", a name the certificate carries, as the pods dial "tidegate-etcd".
        store = EtcdStore([f"localhost:{port}"], security=EtcdSecurity(
            ca_file=str(tls / "ca.crt"), cert_file=str(tls / "client.crt"), key_file=str(tls / "client.key")))
        await store.connect()
        try:
            await store.put("/tidegate/v1/probe", b"ok")
            kv = await store.get("/tidegate/v1/probe")
            assert kv is not None and kv.value == b"ok"
        finally:
            await store.close()

        anonymous = EtcdStore([f"localhost:{port}"], timeout_s=1.0,
                              security=EtcdSecurity(ca_file=str(tls / "ca.crt")))
        with pytest.raises(StoreError, match="(?i)handshake"):
            await anonymous.connect()
            try:
                await anonymous.get("/tidegate/v1/probe")
            finally:
                await anonymous.close()
