"""Admin API authentication: bearer tokens from a file, two roles.

The token file is like kube-apiserver's: one `token,name,role` CSV line per token, role
`viewer` or `operator`; blank lines and `#` comments are allowed. Calls carry gRPC metadata
`authorization: Bearer <token>`. Missing or unknown token -> UNAUTHENTICATED; a viewer calling
an operator method -> PERMISSION_DENIED. With no file every admin call is UNAUTHENTICATED.
Tokens are never logged; the actor recorded in intents and events is `sre:<name>`.

The agents' Telemetry stream is not authenticated yet (it is a separate service; agents
run inside the serving network).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio

from tidegate.config import ConfigError

VIEWER = "viewer"
OPERATOR = "operator"
ROLES = (VIEWER, OPERATOR)


@dataclass(frozen=True)
class Principal:
    name: str
    role: str

    @property
    def actor(self) -> str:
        return f"sre:{self.name}"


def parse_tokens(text: str, source: str = "tokens file") -> dict[str, Principal]:
    """Raises ConfigError naming the source and line of the first bad line."""
    out: dict[str, Principal] = {}
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",")]
        where = f"{source} line {n}"
        if len(parts) != 3:
            raise ConfigError(f"{where}: expected 'token,name,role', got {len(parts)} fields")
        token, name, role = parts
        if not token or not name:
            raise ConfigError(f"{where}: token and name must not be empty")
        if any(c.isspace() for c in token):
            raise ConfigError(f"{where}: the token contains whitespace")
        if role not in ROLES:
            raise ConfigError(f"{where}: role {role!r} is not one of {', '.join(ROLES)}")
        if token in out:
            raise ConfigError(f"{where}: duplicate token (also used by {out[token].name!r})")
        out[token] = Principal(name, role)
    return out


def load_tokens(path: str | Path) -> dict[str, Principal]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"auth tokens file {p}: {e.strerror or e}") from None
    return parse_tokens(text, source=f"auth tokens file {p}")


class Authenticator:
    def __init__(self, tokens: dict[str, Principal] | None) -> None:
        self._tokens = dict(tokens or {})

    def identify(self, metadata: tuple[tuple[str, str | bytes], ...] | None) -> Principal | None | str:
        """The principal, or a string saying why there is none."""
        if not self._tokens:
            return "admin API has no tokens configured (start the control plane with --auth-tokens-file)"
        header = ""
        for k, v in metadata or ():
            if k.lower() == "authorization":
                header = v.decode() if isinstance(v, bytes) else v
                break
        scheme, _, token = header.strip().partition(" ")
        if not header or scheme.lower() != "bearer" or not token.strip():
            return "missing 'authorization: Bearer <token>' metadata"
        token = token.strip()
        for known, principal in self._tokens.items():
            # Constant-time compare: token checks must not leak prefixes through timing.
            if hmac.compare_digest(known.encode(), token.encode()):
                return principal
        return "unknown token"

    async def require(self, context: grpc.aio.ServicerContext, role: str) -> Principal:
        """Aborts the call unless the caller holds `role` (operator includes viewer)."""
        who = self.identify(context.invocation_metadata())
        if isinstance(who, str) or who is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, who or "unauthenticated")
            raise AssertionError("unreachable")  # abort raises
        if role == OPERATOR and who.role != OPERATOR:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"{who.name} has role {who.role}; this call needs {OPERATOR}")
        return who
