"""The leader's writes of what it derives each tick (routing tables, scale recommendations,
admission budgets), all fenced by its term (`Store.put_fenced`).

A deposed leader that still believes it leads (a paused process, a lease lapsed unseen) must
not overwrite its successor's records: each write is one etcd transaction conditioned on the
writer's election key, and a refused one tells the writer to step down.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import structlog

from tidegate.errors import StoreError
from tidegate.store.api import Fence, FencedError, Store

log = structlog.get_logger(__name__)


async def put_all(store: Store, writes: Sequence[tuple[str, bytes]],
                  fence: Fence) -> tuple[list[bool], BaseException | None]:
    """Writes every (key, value) at once under `fence`: a tick costs one etcd round trip, not one
    per key. Returns whether each landed, and the error to act on (None when all did): a refused
    fence before any other, since it decides what happens next."""
    results = await asyncio.gather(*(store.put_fenced(k, v, fence) for k, v in writes), return_exceptions=True)
    errors = sorted((r for r in results if isinstance(r, BaseException)), key=lambda e: not isinstance(e, FencedError))
    return [not isinstance(r, BaseException) for r in results], errors[0] if errors else None


class FencedWriter:
    """Writes one kind of leader-only record. A refused fence calls `on_fenced` (the control plane
    steps down); other etcd errors are logged once, and once when they clear (`<what>_publish_*`
    in the log). Never raises StoreError: what did not land is retried by the caller next tick."""

    def __init__(self, store: Store, what: str, on_fenced: Callable[[str], None]) -> None:
        self._store = store
        self._what = what
        self._on_fenced = on_fenced
        self._failing = False

    async def write(self, writes: Sequence[tuple[str, bytes]], fence: Callable[[], Fence | None]) -> list[bool]:
        """Whether each of `writes` landed; none is tried while `fence()` is None (not leading)."""
        current = fence() if writes else None
        if current is None:
            return [False] * len(writes)
        landed, error = await put_all(self._store, writes, current)
        if isinstance(error, FencedError):
            log.warning(f"{self._what}_publish_fenced", error=str(error))
            self._on_fenced(str(error))
        elif isinstance(error, StoreError):
            if not self._failing:
                self._failing = True
                log.warning(f"{self._what}_publish_failed", error=str(error))
        elif error is not None:
            raise error
        elif self._failing:
            self._failing = False
            log.info(f"{self._what}_publish_recovered")
        return landed
