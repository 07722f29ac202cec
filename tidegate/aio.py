"""Stopping asyncio tasks for good.

Python 3.11's `asyncio.wait_for` returns its inner result when a cancel lands in the same loop
pass as that result (gh-86296, fixed in 3.12 by the rewrite on `asyncio.timeout`): the cancel is
dropped and a loop around the call runs on. One `cancel()` then `await` can therefore hang a
shutdown forever (a control plane whose tick loop had just been woken did not exit on SIGTERM).
`cancel_and_wait` cancels again until each task is done, within a bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]], timeout_s: float = 5.0,
                          recancel_s: float = 0.5) -> set[asyncio.Future[Any]]:
    """Cancels `tasks` and waits until each is done, cancelling once more every `recancel_s`
    while one runs on; gives up after `timeout_s`. Returns the ones still running (empty when
    all stopped). Their results and exceptions are retrieved, so none is reported as lost."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    all_tasks = set(tasks)
    pending = {t for t in all_tasks if not t.done()}
    while pending:
        left = deadline - loop.time()
        if left <= 0:
            break
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=min(recancel_s, left))
    for t in all_tasks - pending:
        if not t.cancelled():
            t.exception()
    return pending
