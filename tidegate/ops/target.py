"""Where the control plane is and which token to present: pure resolution, tested by tables.

Addresses, first that is set wins: --controlplane (or TIDEGATE_CONTROLPLANE, through the config
loader), then the endpoints file's `controlplanes` (`--endpoints-file`, else its default location).
Token: --token-file (or TIDEGATE_TOKEN_FILE), then TIDEGATE_TOKEN, then the endpoints file's
`tokens.operator`, then `tokens.viewer`. The token itself is never printed; `token_source` says
where it came from (a path or an environment variable name) for error messages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidegate.config import parse_endpoints

TOKEN_ENV = "TIDEGATE_TOKEN"


class TargetError(ValueError):
    """No usable address (usage) or no usable token (auth); `auth` says which."""

    def __init__(self, message: str, *, auth: bool = False) -> None:
        super().__init__(message)
        self.auth = auth


@dataclass(frozen=True)
class Target:
    addresses: tuple[str, ...]
    token: str = field(repr=False)
    token_source: str
    address_source: str


def _read_token(path: Path, read_text: Callable[[Path], str]) -> str:
    try:
        token = read_text(path).strip()
    except FileNotFoundError:
        raise TargetError(f"token file {path} does not exist", auth=True) from None
    except OSError as e:
        raise TargetError(f"cannot read token file {path}: {e.strerror}", auth=True) from None
    if not token:
        raise TargetError(f"token file {path} is empty", auth=True)
    return token


def resolve(
    *,
    controlplane: Sequence[str],
    endpoints_file: Path | None,
    token_file: Path | None,
    environ: Mapping[str, str],
    default_endpoints_file: Path,
    read_endpoints: Callable[[Path], dict[str, Any]],
    read_text: Callable[[Path], str],
) -> Target:
    """Resolve addresses and token. I/O is injected (endpoints reader, file reader)."""
    ep_path = endpoints_file or default_endpoints_file
    ep: dict[str, Any] | None = None
    ep_error = ""

    def endpoints() -> dict[str, Any] | None:
        nonlocal ep, ep_error
        if ep is None and not ep_error:
            try:
                ep = read_endpoints(ep_path)
            except (OSError, ValueError) as e:
                ep_error = str(e)
        return ep

    if controlplane:
        addresses, address_source = tuple(controlplane), "--controlplane/TIDEGATE_CONTROLPLANE"
    else:
        data = endpoints()
        if data is None:
            raise TargetError(f"no control-plane address: give --controlplane HOST:PORT or set "
                              f"TIDEGATE_CONTROLPLANE, or start a fleet with `tidegate up` ({ep_error})")
        raw = data.get("controlplanes") or data.get("controlplane") or ()
        try:
            addresses = parse_endpoints(raw if isinstance(raw, (str, list, tuple)) else ())
        except ValueError as e:
            raise TargetError(f"endpoints file {ep_path}: bad control-plane address: {e}") from None
        if not addresses:
            raise TargetError(f"endpoints file {ep_path} names no control plane")
        address_source = str(ep_path)

    if token_file is not None:
        return Target(addresses, _read_token(token_file, read_text), str(token_file), address_source)
    env_token = environ.get(TOKEN_ENV, "").strip()
    if env_token:
        return Target(addresses, env_token, TOKEN_ENV, address_source)
    data = endpoints()
    tokens = (data or {}).get("tokens") or {}
    if isinstance(tokens, dict):
        for role in ("operator", "viewer"):
            path = tokens.get(role)
            if path:
                return Target(addresses, _read_token(Path(path), read_text), str(path), address_source)
    raise TargetError(f"no admin token: give --token-file PATH or set {TOKEN_ENV} "
                      f"(`tidegate up` writes token files and names them in {ep_path})", auth=True)
