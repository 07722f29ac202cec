"""The audit trail: Event records under keys.EVENTS.

Key = keys.EVENTS + "<unix ns, 20 digits>-<controlplane id>", so keys sort by time and two
instances never collide. Kinds: cordon, uncordon, drain, drain_complete, drain_forced,
drain_timeout, eject, readmit, stale, removed, leader, budget_changed, slo_changed.

Retention: the newest `keep` events stay; `trim_loop` deletes older ones in the background.
Watchers (WatchEvents) are fed by a WatchCache on the prefix, one queue per subscriber.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from tidegate import codec, keys
from tidegate.errors import StoreError
from tidegate.store.api import KeyValue, Store
from tidegate.store.watchcache import WatchCache
from tidegate.v1 import records_pb2

log = structlog.get_logger(__name__)

KINDS = ("cordon", "uncordon", "drain", "drain_complete", "drain_forced", "drain_timeout", "eject",
         "readmit", "stale", "removed", "leader", "budget_changed", "slo_changed")


def event_key(ns: int, controlplane_id: str) -> str:
    return f"{keys.EVENTS}{ns:020d}-{controlplane_id}"


class EventLog:
    def __init__(self, store: Store, controlplane_id: str, *, keep: int = 5000,
                 wall_ns: Callable[[], int] = time.time_ns) -> None:
        self._store = store
        self._id = controlplane_id
        self._keep = keep
        self._wall_ns = wall_ns
        self._last_ns = 0
        self._subscribers: set[asyncio.Queue[records_pb2.Event]] = set()
        self.cache = WatchCache(store, keys.EVENTS, on_change=self._on_change)

    async def record(self, kind: str, replica_id: str = "", pool: str = "", actor: str = "",
                     reason: str = "") -> records_pb2.Event | None:
        """Writes one event; logs and returns None when etcd fails (an audit write must not
        fail the decision it records)."""
        ns = max(self._wall_ns(), self._last_ns + 1)  # unique and increasing per instance
        self._last_ns = ns
        ev = records_pb2.Event(kind=kind, replica_id=replica_id, pool=pool,
                               actor=actor or f"controlplane:{self._id}", reason=reason)
        ev.at.FromNanoseconds(ns)
        log.info("event", kind=kind, replica_id=replica_id, pool=pool, actor=ev.actor, reason=reason)
        try:
            await self._store.put(event_key(ns, self._id), codec.encode(ev))
        except StoreError as e:
            log.warning("event_write_failed", kind=kind, replica_id=replica_id, error=str(e))
            return None
        return ev

    async def list(self, replica_id: str = "", limit: int = 100) -> list[records_pb2.Event]:
        """Newest last. Raises StoreError."""
        listing = await self._store.list_prefix(keys.EVENTS)
        out = []
        for kv in sorted(listing.items, key=lambda kv: kv.key):
            ev = _decode(kv)
            if ev is not None and (not replica_id or ev.replica_id == replica_id):
                out.append(ev)
        return out[-limit:] if limit > 0 else out

    def subscribe(self) -> asyncio.Queue[records_pb2.Event]:
        q: asyncio.Queue[records_pb2.Event] = asyncio.Queue(maxsize=10_000)
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[records_pb2.Event]) -> None:
        self._subscribers.discard(q)

    def _on_change(self, key: str, kv: KeyValue | None) -> None:
        if kv is None or not self._subscribers:
            return
        ev = _decode(kv)
        if ev is None:
            return
        for q in list(self._subscribers):
            if q.full():
                continue  # a stuck watcher loses events rather than growing memory
            q.put_nowait(ev)

    async def trim(self) -> int:
        """Deletes all but the newest `keep` events; returns how many were deleted."""
        items = self.cache.items()
        if len(items) <= self._keep:
            return 0
        old = sorted(items)[: len(items) - self._keep]
        for key in old:
            await self._store.delete(key)
        return len(old)

    async def trim_loop(self, period_s: float = 30.0) -> None:
        while True:
            await asyncio.sleep(period_s)
            try:
                n = await self.trim()
                if n:
                    log.info("events_trimmed", deleted=n, kept=self._keep)
            except StoreError as e:
                log.warning("events_trim_failed", error=str(e))


def _decode(kv: KeyValue) -> records_pb2.Event | None:
    try:
        return codec.decode(kv.value, records_pb2.Event)
    except codec.DecodeError:
        log.warning("event_undecodable", key=kv.key)
        return None
