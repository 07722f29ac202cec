"""Per-pool engine credentials: what the router sends as `Authorization` to a pool's engines.

Engines started with an API key (vLLM's and SGLang's `--api-key`, TGI's `--api-key`) refuse
requests without `Authorization: Bearer KEY`. The client's own Authorization header is never
forwarded (router.proxy drops it: it authenticates the client to the front door, not the router
to an engine); when a pool has a credential, the router sets its own header instead.

Spec (the router's `--engine-api-key`): comma-separated `POOL=SOURCE`, where SOURCE is
`file:PATH` (the key is the file's content, stripped of surrounding whitespace) or `env:VAR`
(an environment variable), and POOL may be `*` for every pool without an entry of its own. The
keys are read once at startup by the composition root; a missing or empty source is a
configuration error naming the pool and the source, never the key.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tidegate.config import ConfigError

ANY_POOL = "*"
_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class CredentialSource:
    pool: str
    kind: str      # "file" or "env"
    where: str     # path or variable name

    def describe(self) -> str:
        return f"{self.kind}:{self.where}"


def parse_spec(spec: str) -> tuple[CredentialSource, ...]:
    """Parse `POOL=file:PATH,POOL=env:VAR,...`; ValueError with the bad item (no I/O)."""
    out: list[CredentialSource] = []
    seen: set[str] = set()
    for item in (x.strip() for x in spec.split(",")):
        if not item:
            continue
        pool, sep, source = item.partition("=")
        pool, source = pool.strip(), source.strip()
        kind, colon, where = source.partition(":")
        if not sep or not pool or not colon or kind not in ("file", "env") or not where:
            raise ValueError(f"{item!r}: expected POOL=file:PATH or POOL=env:VAR (POOL may be *)")
        if kind == "env" and not _VAR.fullmatch(where):
            raise ValueError(f"{item!r}: {where!r} is not an environment variable name")
        if pool in seen:
            raise ValueError(f"{item!r}: pool {pool!r} is given twice")
        seen.add(pool)
        out.append(CredentialSource(pool, kind, where))
    return tuple(out)


@dataclass(frozen=True)
class EngineCredentials:
    """pool -> the Authorization value for its engines (`Bearer KEY`). Holds secrets: never log it."""

    by_pool: Mapping[str, str]

    def __post_init__(self) -> None:
        # An entry is a credential: an empty one would read as "none" and fall through to `*` or
        # to no header at all, so it is refused where it is built (load() refuses empty keys first).
        for pool, value in self.by_pool.items():
            scheme, _, key = value.partition(" ")
            if scheme != "Bearer" or not key.strip():
                raise ConfigError(f"engine API key of pool {pool!r}: not 'Bearer KEY' with a key")

    def authorization(self, pool: str) -> str | None:
        """The pool's own Authorization value, else the `*` entry's, else None (send none)."""
        own = self.by_pool.get(pool)
        return own if own is not None else self.by_pool.get(ANY_POOL)

    def __repr__(self) -> str:  # a stray log or traceback must not print the keys
        return f"EngineCredentials(pools={sorted(self.by_pool)})"


NO_CREDENTIALS = EngineCredentials({})


def load(sources: tuple[CredentialSource, ...], environ: Mapping[str, str],
         read_text: Callable[[Path], str] = Path.read_text) -> EngineCredentials:
    """Read every key now. ConfigError names the pool and source of a missing or empty key."""
    keys: dict[str, str] = {}
    for src in sources:
        try:
            key = (read_text(Path(src.where)) if src.kind == "file" else environ.get(src.where, "")).strip()
        except OSError as exc:
            raise ConfigError(f"engine API key of pool {src.pool!r}: cannot read {src.describe()}: "
                              f"{exc.strerror or type(exc).__name__}") from None
        if not key:
            raise ConfigError(f"engine API key of pool {src.pool!r}: {src.describe()} is empty or unset")
        if not key.isprintable():  # CR and LF too: a key must not split the header
            raise ConfigError(f"engine API key of pool {src.pool!r}: {src.describe()} holds control characters")
        keys[src.pool] = f"Bearer {key}"
    return EngineCredentials(keys)
