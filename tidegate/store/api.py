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


class FencedError(StoreError):
    """A fenced write found that the writer no longer holds its election key (another instance
    leads, or the term ended): nothing was written, and the writer must step down."""


@dataclass(frozen=True)
class Fence:
    """Proof of a leadership term: the writer's election key and that key's create revision
    (etcd's `LeaderKey.key` / `LeaderKey.rev`). A write fenced by it lands only while that very
    key still exists: a new term of the same instance has a new key, so an old term's fence
    fails too."""

    key: str
    create_revision: int


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

    async def put_fenced(self, key: str, value: bytes, fence: Fence) -> int:
        """Writes `key` in one transaction conditioned on `fence` (its key's create revision
        unchanged). Returns the revision; raises FencedError when the condition fails."""
        ...

    async def delete(self, key: str) -> bool: ...

    async def delete_fenced(self, key: str, fence: Fence) -> bool:
        """`delete` conditioned on `fence`, as `put_fenced`; raises FencedError when it fails."""
        ...

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
