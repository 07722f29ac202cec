"""A small local certificate authority: what a development or test fleet needs to run etcd
with TLS and client certificates without any setup (the `cryptography` package).

Not for production PKI: keys are ECDSA P-256, certificates live `days` days, and the CA key
sits next to the certificates it signed (mode 0600).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class CertFiles:
    cert: Path
    key: Path


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
    finally:
        os.close(fd)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "tidegate (local)"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


class LocalCA:
    def __init__(self, folder: Path, name: str = "tidegate local CA", days: int = 30) -> None:
        """Creates the CA in `folder` (`ca.pem`, `ca-key.pem`)."""
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.days = days
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name))
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.cert_path = self.folder / "ca.pem"
        _write(self.cert_path, self._cert.public_bytes(serialization.Encoding.PEM), 0o644)
        _write(self.folder / "ca-key.pem", _key_pem(self._key), 0o600)

    def issue(self, name: str, *, hosts: tuple[str, ...] = (), client: bool = True,
              server: bool = False) -> CertFiles:
        """A key and certificate with common name `name` (etcd takes a client certificate's CN as
        its user name), valid for `hosts` (IPs or DNS names) when `server`."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usages = [*([ExtendedKeyUsageOID.CLIENT_AUTH] if client else []),
                  *([ExtendedKeyUsageOID.SERVER_AUTH] if server else [])]
        builder = (
            x509.CertificateBuilder().subject_name(_name(name)).issuer_name(self._cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=self.days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if hosts:
            sans: list[x509.GeneralName] = []
            for h in hosts:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(h)))
                except ValueError:
                    sans.append(x509.DNSName(h))
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        files = CertFiles(self.folder / f"{name}.pem", self.folder / f"{name}-key.pem")
        _write(files.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)
        _write(files.key, _key_pem(key), 0o600)
        return files
