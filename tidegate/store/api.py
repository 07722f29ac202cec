"""The contract of Tidegate's key-value store (etcd), as the rest of the code sees it.

`EtcdStore` (etcd.py) implements it over aetcd; `InMemoryStore` (memory.py) is a
fake for unit tests of logic. Keys are str, values bytes. Every call has a
timeout and raises `tidegate.errors.StoreError` (or `CompactedError`) on failure.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from tidegate.errors import StoreError


class LeaseNotFoundError(StoreError):
    """The lease does not exist (expired or revoked): grant a new one and re-put its keys."""


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    mod_revision: int
    lease: int = 0


@dataclass(frozen=True)
class WatchEvent:
    key: str
    value: bytes | None      # None for a delete
    mod_revision: int


@dataclass(frozen=True)
class Listing:
    revision: int             # the store revision the listing was read at
    items: tuple[KeyValue, ...]


class Store(Protocol):
    async def get(self, key: str) -> KeyValue | None: ...

    async def list_prefix(self, prefix: str) -> Listing: ...

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        """Returns the revision of the write."""
        ...

    async def delete(self, key: str) -> bool: ...

    async def grant_lease(self, ttl_s: int) -> int: ...

    async def refresh_lease(self, lease_id: int) -> int:
        """Returns the remaining TTL; raises LeaseNotFoundError (a StoreError) when the lease
        is gone."""
        ...

    async def revoke_lease(self, lease_id: int) -> None: ...

    def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[list[WatchEvent]]:
        """Batches of events from `start_revision` (inclusive). Raises CompactedError when
        that revision is compacted, StoreError when the stream breaks.

        The first batch is always empty: it says the watch is established (callers use it to
        mark themselves healthy again). Events of one store revision arrive in one batch."""
        ...

    async def close(self) -> None: ...
