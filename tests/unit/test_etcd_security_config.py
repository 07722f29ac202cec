"""The etcd TLS/auth settings every etcd client takes (tidegate.config.EtcdFields)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidegate.config import ConfigError, load
from tidegate.router.main import RouterConfig


def cfg(**values: str) -> RouterConfig:
    return load(RouterConfig, "router", values, environ={})


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    out = {}
    for name, text in (("ca", "CA"), ("cert", "CERT"), ("key", "KEY"), ("pw", "s3cret-pw\n")):
        (tmp_path / name).write_text(text)
        out[name] = str(tmp_path / name)
    return out


def test_plain_etcd_needs_nothing() -> None:
    c = cfg()
    assert c.etcd_security() is None and c.etcd_security_argv() == []


def test_tls_and_password(files: dict[str, str]) -> None:
    c = cfg(etcd_ca_file=files["ca"], etcd_cert_file=files["cert"], etcd_key_file=files["key"],
            etcd_user="tidegate", etcd_password_file=files["pw"])
    sec = c.etcd_security()
    assert sec is not None and sec.tls and sec.user == "tidegate" and sec.password == "s3cret-pw"
    assert "s3cret" not in repr(sec)
    argv = c.etcd_security_argv()
    assert argv[argv.index("--etcd-password-file") + 1] == files["pw"] and "s3cret-pw" not in argv
    assert argv[argv.index("--etcd-ca-file") + 1] == files["ca"]


@pytest.mark.parametrize(("values", "error"), [
    pytest.param({"etcd_cert_file": "cert"}, "etcd_cert_file and etcd_key_file go together", id="cert-without-key"),
    pytest.param({"etcd_user": "u"}, "etcd_user and etcd_password_file go together", id="user-without-password"),
    pytest.param({"etcd_password_file": "pw"}, "etcd_user and etcd_password_file go together", id="password-only"),
    pytest.param({"etcd_ca_file": "/nonexistent/ca.pem"}, "etcd_ca_file: .*not a readable file", id="missing-file"),
])
def test_bad_settings_name_the_field(files: dict[str, str], values: dict[str, str], error: str) -> None:
    resolved = {k: files.get(v, v) for k, v in values.items()}
    with pytest.raises(ConfigError, match=error):
        cfg(**resolved)
