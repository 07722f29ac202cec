"""WatchCache: a local, always-readable copy of one key prefix, kept in sync by list + watch.

Level-triggered: list the prefix, then watch from the listing's revision + 1. When the store
breaks, the cache keeps its last state (routers keep serving with last-known tables), backs
off with full jitter and resumes the watch from the last seen revision + 1, so nothing is lost
or applied twice. Only a compacted revision forces a re-list; after a re-list the cache equals
the listing and `on_change` fires for every key that differs from what was cached.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType

import structlog

from tidegate.errors import CompactedError, StoreError
from tidegate.store.api import KeyValue, Listing, Store, WatchEvent

log = structlog.get_logger(__name__)

OnChange = Callable[[str, KeyValue | None], None]


def full_jitter(attempt: int, initial_s: float, max_s: float, rng: random.Random) -> float:
    """Sleep before retry `attempt` (0-based): uniform in [0, min(max, initial * 2^attempt)]."""
    return rng.uniform(0.0, min(max_s, initial_s * (2.0 ** min(attempt, 30))))


class WatchCache:
    def __init__(
        self,
        store: Store,
        prefix: str,
        *,
        on_change: OnChange | None = None,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 5.0,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self._store = store
        self._prefix = prefix
        self._on_change = on_change
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._items: dict[str, KeyValue] = {}
        self._view = MappingProxyType(self._items)
        self.revision = 0
        self.synced = asyncio.Event()
        self.healthy = False
        self.last_error: str | None = None
        self._in_outage = False
        self.relists = 0  # how many times the prefix was listed (first list included)

    @property
    def prefix(self) -> str:
        return self._prefix

    def items(self) -> Mapping[str, KeyValue]:
        """A read-only live view of the current state."""
        return self._view

    async def run(self) -> None:
        """List, then watch, forever (until cancelled). Never raises StoreError."""
        need_list = True
        attempt = 0
        while True:
            try:
                if need_list:
                    self._apply_listing(await self._store.list_prefix(self._prefix))
                    need_list = False
                    self._mark_healthy()
                    attempt = 0
                async for batch in self._store.watch_prefix(self._prefix, self.revision + 1):
                    if not self.healthy:
                        self._mark_healthy()
                        attempt = 0
                    self._apply_events(batch)
                raise StoreError("watch ended")  # a Store's watch never ends by itself
            except CompactedError as e:
                log.info("watch_compacted", prefix=self._prefix, revision=self.revision,
                         compact_revision=e.compact_revision)
                need_list = True
                # No sleep: a compaction is not an outage. A failing list will back off.
            except StoreError as e:
                self._mark_broken(e)
                await self._sleep(full_jitter(attempt, self._backoff_initial_s, self._backoff_max_s,
                                              self._rng))
                attempt += 1

    def _mark_healthy(self) -> None:
        self.healthy = True
        self.synced.set()
        if self._in_outage:
            self._in_outage = False
            log.info("watch_resumed", prefix=self._prefix, revision=self.revision)
        self.last_error = None

    def _mark_broken(self, e: StoreError) -> None:
        self.healthy = False
        self.last_error = str(e)
        if not self._in_outage:
            self._in_outage = True
            log.warning("watch_broken", prefix=self._prefix, revision=self.revision, error=str(e),
                        synced=self.synced.is_set())

    def _notify(self, key: str, kv: KeyValue | None) -> None:
        if self._on_change is None:
            return
        try:
            self._on_change(key, kv)
        except Exception:  # a subscriber's bug must not stop the cache
            log.exception("watch_on_change_failed", prefix=self._prefix, key=key)

    def _apply_listing(self, listing: Listing) -> None:
        self.relists += 1
        new = {kv.key: kv for kv in listing.items}
        gone = [k for k in self._items if k not in new]
        changed = [kv for kv in listing.items
                   if (old := self._items.get(kv.key)) is None or old.mod_revision != kv.mod_revision
                   or old.value != kv.value]
        for key in gone:
            del self._items[key]
        self._items.update(new)
        self.revision = max(self.revision, listing.revision)
        for key in gone:
            self._notify(key, None)
        for kv in changed:
            self._notify(kv.key, kv)

    def _apply_events(self, batch: list[WatchEvent]) -> None:
        for ev in batch:
            if ev.mod_revision <= self.revision:
                continue  # already applied (a replay after resume or re-list)
            if ev.value is None:
                if self._items.pop(ev.key, None) is not None:
                    self._notify(ev.key, None)
            else:
                kv = KeyValue(ev.key, ev.value, ev.mod_revision)
                self._items[ev.key] = kv
                self._notify(ev.key, kv)
        if batch:
            self.revision = max(self.revision, max(ev.mod_revision for ev in batch))
