"""Admin API authentication: bearer tokens from a file, two roles.

The token file is like kube-apiserver's: one `token,name,role` CSV line per token, role
`viewer` or `operator`; blank lines and `#` comments are allowed. Calls carry gRPC metadata
`authorization: Bearer <token>`. Missing or unknown token -> UNAUTHENTICATED; a viewer calling
an operator method -> PERMISSION_DENIED. With no file every admin call is UNAUTHENTICATED.
Tokens are never logged; the actor recorded in intents and events is `sre:<name>`.

Agents authenticate to the Telemetry stream with their own tokens, bound to replica ids
(controlplane/telemetry_auth.py); this module holds the pieces both share (`csv_records`,
`bearer_token`).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio

from tidegate.config import ConfigError

VIEWER = "viewer"
OPERATOR = "operator"
ROLES = (VIEWER, OPERATOR)

Metadata = tuple[tuple[str, str | bytes], ...] | None


@dataclass(frozen=True)
class Principal:
    name: str
    role: str

    @property
    def actor(self) -> str:
        return f"sre:{self.name}"


def csv_records(text: str, source: str, fields: str) -> Iterator[tuple[str, list[str]]]:
    """(where, fields) per non-blank, non-comment line of a small CSV credentials file; `fields`
    names the columns ("token,name,role"). Raises ConfigError naming the source and line of a
    line with the wrong number of fields."""
    want = len(fields.split(","))
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",")]
        where = f"{source} line {n}"
        if len(parts) != want:
            raise ConfigError(f"{where}: expected '{fields}', got {len(parts)} fields")
        yield where, parts


def parse_tokens(text: str, source: str = "tokens file") -> dict[str, Principal]:
    """Raises ConfigError naming the source and line of the first bad line."""
    out: dict[str, Principal] = {}
    for where, (token, name, role) in csv_records(text, source, "token,name,role"):
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


def read_credentials_file(path: str | Path, what: str) -> str:
    """The file's text; ConfigError naming `what` and the path when it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{what} {path}: {e.strerror or e}") from None


def load_tokens(path: str | Path) -> dict[str, Principal]:
    return parse_tokens(read_credentials_file(path, "auth tokens file"), source=f"auth tokens file {path}")


MISSING_BEARER = "missing 'authorization: Bearer <token>' metadata"


def bearer_token(metadata: Metadata) -> str | None:
    """The token of the call's `authorization: Bearer <token>` metadata, or None."""
    header = ""
    for k, v in metadata or ():
        if k.lower() == "authorization":
            header = v.decode() if isinstance(v, bytes) else v
            break
    scheme, _, token = header.strip().partition(" ")
    if not header or scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


class Authenticator:
    def __init__(self, tokens: dict[str, Principal] | None) -> None:
        self._tokens = dict(tokens or {})

    def identify(self, metadata: Metadata) -> Principal | None | str:
        """The principal, or a string saying why there is none."""
        if not self._tokens:
            return "admin API has no tokens configured (start the control plane with --auth-tokens-file)"
        token = bearer_token(metadata)
        if token is None:
            return MISSING_BEARER
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
