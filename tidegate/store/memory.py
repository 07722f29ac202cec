"""InMemoryStore: a fake `Store` for unit tests of logic (never used in production).

Keeps etcd's semantics that callers depend on: one global revision counter, one revision (and
one watch batch) per write, lease revocation deleting its keys in one revision, watches that
replay history from a start revision, and CompactedError below the compact revision. Leases
do not expire by time: tests call `expire_lease`. `down = True` or `fail_next(n)` make calls
raise StoreError; `down = True` also breaks every open watch.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

from tidegate.errors import CompactedError, StoreError
from tidegate.store.api import Fence, FencedError, KeyValue, LeaseNotFoundError, Listing, WatchEvent

_Item = list[WatchEvent] | BaseException


class InMemoryStore:
    def __init__(self) -> None:
        self.revision = 1  # etcd starts at revision 1
        self._data: dict[str, KeyValue] = {}
        self._created: dict[str, int] = {}  # key -> create revision (for fenced writes)
        self._leases: dict[int, int] = {}  # id -> ttl
        self._history: list[list[WatchEvent]] = []  # one batch per revision, ascending
        self._compact_revision = 0
        self._watches: list[tuple[str, asyncio.Queue[_Item]]] = []
        self._lease_ids = itertools.count(0x1000)
        self._down = False
        self._fail_next = 0
        self.calls = 0  # every call that reached the fake (tests assert on retries)

    # -- test hooks -----------------------------------------------------------------------

    @property
    def down(self) -> bool:
        return self._down

    @down.setter
    def down(self, value: bool) -> None:
        self._down = value
        if value:
            self._break_watches()

    def fail_next(self, n: int) -> None:
        """The next n calls (including watch creations) raise StoreError."""
        self._fail_next = n

    def break_watches(self) -> None:
        """Ends every open watch with StoreError (a dropped stream) without going down."""
        self._break_watches()

    def _break_watches(self) -> None:
        for _, q in self._watches:
            q.put_nowait(StoreError("watch stream broken (InMemoryStore)"))

    def compact(self, revision: int) -> None:
        self._compact_revision = max(self._compact_revision, revision)
        self._history = [b for b in self._history if b[0].mod_revision >= self._compact_revision]

    def expire_lease(self, lease_id: int) -> None:
        """The lease lapses: its keys are deleted in one revision, as etcd does."""
        self._leases.pop(lease_id, None)
        keys = sorted(k for k, kv in self._data.items() if kv.lease == lease_id)
        if keys:
            self._commit(keys, None, 0)

    @property
    def leases(self) -> dict[int, int]:
        return dict(self._leases)

    def items(self) -> dict[str, KeyValue]:
        return dict(self._data)

    # -- internals --------------------------------------------------------------------------

    def _check(self) -> None:
        self.calls += 1
        if self._down:
            raise StoreError("store is down (InMemoryStore)")
        if self._fail_next > 0:
            self._fail_next -= 1
            raise StoreError("injected failure (InMemoryStore)")

    def _commit(self, keys: list[str], value: bytes | None, lease: int) -> int:
        self.revision += 1
        batch: list[WatchEvent] = []
        for key in keys:
            if value is None:
                self._data.pop(key, None)
                self._created.pop(key, None)
            else:
                self._data[key] = KeyValue(key, value, self.revision, lease)
                self._created.setdefault(key, self.revision)
            batch.append(WatchEvent(key, value, self.revision))
        self._history.append(batch)
        for prefix, q in self._watches:
            mine = [e for e in batch if e.key.startswith(prefix)]
            if mine:
                q.put_nowait(mine)
        return self.revision

    # -- Store ------------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        self._check()
        return self._data.get(key)

    async def list_prefix(self, prefix: str) -> Listing:
        self._check()
        items = tuple(kv for k, kv in sorted(self._data.items()) if k.startswith(prefix))
        return Listing(revision=self.revision, items=items)

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        self._check()
        if lease and lease not in self._leases:
            raise LeaseNotFoundError(f"lease {lease:x} not found")
        return self._commit([key], bytes(value), lease)

    async def put_fenced(self, key: str, value: bytes, fence: Fence) -> int:
        self._check()
        self._hold(fence)
        return self._commit([key], bytes(value), 0)

    async def delete_fenced(self, key: str, fence: Fence) -> bool:
        self._check()
        self._hold(fence)
        if key not in self._data:
            return False
        self._commit([key], None, 0)
        return True

    def _hold(self, fence: Fence) -> None:
        if self._created.get(fence.key) != fence.create_revision:
            raise FencedError(f"fence {fence.key} @ {fence.create_revision} no longer holds")

    def create_revision(self, key: str) -> int:
        """0 when the key does not exist (test hook for fences)."""
        return self._created.get(key, 0)

    async def delete(self, key: str) -> bool:
        self._check()
        if key not in self._data:
            return False
        self._commit([key], None, 0)
        return True

    async def delete_prefix(self, prefix: str) -> int:
        self._check()
        keys = sorted(k for k in self._data if k.startswith(prefix))
        if keys:
            self._commit(keys, None, 0)
        return len(keys)

    async def grant_lease(self, ttl_s: int) -> int:
        self._check()
        lease_id = next(self._lease_ids)
        self._leases[lease_id] = ttl_s
        return lease_id

    async def refresh_lease(self, lease_id: int) -> int:
        self._check()
        if lease_id not in self._leases:
            raise LeaseNotFoundError(f"lease {lease_id:x} not found")
        return self._leases[lease_id]

    async def revoke_lease(self, lease_id: int) -> None:
        self._check()
        self.expire_lease(lease_id)

    async def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[list[WatchEvent]]:
        self._check()
        if start_revision < self._compact_revision:
            raise CompactedError(self._compact_revision)
        q: asyncio.Queue[_Item] = asyncio.Queue()
        for batch in self._history:
            mine = [e for e in batch if e.key.startswith(prefix) and e.mod_revision >= start_revision]
            if mine:
                q.put_nowait(mine)
        entry = (prefix, q)
        self._watches.append(entry)
        try:
            yield []
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._watches.remove(entry)

    async def close(self) -> None:
        self._break_watches()
