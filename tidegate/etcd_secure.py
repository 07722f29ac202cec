"""An embedded etcd with TLS, client certificates and etcd's auth on: how a secured fleet's etcd
is set up, made on the spot for tests and local runs (`tidegate/pki.py` makes the CA).

Like `EmbeddedEtcd` it listens on 127.0.0.1 only. On its first start it makes a CA, a server
certificate for 127.0.0.1, and a client certificate per user (common name = user name, which
etcd takes as the user when a call carries no password token); then it creates the users, a
`tidegate` role that may read and write `/tidegate/` and nothing else, and enables auth.
"""

from __future__ import annotations

import secrets
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
from aetcd import rpc as etcdrpc

from tidegate.etcd_server import EmbeddedEtcd, EtcdStartError
from tidegate.keys import PREFIX
from tidegate.pki import CertFiles, LocalCA
from tidegate.store.etcdsec import EtcdSecurity

ROLE = "tidegate"
ROOT = "root"


def _prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


class SecureEmbeddedEtcd(EmbeddedEtcd):
    def __init__(self, users: Mapping[str, str], pki_dir: Path | None = None, **kwargs: Any) -> None:
        """`users`: name -> password ("" = certificate only). Each gets the `tidegate` role."""
        super().__init__(**kwargs)
        self._users = dict(users)
        self._pki_dir = pki_dir
        self._ca: LocalCA | None = None
        self._certs: dict[str, CertFiles] = {}
        self._root_password = secrets.token_urlsafe(16)
        self._auth_on = False

    _scheme = "https"

    @property
    def ca_file(self) -> str:
        assert self._ca is not None
        return str(self._ca.cert_path)

    def cert(self, user: str) -> CertFiles:
        return self._certs[user]

    def security(self, user: str, *, password: bool = True, cert: bool = True) -> EtcdSecurity:
        """How `user` connects: the CA, its client certificate and (unless `password=False`) its password."""
        files = self._certs[user]
        return EtcdSecurity(ca_file=self.ca_file, cert_file=str(files.cert) if cert else "",
                            key_file=str(files.key) if cert else "", user=user if password else "",
                            password=self._users[user] if password else "")

    def _ssl_context(self) -> ssl.SSLContext | None:
        ctx = ssl.create_default_context(cafile=self.ca_file)
        root = self._certs[ROOT]
        ctx.load_cert_chain(str(root.cert), str(root.key))
        return ctx

    def _argv(self) -> list[str]:
        plain = f"http://{self.endpoint}"
        server = self._certs["server"]
        return [a.replace(plain, f"https://{self.endpoint}") for a in super()._argv()] + [
            "--cert-file", str(server.cert), "--key-file", str(server.key),
            "--trusted-ca-file", self.ca_file, "--client-cert-auth",
        ]

    def start(self, timeout_s: float = 15.0) -> None:
        if self._ca is None:
            import tempfile

            folder = self._pki_dir or Path(tempfile.mkdtemp(prefix="tidegate-etcd-pki-"))
            self._ca = LocalCA(folder)
            self._certs["server"] = self._ca.issue("server", hosts=("127.0.0.1",), client=False, server=True)
            for user in (ROOT, *self._users):
                self._certs[user] = self._ca.issue(user)
        super().start(timeout_s)
        if not self._auth_on:
            self._enable_auth()
            self._auth_on = True

    def _enable_auth(self) -> None:
        root = self._certs[ROOT]
        creds = grpc.ssl_channel_credentials(Path(self.ca_file).read_bytes(), root.key.read_bytes(),
                                             root.cert.read_bytes())
        with grpc.secure_channel(self.endpoint, creds) as ch:
            auth = etcdrpc.AuthStub(ch)
            try:
                auth.UserAdd(etcdrpc.AuthUserAddRequest(name=ROOT, password=self._root_password), timeout=5)
                auth.UserGrantRole(etcdrpc.AuthUserGrantRoleRequest(user=ROOT, role=ROOT), timeout=5)
                auth.RoleAdd(etcdrpc.AuthRoleAddRequest(name=ROLE), timeout=5)
                key = PREFIX.encode()
                auth.RoleGrantPermission(etcdrpc.AuthRoleGrantPermissionRequest(name=ROLE, perm=etcdrpc.Permission(
                    permType=etcdrpc.Permission.READWRITE, key=key, range_end=_prefix_end(key))), timeout=5)
                for user, password in self._users.items():
                    auth.UserAdd(etcdrpc.AuthUserAddRequest(
                        name=user, password=password,
                        options=etcdrpc.UserAddOptions(no_password=not password)), timeout=5)
                    auth.UserGrantRole(etcdrpc.AuthUserGrantRoleRequest(user=user, role=ROLE), timeout=5)
                auth.AuthEnable(etcdrpc.AuthEnableRequest(), timeout=5)
            except grpc.RpcError as e:
                raise EtcdStartError(f"could not enable etcd auth: {e.code().name}: {e.details()}") from e
