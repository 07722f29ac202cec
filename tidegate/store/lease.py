"""LeaseKeeper: keys that live as long as this process does (presence records).

Grants one lease, refreshes it every ttl/3 (jittered), and remembers every key it wrote, so
that when the lease is lost (expired during an outage, etcd data lost) it grants a new one and
writes every key again. After any outage it re-puts the keys even if the lease survived:
level-triggered, so a key deleted behind our back comes back too.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import structlog

from tidegate.errors import StoreError
from tidegate.store.api import LeaseNotFoundError, Store
from tidegate.store.watchcache import full_jitter

log = structlog.get_logger(__name__)


class LeaseKeeper:
    def __init__(
        self,
        store: Store,
        ttl_s: int,
        *,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 5.0,
        close_timeout_s: float = 2.0,
    ) -> None:
        if ttl_s < 1:
            raise ValueError("ttl_s must be >= 1")
        self._store = store
        self._ttl_s = ttl_s
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = min(backoff_max_s, ttl_s / 3)
        self._close_timeout_s = close_timeout_s
        self._lease_id = 0
        self._keys: dict[str, bytes] = {}
        self._pending_deletes: set[str] = set()
        self._wake = asyncio.Event()
        self._closed = False
        self.grants = 0  # how many leases were granted (1 in a quiet life)

    @property
    def lease_id(self) -> int:
        """The current lease, 0 while none is held."""
        return self._lease_id

    @property
    def keys(self) -> dict[str, bytes]:
        return dict(self._keys)

    async def put(self, key: str, value: bytes) -> None:
        """Writes `key` under the lease now when possible; never raises StoreError: the key is
        remembered and `run()` writes it once the store answers (or a lease is granted)."""
        self._keys[key] = value
        self._pending_deletes.discard(key)
        lease_id = self._lease_id
        if not lease_id:
            return
        try:
            await self._store.put(key, value, lease=lease_id)
        except LeaseNotFoundError:
            self._lease_lost(lease_id)
        except StoreError as e:
            log.warning("lease_put_failed", key=key, error=str(e))
            self._wake.set()

    async def delete(self, key: str) -> None:
        """Forgets `key` and deletes it; retried by `run()` if the store does not answer."""
        self._keys.pop(key, None)
        try:
            await self._store.delete(key)
        except StoreError as e:
            log.warning("lease_delete_failed", key=key, error=str(e))
            self._pending_deletes.add(key)
            self._wake.set()

    def _lease_lost(self, lease_id: int) -> None:
        if self._lease_id == lease_id and lease_id:
            log.warning("lease_lost", lease_id=f"{lease_id:x}")
            self._lease_id = 0
        self._wake.set()

    async def _sleep_or_wake(self, seconds: float) -> None:
        sleeper = asyncio.ensure_future(self._sleep(seconds))
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waker.cancel()
        self._wake.clear()

    async def _sync_keys(self) -> None:
        for key in list(self._pending_deletes):
            await self._store.delete(key)
            self._pending_deletes.discard(key)
        for key, value in list(self._keys.items()):
            await self._store.put(key, value, lease=self._lease_id)

    async def run(self) -> None:
        """Keeps the lease and the keys alive until cancelled or closed. Never raises."""
        attempt = 0
        dirty = True  # keys must be (re)written with the current lease
        in_outage = False
        while not self._closed:
            try:
                if not self._lease_id:
                    self._lease_id = await self._store.grant_lease(self._ttl_s)
                    self.grants += 1
                    log.info("lease_granted", lease_id=f"{self._lease_id:x}", ttl_s=self._ttl_s,
                             keys=len(self._keys))
                    dirty = True
                else:
                    await self._store.refresh_lease(self._lease_id)
                if dirty or self._pending_deletes:
                    await self._sync_keys()
                    dirty = False
                if in_outage:
                    in_outage = False
                    log.info("lease_store_recovered", lease_id=f"{self._lease_id:x}")
                attempt = 0
                delay = self._ttl_s / 3 * self._rng.uniform(0.8, 1.0)
            except LeaseNotFoundError:
                self._lease_lost(self._lease_id)
                dirty = True
                continue
            except StoreError as e:
                dirty = True
                if not in_outage:
                    in_outage = True
                    log.warning("lease_store_unreachable", lease_id=f"{self._lease_id:x}", error=str(e))
                delay = full_jitter(attempt, self._backoff_initial_s, self._backoff_max_s, self._rng)
                attempt += 1
            except Exception:  # a bug must not end presence silently: log, back off, retry
                log.exception("lease_keeper_failed")
                dirty = True
                delay = full_jitter(attempt, self._backoff_initial_s, self._backoff_max_s, self._rng)
                attempt += 1
            await self._sleep_or_wake(delay)

    async def close(self) -> None:
        """Stops `run()` and revokes the lease (best effort), which deletes the keys now."""
        self._closed = True
        self._wake.set()
        lease_id, self._lease_id = self._lease_id, 0
        if lease_id:
            try:
                await asyncio.wait_for(self._store.revoke_lease(lease_id), self._close_timeout_s)
            except (TimeoutError, StoreError) as e:
                log.warning("lease_revoke_failed", lease_id=f"{lease_id:x}", error=str(e))
