"""Where the CLI finds the control plane and its token (table-driven, fake file readers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tidegate.ops.target import TargetError, resolve

DEFAULT = Path("/home/sre/.local/state/tidegate/endpoints.json")
OTHER = Path("/tmp/other/endpoints.json")
FILES = {
    "/run/operator.token": "op-secret\n",
    "/run/viewer.token": "  view-secret \n",
    "/mine.token": "mine-secret-xyz\n",
    "/empty.token": "\n",
    "/other/operator.token": "other-op\n",
}
ENDPOINTS: dict[Path, dict[str, Any]] = {
    DEFAULT: {"controlplanes": ["127.0.0.1:1", "127.0.0.1:2"],
              "tokens": {"operator": "/run/operator.token", "viewer": "/run/viewer.token"}},
    OTHER: {"controlplane": "10.0.0.1:50051", "tokens": {"operator": "/other/operator.token"}},
}


def read_endpoints(path: Path) -> dict[str, Any]:
    if path not in ENDPOINTS:
        raise FileNotFoundError(f"no endpoints file at {path}: is `tidegate up` running?")
    return ENDPOINTS[path]


def read_text(path: Path) -> str:
    if str(path) not in FILES:
        raise FileNotFoundError(str(path))
    return FILES[str(path)]


def _resolve(controlplane: tuple[str, ...] = (), endpoints_file: Path | None = None,
             token_file: str | None = None, env: dict[str, str] | None = None,
             default: Path = DEFAULT) -> Any:
    return resolve(controlplane=controlplane, endpoints_file=endpoints_file,
                   token_file=Path(token_file) if token_file else None, environ=env or {},
                   default_endpoints_file=default, read_endpoints=read_endpoints, read_text=read_text)


CASES = [
    # id, kwargs, addresses, token, token_source
    ("endpoints-file-default", {}, ("127.0.0.1:1", "127.0.0.1:2"), "op-secret", "/run/operator.token"),
    ("flag-address-file-token", {"controlplane": ("h:1",)}, ("h:1",), "op-secret", "/run/operator.token"),
    ("env-token-beats-file", {"env": {"TIDEGATE_TOKEN": "envtok"}}, ("127.0.0.1:1", "127.0.0.1:2"), "envtok",
     "TIDEGATE_TOKEN"),
    ("token-file-beats-env", {"token_file": "/mine.token", "env": {"TIDEGATE_TOKEN": "envtok"}},
     ("127.0.0.1:1", "127.0.0.1:2"), "mine-secret-xyz", "/mine.token"),
    ("other-endpoints-file", {"endpoints_file": OTHER}, ("10.0.0.1:50051",), "other-op", "/other/operator.token"),
    ("no-endpoints-file-but-flags", {"controlplane": ("h:1",), "token_file": "/mine.token",
                                     "default": Path("/nowhere.json")}, ("h:1",), "mine-secret-xyz", "/mine.token"),
    ("no-endpoints-file-env-token", {"controlplane": ("h:1",), "env": {"TIDEGATE_TOKEN": "env-secret-abc"},
                                     "default": Path("/nowhere.json")}, ("h:1",), "env-secret-abc", "TIDEGATE_TOKEN"),
]


@pytest.mark.parametrize(("kwargs", "addresses", "token", "source"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_resolve(kwargs: dict[str, Any], addresses: tuple[str, ...], token: str, source: str) -> None:
    t = _resolve(**kwargs)
    assert t.addresses == addresses
    assert t.token == token
    assert t.token_source == source
    assert token not in repr(t)  # a Target in a log line or traceback does not show the token


def test_viewer_token_when_no_operator_token() -> None:
    ENDPOINTS[Path("/v.json")] = {"controlplanes": ["h:1"], "tokens": {"viewer": "/run/viewer.token"}}
    try:
        assert _resolve(endpoints_file=Path("/v.json")).token == "view-secret"
    finally:
        del ENDPOINTS[Path("/v.json")]


ERRORS = [
    ("no-address", {"default": Path("/nowhere.json")}, False, "no control-plane address"),
    ("no-token", {"controlplane": ("h:1",), "default": Path("/nowhere.json")}, True, "no admin token"),
    ("missing-token-file", {"token_file": "/missing.token"}, True, "does not exist"),
    ("empty-token-file", {"token_file": "/empty.token"}, True, "is empty"),
]


@pytest.mark.parametrize(("kwargs", "auth", "needle"), [c[1:] for c in ERRORS], ids=[c[0] for c in ERRORS])
def test_resolve_errors(kwargs: dict[str, Any], auth: bool, needle: str) -> None:
    with pytest.raises(TargetError, match=needle) as info:
        _resolve(**kwargs)
    assert info.value.auth is auth


def test_bad_address_in_endpoints_file() -> None:
    ENDPOINTS[Path("/bad.json")] = {"controlplanes": ["no-port"]}
    try:
        with pytest.raises(TargetError, match="bad control-plane address"):
            _resolve(endpoints_file=Path("/bad.json"))
    finally:
        del ENDPOINTS[Path("/bad.json")]
